//! Owns the listening socket (with the send timeout and TCP keep-alive
//! every client connection inherits), the tiny_http server that calls
//! `handler::handle` on each connection's thread, and the wait for the
//! stop ([`Unblocker`], [`Listener::serve_until`]).

use crate::config::Listen;
use crate::http::{handler, Gateway};
use seckill_common::Shutdown;
use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};
use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiny_http::Server;

/// Pending connections the kernel keeps for the accept thread: a crowd
/// behind nginx opens thousands of gateway connections at once. The kernel
/// caps it at `net.core.somaxconn` (4,096 by default).
pub const LISTEN_BACKLOG: i32 = 4096;

/// Why the server could not listen.
#[derive(Debug)]
pub enum ListenError {
    /// The listen address cannot be bound.
    Bind(SocketAddr, std::io::Error),
    /// tiny_http refused the listener.
    Server(String),
}

impl fmt::Display for ListenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenError::Bind(a, e) => write!(
                f,
                "cannot listen on {a} (SECKILL_LISTEN): {e}: stop what holds it, or set \
                 SECKILL_LISTEN to a free address"
            ),
            ListenError::Server(e) => write!(f, "http server: {e}"),
        }
    }
}

impl std::error::Error for ListenError {}

/// Wakes the thread that waits in the server's `recv` for the stop; the
/// signal handler calls [`Unblocker::unblock_all`].
#[derive(Clone, Default)]
pub struct Unblocker(Arc<Mutex<Option<Arc<Server>>>>);

impl Unblocker {
    fn set(&self, server: Arc<Server>) {
        if let Ok(mut s) = self.0.lock() {
            *s = Some(server);
        }
    }

    /// Unblocks the waiting thread (a no-op before the server exists: the
    /// wait then sees the flag at start).
    pub fn unblock_all(&self) {
        if let Ok(s) = self.0.lock() {
            if let Some(server) = s.as_ref() {
                server.unblock();
            }
        }
    }
}

/// Binds `addr` with the options every accepted connection inherits from
/// the listening socket on Linux: `SO_SNDTIMEO` (`write_timeout`: a client
/// that stops reading cannot hold a handler longer), `SO_SNDBUF`
/// (`send_buffer` bytes unless 0: the kernel's autotuning), TCP
/// keep-alive (dead peers are noticed after about 90 s), `TCP_NODELAY`.
///
/// A receive timeout cannot be set this way: on the listening socket it
/// also limits `accept`, which would stop tiny_http's accept loop.
fn bind(listen: &Listen) -> std::io::Result<TcpListener> {
    let addr = listen.addr;
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_write_timeout(Some(listen.write_timeout))?;
    if listen.send_buffer > 0 {
        s.set_send_buffer_size(listen.send_buffer)?;
    }
    s.set_tcp_nodelay(true)?;
    s.set_keepalive(true)?;
    let ka = TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    s.set_tcp_keepalive(&ka)?;
    s.bind(&addr.into())?;
    s.listen(LISTEN_BACKLOG)?;
    Ok(s.into())
}

/// A bound socket, not yet serving.
pub struct Bound(TcpListener);

impl Bound {
    /// The address the socket is bound to: the port the system chose for
    /// a `SECKILL_LISTEN` of port 0.
    ///
    /// Errors: the socket's `getsockname` failing.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }
}

/// Binds the listening socket, first of all, so that a port in
/// use stops the gateway at once.
///
/// Errors: [`ListenError::Bind`].
pub fn bind_to(listen: &Listen) -> Result<Bound, ListenError> {
    bind(listen)
        .map(Bound)
        .map_err(|e| ListenError::Bind(listen.addr, e))
}

/// The server handling requests on its connection threads.
pub struct Listener(Arc<Server>);

impl Bound {
    /// Starts serving: each request is handled on its connection's
    /// thread with `gw`.
    ///
    /// Errors: [`ListenError::Server`].
    pub fn serve(self, gw: Arc<Gateway>, unblocker: &Unblocker) -> Result<Listener, ListenError> {
        let server = Server::from_listener_with_handler(
            self.0,
            Arc::new(move |rq| handler::handle(&gw, rq)),
        )
        .map_err(|e| ListenError::Server(e.to_string()))?;
        let server = Arc::new(server);
        unblocker.set(server.clone());
        Ok(Listener(server))
    }
}

impl Listener {
    /// Waits for the stop (the signal handler unblocks `recv`) or for the
    /// accept loop's fatal error, which triggers `shutdown`. True when
    /// the accept loop failed.
    pub fn serve_until(&self, shutdown: &Shutdown) -> bool {
        let mut accept_failed = false;
        while !shutdown.is_triggered() {
            match self.0.recv() {
                Ok(rq) => drop(rq), // cannot happen: requests go to `handle`
                // `unblock` is only called after the trigger.
                Err(e) if !shutdown.is_triggered() => {
                    log::error!("http server stopped accepting: {e}");
                    accept_failed = true;
                    shutdown.trigger();
                }
                Err(_) => {}
            }
        }
        accept_failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_address_names_seckill_listen() {
        let e = ListenError::Bind(
            ([127, 0, 0, 1], 8080).into(),
            std::io::Error::from(std::io::ErrorKind::AddrInUse),
        );
        let shown = e.to_string();
        assert!(
            shown.starts_with("cannot listen on 127.0.0.1:8080 (SECKILL_LISTEN): "),
            "{shown}"
        );
    }
}
