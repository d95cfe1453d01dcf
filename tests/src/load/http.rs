//! Owns the load simulator's HTTP/1.1 client: one keep-alive connection over
//! a plain `TcpStream`, requests written in one piece, responses read by
//! `Content-Length` (or chunked), reconnecting when the server closes.
//!
//! Hand-written on purpose: the simulator must send byte-exact hostile
//! requests that a well-behaved client library refuses to produce, and it
//! needs nothing but status and body from the answers.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest response head (status line and headers) accepted, in bytes.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest response body accepted, in bytes (gateway answers are < 1 KiB).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// One answer from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status code, e.g. 202.
    pub status: u16,
    /// The body bytes (JSON for every gateway answer).
    pub body: Vec<u8>,
}

/// Why a request got no answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum HttpError {
    /// The TCP connection could not be opened.
    Connect(io::Error),
    /// Reading or writing failed, or the server closed mid-answer.
    Io(io::Error),
    /// The server's answer is not HTTP/1.x as this client reads it.
    Malformed(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Connect(e) => write!(f, "connect: {e}"),
            HttpError::Io(e) => write!(f, "i/o: {e}"),
            HttpError::Malformed(d) => write!(f, "malformed response: {d}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// A keep-alive connection to one server; reconnects lazily.
pub struct Connection {
    addr: SocketAddr,
    timeout: Duration,
    stream: Option<BufReader<TcpStream>>,
    /// Requests sent again after a reused connection turned out closed.
    pub resent: u64,
    /// TCP connections opened so far.
    pub connects: u64,
}

impl Connection {
    /// A connection to `addr` with `timeout` for connect, read and write;
    /// nothing is opened until the first request.
    pub fn new(addr: SocketAddr, timeout: Duration) -> Connection {
        Connection {
            addr,
            timeout,
            stream: None,
            resent: 0,
            connects: 0,
        }
    }

    /// Sends `request` (a complete HTTP/1.1 request, head and body) and reads
    /// the answer. When a reused connection fails before any answer byte (the
    /// server closed it while idle) the request is sent once more on a new
    /// connection; a repeated purchase is harmless (409 names the reservation).
    ///
    /// Errors: [`HttpError`]; the connection is dropped after any error.
    pub fn send(&mut self, request: &[u8]) -> Result<Response, HttpError> {
        let reused = self.stream.is_some();
        match self.try_send(request) {
            Err(HttpError::Io(e)) if reused && is_stale(&e) => {
                self.resent += 1;
                self.try_send(request)
            }
            other => other,
        }
    }

    fn try_send(&mut self, request: &[u8]) -> Result<Response, HttpError> {
        if self.stream.is_none() {
            let s =
                TcpStream::connect_timeout(&self.addr, self.timeout).map_err(HttpError::Connect)?;
            s.set_nodelay(true).map_err(HttpError::Connect)?;
            s.set_read_timeout(Some(self.timeout))
                .map_err(HttpError::Connect)?;
            s.set_write_timeout(Some(self.timeout))
                .map_err(HttpError::Connect)?;
            self.connects += 1;
            self.stream = Some(BufReader::with_capacity(16 * 1024, s));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(HttpError::Malformed("no connection".into()));
        };
        let result = stream
            .get_mut()
            .write_all(request)
            .map_err(HttpError::Io)
            .and_then(|()| read_response(stream));
        match result {
            Ok((resp, keep_alive)) => {
                if !keep_alive {
                    self.stream = None;
                }
                Ok(resp)
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }
}

/// Whether an error on a reused connection means "the server had closed it".
fn is_stale(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

/// Reads one response; returns it and whether the connection stays open.
/// The head is read as bytes into one reused buffer (no `String` per line,
/// no lowercase copies): the simulator shares the cores with the server.
fn read_response(r: &mut BufReader<TcpStream>) -> Result<(Response, bool), HttpError> {
    let mut line: Vec<u8> = Vec::with_capacity(128);
    let mut head_bytes = 0usize;
    let n = r.read_until(b'\n', &mut line).map_err(HttpError::Io)?;
    if n == 0 {
        return Err(HttpError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before the status line",
        )));
    }
    head_bytes += n;
    let text = String::from_utf8_lossy(&line);
    let mut parts = text.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed(format!("status line {text:?}")));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HttpError::Malformed(format!("status line {text:?}")))?;
    let mut keep_alive = version != "HTTP/1.0";
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    loop {
        line.clear();
        let n = r.read_until(b'\n', &mut line).map_err(HttpError::Io)?;
        head_bytes += n;
        if n == 0 {
            return Err(HttpError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed inside the headers",
            )));
        }
        if head_bytes > MAX_HEAD_BYTES {
            return Err(HttpError::Malformed("response head too large".into()));
        }
        let l = line.trim_ascii_end();
        if l.is_empty() {
            break;
        }
        let Some(colon) = l.iter().position(|&b| b == b':') else {
            return Err(HttpError::Malformed(format!(
                "header {:?}",
                String::from_utf8_lossy(l)
            )));
        };
        let (name, value) = (&l[..colon], l[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            content_length = Some(v.ok_or_else(|| {
                HttpError::Malformed(format!(
                    "content-length {:?}",
                    String::from_utf8_lossy(value)
                ))
            })?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = contains_ignore_case(value, b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_ignore_case(value, b"close") {
                keep_alive = false;
            } else if contains_ignore_case(value, b"keep-alive") {
                keep_alive = true;
            }
        }
    }
    let body = if chunked {
        read_chunked(r)?
    } else if let Some(len) = content_length {
        if len > MAX_BODY_BYTES {
            return Err(HttpError::Malformed(format!("body of {len} bytes")));
        }
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).map_err(HttpError::Io)?;
        body
    } else if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else {
        // No length: the body runs to the end of the connection.
        keep_alive = false;
        let mut body = Vec::new();
        r.take(MAX_BODY_BYTES as u64)
            .read_to_end(&mut body)
            .map_err(HttpError::Io)?;
        body
    };
    Ok((Response { status, body }, keep_alive))
}

/// Whether `hay` contains `needle`, ASCII case ignored.
fn contains_ignore_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

fn read_chunked(r: &mut BufReader<TcpStream>) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).map_err(HttpError::Io)?;
        let size_text = line.trim().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| HttpError::Malformed(format!("chunk size {line:?}")))?;
        if body.len() + size > MAX_BODY_BYTES {
            return Err(HttpError::Malformed("chunked body too large".into()));
        }
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            loop {
                line.clear();
                let n = r.read_line(&mut line).map_err(HttpError::Io)?;
                if n == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..]).map_err(HttpError::Io)?;
        line.clear();
        r.read_line(&mut line).map_err(HttpError::Io)?;
    }
}

/// A complete `POST` request with a JSON body, keep-alive, with
/// `Authorization: Bearer <token>` when a token is given.
pub fn post_json(host: &str, path: &str, body: &[u8], token: Option<&str>) -> Vec<u8> {
    post_json_keyed(host, path, body, token, None)
}

/// [`post_json`] with an `Idempotency-Key: <key>` header when a key is
/// given.
pub fn post_json_keyed(
    host: &str,
    path: &str,
    body: &[u8],
    token: Option<&str>,
    key: Option<&str>,
) -> Vec<u8> {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let idem = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         {auth}{idem}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// The string value of `"field"` in a JSON body, if the body is JSON with it.
pub fn json_str(body: &[u8], field: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get(field)?.as_str().map(str::to_string)
}

/// The unsigned integer value of `"field"` in a JSON body, if any.
pub fn json_u64(body: &[u8], field: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get(field)?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn post_json_is_one_well_formed_request() {
        let r = post_json("h:1", "/v1/sales/3/purchases", br#"{"user_id":"a"}"#, None);
        let text = String::from_utf8(r).unwrap();
        assert!(text.starts_with("POST /v1/sales/3/purchases HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(text.ends_with("Content-Length: 15\r\n\r\n{\"user_id\":\"a\"}"));
    }

    #[test]
    fn a_keyed_request_carries_its_idempotency_key() {
        let r = post_json_keyed("h:1", "/p", br#"{"quantity":2}"#, Some("t"), Some("k1"));
        let text = String::from_utf8(r).unwrap();
        assert!(text.contains("Authorization: Bearer t\r\nIdempotency-Key: k1\r\n"));
        assert!(text.ends_with("Content-Length: 14\r\n\r\n{\"quantity\":2}"));
        assert_eq!(
            json_u64(
                br#"{"error":"not_enough_stock","units_left":2}"#,
                "units_left"
            ),
            Some(2)
        );
    }

    #[test]
    fn header_values_match_without_case() {
        assert!(contains_ignore_case(b"Keep-Alive", b"keep-alive"));
        assert!(contains_ignore_case(b"gzip, CHUNKED", b"chunked"));
        assert!(!contains_ignore_case(b"clos", b"close"));
    }

    #[test]
    fn json_str_reads_a_field_or_none() {
        assert_eq!(
            json_str(
                br#"{"reservation_id":"ab","status":"queued"}"#,
                "reservation_id"
            ),
            Some("ab".to_string())
        );
        assert_eq!(json_str(b"not json", "x"), None);
    }
}
