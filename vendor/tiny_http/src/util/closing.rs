//! seckill patch: the state a connection shares with its requests so that
//! `Request::respond_and_close` can end the connection without reading the
//! rest of a request's body.

use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::connection::Connection;

/// Most bytes of an unread body read and discarded after an answer that
/// closes the connection (a "lingering close", as nginx's
/// `lingering_close`): 64 KiB. Reading them lets the client's bytes already
/// on the way arrive without the kernel answering them with a reset that
/// could destroy the answer before the client reads it.
pub(crate) const LINGER_MAX_BYTES: usize = 64 * 1024;

/// Longest wait for each read of that lingering drain: 5 s (nginx's
/// `lingering_timeout` default).
pub(crate) const LINGER_TIMEOUT: Duration = Duration::from_secs(5);

/// Set once a request of the connection was answered with
/// `respond_and_close`: no further request is read, and the unread body is
/// drained only up to [`LINGER_MAX_BYTES`].
pub(crate) struct Closing {
    set: AtomicBool,
    /// The connection's socket (none for TLS streams and test requests).
    socket: Option<Arc<Connection>>,
}

impl Closing {
    pub(crate) fn new(socket: Option<Arc<Connection>>) -> Arc<Closing> {
        Arc::new(Closing {
            set: AtomicBool::new(false),
            socket,
        })
    }

    /// Whether the connection is closing.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Marks the connection as closing (before its answer is written).
    pub(crate) fn mark(&self) {
        self.set.store(true, Ordering::SeqCst);
    }

    /// After the answer is flushed: ends the sending half (the client reads
    /// the answer, then end of stream) and bounds each further read by
    /// [`LINGER_TIMEOUT`]. Errors are ignored: the client may be gone.
    pub(crate) fn shut_write(&self) {
        if let Some(socket) = &self.socket {
            socket.shutdown(Shutdown::Write).ok();
            socket.set_read_timeout(Some(LINGER_TIMEOUT)).ok();
        }
    }
}
