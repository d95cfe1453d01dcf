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
//! - a declared length above [`DRAIN_MAX`]: the gateway answers 413 through
//!   `Request::upgrade` at once, without reading the body, and the
//!   connection ends after the drain ("parked"): it lasts until the client
//!   has sent the declared length or goes away. The reverse proxy
//!   (`systemd/nginx-seckill.conf`) caps bodies so none reaches the gateway;
//! - a declared length up to [`DRAIN_MAX`] is read when within
//!   `SECKILL_BODY_LIMIT` (413 otherwise, then drained by tiny_http);
//! - `Transfer-Encoding` (with or without `Content-Length`), a repeated or
//!   unparsable `Content-Length` are refused with 400 before any body is
//!   read: tiny_http would otherwise let `Transfer-Encoding` win silently.

use crate::app::App;
use crate::reply::Reply;
use std::io::{Read, Write};
use tiny_http::Request;

/// Largest declared body the gateway reads or drains before answering:
/// 1 MiB. Larger ones are answered 413 at once, then drained ("parked").
pub const DRAIN_MAX: usize = 1 << 20;

/// What to do with a request, decided from its headers alone.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Serve it; its body (at most [`DRAIN_MAX`] bytes) may still have to
    /// come from the client.
    Read,
    /// Refuse now with this reply; dropping the request reads nothing.
    Refuse(Reply),
    /// The declared body is too large to read: answer first, then drain.
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
    // it or goes away. This is the connection's own thread, and no further
    // request is read from an upgraded connection, so only this client waits.
    drop(stream);
}

fn reason(status: u16) -> &'static str {
    match status {
        413 => "Payload Too Large",
        503 => "Service Unavailable",
        _ => "Refused",
    }
}
