//! Owns how a request body is taken, and how a request with a body is let
//! go without harming the process.
//!
//! tiny_http 0.12 reads bodies of up to [`BUFFERED_MAX`] bytes into memory
//! before a handler sees the request. A larger declared body is read lazily,
//! and when such a request is dropped tiny_http reads and discards the rest
//! of the declared length. Upstream did that with a buffer of the whole
//! remaining length (`util/equal_reader.rs`, its `Drop`), so a
//! `Content-Length: 1000000000000` aborted the process; the vendored copy
//! drains with a fixed 8 KiB buffer. Draining still lasts as long as the
//! client keeps the connection and has bytes left to send. So:
//!
//! - a declared length above [`DRAIN_MAX`] (or with the slow lane full): the
//!   gateway answers 413 through `Request::upgrade` (so no handler waits for
//!   the drain) and drops the connection on a drain thread of its own
//!   ("parked"): it lasts until the client has sent the declared length or
//!   goes away, then its thread and descriptors are freed. The reverse proxy
//!   (`systemd/nginx-seckill.conf`) caps bodies so none reaches the gateway;
//! - a declared length between [`BUFFERED_MAX`] and [`DRAIN_MAX`] is read
//!   (when within `SECKILL_BODY_LIMIT`) or drained off the handler threads,
//!   in a "slow-lane" thread ([`SLOW_LANE_MAX`] at once), because a client
//!   may send it as slowly as it likes and tiny_http has no read timeout;
//! - `Transfer-Encoding` (with or without `Content-Length`), a repeated or
//!   unparsable `Content-Length` are refused with 400 before any body is
//!   read: tiny_http would otherwise let `Transfer-Encoding` win silently.

use crate::app::App;
use crate::reply::Reply;
use std::io::{Read, Write};
use tiny_http::Request;

/// Bodies up to this many bytes are already in memory when a handler gets
/// the request (tiny_http 0.12, `request.rs`, unless `Expect: 100-continue`).
pub const BUFFERED_MAX: usize = 1024;

/// Largest declared body handled on a slow-lane thread: 1 MiB. Larger ones
/// are answered 413 at once and drained on a thread of their own.
pub const DRAIN_MAX: usize = 1 << 20;

/// Most slow-lane threads at once; beyond it requests are parked.
pub const SLOW_LANE_MAX: usize = 128;

/// What to do with a request, decided from its headers alone.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// The body (possibly empty) is in memory; reading it cannot block.
    Buffered,
    /// Refuse now with this reply; dropping the request reads nothing.
    Refuse(Reply),
    /// The body must be read or drained off the handler threads.
    SlowLane,
    /// The declared body is too large to ever drop: answer and park.
    Park,
}

/// Decides from the headers how the body of `rq` may be touched.
pub fn plan(rq: &Request) -> Plan {
    let mut lengths = 0;
    let mut expect = false;
    for h in rq.headers() {
        if h.field.equiv("Transfer-Encoding") {
            return Plan::Refuse(Reply::invalid(
                "Transfer-Encoding is not accepted; send Content-Length",
            ));
        }
        if h.field.equiv("Content-Length") {
            lengths += 1;
            // tiny_http parses with `str::parse`, which also takes `+17`:
            // only plain digits are a length (RFC 9110, 8.6).
            let v = h.value.as_str().trim();
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Plan::Refuse(Reply::invalid("one valid Content-Length is required"));
            }
        }
        if h.field.equiv("Expect") {
            expect = true;
        }
    }
    let declared = rq.body_length();
    if lengths > 1 || (lengths == 1 && declared.is_none()) {
        return Plan::Refuse(Reply::invalid("one valid Content-Length is required"));
    }
    match declared.unwrap_or(0) {
        0 => Plan::Buffered,
        n if n > DRAIN_MAX => Plan::Park,
        n if n <= BUFFERED_MAX && !expect => Plan::Buffered,
        _ => Plan::SlowLane,
    }
}

/// Reads a body of at most `limit` bytes.
///
/// Errors: the 413 reply when it is longer; a 400 when the connection
/// failed or ended before the declared length arrived (tiny_http's reader
/// reports an early end of stream as a short, successful read: a truncated
/// body must never become a purchase).
pub fn read_limited(rq: &mut Request, limit: usize) -> Result<Vec<u8>, Reply> {
    let declared = rq.body_length().unwrap_or(0);
    if declared > limit {
        return Err(Reply::payload_too_large());
    }
    let mut body = Vec::with_capacity(declared);
    match rq.as_reader().take(limit as u64 + 1).read_to_end(&mut body) {
        Ok(_) if body.len() > limit => Err(Reply::payload_too_large()),
        Ok(_) if body.len() != declared => {
            Err(Reply::invalid("the body ended before its Content-Length"))
        }
        Ok(_) => Ok(body),
        Err(_) => Err(Reply::invalid("the body ended before its Content-Length")),
    }
}

/// Answers `reply`, then drains and closes the connection on a thread of its
/// own (see the file's top comment).
///
/// `Request::upgrade` is the only tiny_http call that hands back the
/// connection without dropping the body reader, and the response it writes
/// carries no body. So it writes an interim `100 Continue` (which HTTP/1.1
/// clients skip), and the real answer follows on the handed-back stream with
/// its own `Content-Length` and `Connection: close`. A write error is
/// ignored: the client may be gone.
pub fn park(app: &App, rq: Request, reply: Reply) {
    app.metrics.parked.inc();
    log::warn!(
        "parking a connection from {:?}: declared body of {:?} bytes",
        rq.remote_addr(),
        rq.body_length()
    );
    let interim = tiny_http::Response::empty(100);
    let mut stream = rq.upgrade("seckill-refused", interim);
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len()
    );
    if let Some((name, value)) = reply.extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(&reply.body);
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.flush());
    // Dropping the stream drains the rest of the declared body (with a fixed
    // buffer in the patched tiny_http), which lasts until the client has sent
    // it or goes away: do it on a thread of its own, never on a handler.
    // The stream moves to the thread only once it runs, so a failed start
    // leaves it here: then it is kept for good rather than drained inline.
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("gw-drain".into())
        .spawn(move || drop(rx.recv()));
    match spawned {
        Ok(_) => {
            if let Err(e) = tx.send(stream) {
                std::mem::forget(e.into_inner());
            }
        }
        Err(e) => {
            log::error!("starting a drain thread: {e}; keeping the connection");
            std::mem::forget(stream);
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Refused",
    }
}
