//! seckill patch: writing an answer without ever waiting
//! (`Request::respond_now`), for a thread that serves many connections and
//! must not be held up by one of them.

use std::io::{self, BufWriter, ErrorKind, Write};

use crate::connection::Connection;
use crate::util::RefinedTcpStream;

/// A response writer that can also try a write that never waits.
///
/// `write_now` fails with `WouldBlock` wherever `write` could wait: an
/// earlier answer of the same connection not yet written, the writer
/// buffered or in use, the socket's send buffer full; and always for a
/// stream it cannot write that way (TLS, a test request's sink).
pub trait ResponseWriter: Write + Send {
    /// Writes some of `buf` without waiting; `WouldBlock` if none could be.
    fn write_now(&mut self, _buf: &[u8]) -> io::Result<usize> {
        Err(ErrorKind::WouldBlock.into())
    }
}

impl ResponseWriter for io::Sink {}

impl ResponseWriter for BufWriter<RefinedTcpStream> {
    fn write_now(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Bytes buffered before would have to go first, and their write
        // could wait.
        if !self.buffer().is_empty() {
            return Err(ErrorKind::WouldBlock.into());
        }
        match self.get_ref().socket() {
            Some(socket) => send_now(&socket, buf),
            None => Err(ErrorKind::WouldBlock.into()),
        }
    }
}

/// One `send(2)` with `MSG_DONTWAIT` (and `MSG_NOSIGNAL`: a peer that has
/// closed is an `EPIPE` error, not a signal).
#[cfg(unix)]
fn send_now(socket: &Connection, buf: &[u8]) -> io::Result<usize> {
    let socket = match socket {
        Connection::Tcp(s) => socket2::SockRef::from(s),
        Connection::Unix(s) => socket2::SockRef::from(s),
    };
    socket.send_with_flags(buf, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
}

#[cfg(not(unix))]
fn send_now(_socket: &Connection, _buf: &[u8]) -> io::Result<usize> {
    Err(ErrorKind::WouldBlock.into())
}
