//! Owns how a request body is taken, and how a request with a body is let
//! go without harming the process.
//!
//! tiny_http 0.12 reads bodies of up to 1 KiB into memory before a handler
//! sees the request. A larger declared body is read lazily,
//! and when such a request is dropped tiny_http reads and discards the rest
//! of the declared length. Upstream did that with a buffer of the whole
//! remaining length (`util/equal_reader.rs`, its `Drop`), so a
//! `Content-Length: 1000000000000` aborted the process; the vendored copy
//! drains with a fixed 8 KiB buffer. Requests are handled on the thread
//! that serves their connection, so reading or draining a slow body holds
//! up only that client's own connection. So:
//!
//! - a declared length above [`DRAIN_MAX`]: the gateway answers 413 at once
//!   with `Request::respond_and_close`, without reading the body, and the
//!   connection ends ("parked"): the client reads the 413, then end of
//!   stream. The reverse proxy (`systemd/nginx-seckill.conf`) caps bodies
//!   so none reaches the gateway;
//! - a declared length up to [`DRAIN_MAX`] is read when within
//!   `SECKILL_BODY_LIMIT` (413 otherwise, then drained by tiny_http; with
//!   `Expect: 100-continue` the body was never asked for, so tiny_http
//!   closes the connection instead, patch 0009);
//! - `Transfer-Encoding` (with or without `Content-Length`), a repeated or
//!   unparsable `Content-Length` are refused with 400 before any body is
//!   read: tiny_http would otherwise let `Transfer-Encoding` win silently.

use crate::http::reply::Reply;
use crate::metrics::Metrics;
use std::io::Read;
use tiny_http::Request;

/// Largest declared body the gateway reads or drains before answering:
/// 1 MiB. Larger ones are answered 413 at once and their connection closed
/// ("parked").
pub const DRAIN_MAX: usize = 1 << 20;

/// What to do with a request, decided from its headers alone.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Serve it; its body (at most [`DRAIN_MAX`] bytes) may still have to
    /// come from the client.
    Read,
    /// Refuse now with this reply; dropping the request reads nothing.
    Refuse(Reply),
    /// The declared body is too large to read: answer now and close.
    Park,
}

/// Decides from the headers how the body of `rq` may be touched.
pub fn plan(rq: &Request) -> Plan {
    let mut lengths = 0;
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
    }
    let declared = rq.body_length();
    if lengths > 1 || (lengths == 1 && declared.is_none()) {
        return Plan::Refuse(Reply::invalid("one valid Content-Length is required"));
    }
    match declared.unwrap_or(0) {
        n if n > DRAIN_MAX => Plan::Park,
        _ => Plan::Read,
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

/// Answers `reply` (a 400 for a request whose body cannot be framed:
/// `Transfer-Encoding`, a missing, repeated or malformed `Content-Length`)
/// and closes the connection as [`park`] does: where such a body ends is
/// unknown, so bytes after the head must never be read as the next request
/// (request smuggling, RFC 9112, 6.3 and 11.2).
pub fn refuse(rq: Request, reply: Reply) {
    let _ = rq.respond_and_close(reply.into_response());
}

/// Answers `reply` at once and closes the connection without reading the
/// declared body (`Request::respond_and_close` of the vendored tiny_http,
/// patch 0008): `Connection: close`, then end of stream; at most 64 KiB of
/// the body are read and discarded on the way out, and no further request
/// of the connection is read. No `100 Continue` goes out, whatever the
/// client's `Expect`. A write error is ignored: the client may be gone.
pub fn park(metrics: &Metrics, rq: Request, reply: Reply) {
    metrics.parked.inc();
    log::warn!(
        "closing a connection from {:?}: declared body of {:?} bytes",
        rq.remote_addr(),
        rq.body_length()
    );
    let _ = rq.respond_and_close(reply.into_response());
}
