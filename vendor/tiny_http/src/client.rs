use ascii::AsciiString;

use std::io::Error as IoError;
use std::io::Result as IoResult;
use std::io::{BufRead, BufReader, BufWriter, ErrorKind, Read};

use std::net::SocketAddr;
use std::str::FromStr;

use crate::common::{HTTPVersion, Method};
use crate::util::{Closing, RefinedTcpStream};
use crate::util::{SequentialReader, SequentialReaderBuilder, SequentialWriterBuilder};
use crate::Request;

/// A ClientConnection is an object that will store a socket to a client
/// and return Request objects.
pub struct ClientConnection {
    // address of the client
    remote_addr: IoResult<Option<SocketAddr>>,

    // sequence of Readers to the stream, so that the data is not read in
    //  the wrong order
    source: SequentialReaderBuilder<BufReader<RefinedTcpStream>>,

    // sequence of Writers to the stream, to avoid writing response #2 before
    //  response #1
    sink: SequentialWriterBuilder<BufWriter<RefinedTcpStream>>,

    // Reader to read the next header from
    next_header_source: SequentialReader<BufReader<RefinedTcpStream>>,

    // set to true if we know that the previous request is the last one
    no_more_requests: bool,

    // true if the connection goes through SSL
    secure: bool,

    // seckill patch: set when a request was answered with
    // `respond_and_close`; no request is read after that.
    closing: std::sync::Arc<Closing>,

    // seckill patch: this connection's number, given by its server in
    // order of acceptance (1, 2, ...; 0: not given), carried by each of
    // its requests (`Request::connection_id`).
    id: u64,
}

/// Error that can happen when reading a request.
#[derive(Debug)]
enum ReadError {
    WrongRequestLine,
    WrongHeader(HTTPVersion),
    /// the client sent an unrecognized `Expect` header
    ExpectationFailed(HTTPVersion),
    ReadIoError(IoError),
    /// seckill patch: the stream ended inside a body read up front.
    BodyTooShort(HTTPVersion),
    /// seckill patch: a request line or header line over
    /// `MAX_HEADER_LINE`, or a header over `MAX_HEADER_BYTES` in all
    HeaderTooLarge,
}

/// seckill patch: longest request line or header line, in bytes (nginx's
/// `large_client_header_buffers` default is 8k too). Upstream had no limit:
/// a line without a newline was buffered whole, at any length.
pub const MAX_HEADER_LINE: usize = 8 * 1024;

/// seckill patch: most bytes of one request's header lines in all.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// seckill patch: most header lines of one request (each parsed line costs
/// far more memory than its bytes: 64 KiB of `:` lines took about 1 MB).
pub const MAX_HEADER_COUNT: usize = 100;

/// seckill patch: the error `read_next_line` gives for a line over the limit.
fn line_too_long() -> IoError {
    IoError::new(ErrorKind::InvalidData, "header line too long")
}

impl ClientConnection {
    /// Creates a new `ClientConnection` that takes ownership of the `TcpStream`.
    pub fn new(
        write_socket: RefinedTcpStream,
        mut read_socket: RefinedTcpStream,
    ) -> ClientConnection {
        let remote_addr = read_socket.peer_addr();
        let secure = read_socket.secure();
        let closing = Closing::new(write_socket.socket());

        let mut source = SequentialReaderBuilder::new(BufReader::with_capacity(1024, read_socket));
        let first_header = source.next().unwrap();

        ClientConnection {
            source,
            sink: SequentialWriterBuilder::new(BufWriter::with_capacity(1024, write_socket)),
            remote_addr,
            next_header_source: first_header,
            no_more_requests: false,
            secure,
            closing,
            id: 0,
        }
    }

    /// seckill patch: numbers this connection (see `Request::connection_id`).
    pub fn with_id(mut self, id: u64) -> ClientConnection {
        self.id = id;
        self
    }

    /// true if the connection is HTTPS
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// Reads the next line from self.next_header_source.
    ///
    /// Reads until `CRLF` is reached. The next read will start
    ///  at the first byte of the new line.
    fn read_next_line(&mut self) -> IoResult<AsciiString> {
        // seckill patch: the line is taken from the buffered source a chunk
        // at a time up to its `\n` (byte by byte through `Read::bytes`, a
        // read call per byte, cost ~100 instructions per header byte),
        // with the same rules: a line ends at CRLF (a bare LF is part of
        // it), and one of more than MAX_HEADER_LINE bytes is refused
        // without reading the rest of it.
        let mut buf = Vec::new();

        loop {
            let chunk = match self.next_header_source.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                return Err(IoError::new(ErrorKind::ConnectionAborted, "Unexpected EOF"));
            }
            let (taken, ends) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            buf.extend_from_slice(&chunk[..taken]);
            self.next_header_source.consume(taken);

            // seckill patch: a line that ends in a bare LF is refused (400:
            // `InvalidInput`, as a line that is not ASCII). Upstream took
            // the LF as part of the line, so a request sent with LF line
            // ends was never complete and held its connection until the
            // read timeout; and a field value holding an LF is how a
            // request is smuggled past a proxy that splits at LF.
            if ends && !buf.ends_with(b"\r\n") {
                return Err(IoError::new(ErrorKind::InvalidInput, "bare LF"));
            }
            if ends && buf.ends_with(b"\r\n") {
                buf.truncate(buf.len() - 2); // removing the CRLF
                if buf.len() > MAX_HEADER_LINE {
                    return Err(line_too_long());
                }
                return AsciiString::from_ascii(buf)
                    .map_err(|_| IoError::new(ErrorKind::InvalidInput, "Header is not in ASCII"));
            }

            // seckill patch: bounded (see MAX_HEADER_LINE): the line so far
            // (a final `\r` may still end it) is already too long.
            if buf.len() > MAX_HEADER_LINE + 1 {
                return Err(line_too_long());
            }
        }
    }

    /// seckill patch: `read_next_line`, with a line over the limit as
    /// `ReadError::HeaderTooLarge`.
    ///
    /// seckill patch: and a line that is not ASCII (a TLS handshake sent to
    /// the plain port, say) as `not_ascii`, so that it gets its 400.
    fn read_header_line(&mut self, not_ascii: ReadError) -> Result<AsciiString, ReadError> {
        self.read_next_line().map_err(|e| {
            if e.kind() == ErrorKind::InvalidData && e.to_string() == "header line too long" {
                ReadError::HeaderTooLarge
            } else if e.kind() == ErrorKind::InvalidInput {
                not_ascii
            } else {
                ReadError::ReadIoError(e)
            }
        })
    }

    /// seckill patch: answers a request that cannot be read with a 400 that
    /// says why, as JSON (`{"error":"invalid_request","detail":…}`, the
    /// gateway's error shape) and `Connection: close`: where the next
    /// request would start is unknown, so the connection ends. Upstream
    /// sent an empty 400 and, for a non-ASCII line or a short body, closed
    /// without any answer.
    fn answer_bad_request(&mut self, version: HTTPVersion, detail: &str) {
        use crate::{Header, Response, StatusCode};
        let body = format!("{{\"error\":\"invalid_request\",\"detail\":\"{detail}\"}}");
        let mut response = Response::from_string(body).with_status_code(StatusCode(400));
        if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
            response.add_header(h);
        }
        response.push_connection_close();
        let writer = self.sink.next().unwrap();
        response.raw_print(writer, version, &[], false, None).ok();
    }

    /// Reads a request from the stream.
    /// Blocks until the header has been read.
    fn read(&mut self) -> Result<Request, ReadError> {
        let (method, path, version, headers) = {
            // reading the request line
            let (method, path, version) = {
                let line = self.read_header_line(ReadError::WrongRequestLine)?;

                // seckill patch: an earlier request of this connection was
                // answered with `respond_and_close` while this line was
                // awaited (the queueing mode reads ahead): it is no request
                // to serve, and gets no answer.
                if self.closing.is_set() {
                    return Err(ReadError::ReadIoError(IoError::from(
                        ErrorKind::ConnectionAborted,
                    )));
                }

                parse_request_line(
                    line.as_str().trim(), // TODO: remove this conversion
                )?
            };

            // getting all headers
            let headers = {
                let mut headers = Vec::new();
                let mut header_bytes = 0;
                loop {
                    let line = self.read_header_line(ReadError::WrongHeader(version.clone()))?;

                    if line.is_empty() {
                        break;
                    };
                    header_bytes += line.len() + 2;
                    if header_bytes > MAX_HEADER_BYTES || headers.len() >= MAX_HEADER_COUNT {
                        return Err(ReadError::HeaderTooLarge);
                    }
                    // seckill patch: an empty field name (`: v`) or a
                    // control character other than HTAB in the line (NUL,
                    // say) is a malformed header line (RFC 9110 5.1, 5.5),
                    // not a header.
                    let bytes = line.as_bytes();
                    if bytes.first() == Some(&b':')
                        || bytes.iter().any(|&c| (c < 0x20 && c != b'\t') || c == 0x7f)
                    {
                        return Err(ReadError::WrongHeader(version));
                    }
                    headers.push(match FromStr::from_str(line.as_str().trim()) {
                        // TODO: remove this conversion
                        Ok(h) => h,
                        _ => return Err(ReadError::WrongHeader(version)),
                    });
                }

                headers
            };

            (method, path, version, headers)
        };

        // building the writer for the request
        let writer = self.sink.next().unwrap();

        // follow-up for next potential request
        let mut data_source = self.source.next().unwrap();
        std::mem::swap(&mut self.next_header_source, &mut data_source);

        // seckill patch: the peer's address as read when the connection
        // was accepted; a connection whose address could not be read (the
        // client reset it first: ENOTCONN) serves no request. Upstream
        // unwrapped it here, and each such connection's thread panicked.
        let remote_addr = match &self.remote_addr {
            Ok(addr) => *addr,
            Err(e) => return Err(ReadError::ReadIoError(IoError::new(e.kind(), e.to_string()))),
        };

        // building the next reader
        let request = crate::request::new_request(
            self.secure,
            method,
            path,
            version.clone(),
            headers,
            remote_addr,
            data_source,
            writer,
            self.closing.clone(),
        )
        .map_err(|e| {
            use crate::request;
            match e {
                request::RequestCreationError::CreationIoError(e) => ReadError::ReadIoError(e),
                request::RequestCreationError::ExpectationFailed => {
                    ReadError::ExpectationFailed(version)
                }
                request::RequestCreationError::BodyTooShort => ReadError::BodyTooShort(version),
            }
        })?;

        // return the request
        Ok(request.with_connection_id(self.id))
    }
}

impl Iterator for ClientConnection {
    type Item = Request;

    /// Blocks until the next Request is available.
    /// Returns None when no new Requests will come from the client.
    fn next(&mut self) -> Option<Request> {
        use crate::{Response, StatusCode};

        // the client sent a "connection: close" header in this previous request
        //  or is using HTTP 1.0, meaning that no new request will come
        // seckill patch: or a request was answered with `respond_and_close`.
        if self.no_more_requests || self.closing.is_set() {
            return None;
        }
        // seckill patch: a connection reset before its peer's address was
        // read is gone: nothing to read, nobody to answer.
        if self.remote_addr.is_err() {
            return None;
        }

        loop {
            let rq = match self.read() {
                // seckill patch: each 400 says why (`answer_bad_request`).
                Err(ReadError::WrongRequestLine) => {
                    self.answer_bad_request(HTTPVersion(1, 1), "malformed request line");
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::WrongHeader(ver)) => {
                    self.answer_bad_request(ver, "malformed header line");
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::BodyTooShort(ver)) => {
                    self.answer_bad_request(ver, "the body ended before its Content-Length");
                    return None;
                }

                Err(ReadError::ReadIoError(ref err)) if err.kind() == ErrorKind::TimedOut => {
                    // request timeout
                    let writer = self.sink.next().unwrap();
                    let response = Response::new_empty(StatusCode(408));
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                    return None; // closing the connection
                }

                Err(ReadError::ExpectationFailed(ver)) => {
                    let writer = self.sink.next().unwrap();
                    let response = Response::new_empty(StatusCode(417));
                    response.raw_print(writer, ver, &[], true, None).ok();
                    return None; // TODO: should be recoverable, but needs handling in case of body
                }

                Err(ReadError::HeaderTooLarge) => {
                    // seckill patch: 431, then the connection is closed (the
                    // rest of the line is never read).
                    let writer = self.sink.next().unwrap();
                    let response = Response::new_empty(StatusCode(431));
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                    return None;
                }

                Err(ReadError::ReadIoError(_)) => return None,

                Ok(rq) => rq,
            };

            // checking HTTP version
            // seckill patch: a version above 1.1 (an HTTP/2 connection
            // preface, `PRI * HTTP/2.0`, say) gets a 505 with JSON and
            // `Connection: close` through the request's own writer, as
            // HTTP/1.1, and the connection ends. Upstream wrote its 505
            // through the next writer while the request still held its own,
            // so the write waited for the request forever: no answer, and a
            // connection thread stuck for good.
            if *rq.http_version() > (1, 1) {
                use crate::Header;
                let body = "{\"error\":\"http_version_not_supported\",\
                            \"detail\":\"this server speaks HTTP/1.0 and HTTP/1.1 only\"}";
                let mut response = Response::from_string(body).with_status_code(StatusCode(505));
                if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
                    response.add_header(h);
                }
                rq.respond_as_http11_and_close(response).ok();
                return None;
            }

            // updating the status of the connection
            let connection_header = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Connection"))
                .map(|h| h.value.as_str());

            let lowercase = connection_header.map(|h| h.to_ascii_lowercase());

            match lowercase {
                Some(ref val) if val.contains("close") => self.no_more_requests = true,
                Some(ref val) if val.contains("upgrade") => self.no_more_requests = true,
                Some(ref val)
                    if !val.contains("keep-alive") && *rq.http_version() == HTTPVersion(1, 0) =>
                {
                    self.no_more_requests = true
                }
                None if *rq.http_version() == HTTPVersion(1, 0) => self.no_more_requests = true,
                _ => (),
            };

            // returning the request
            return Some(rq);
        }
    }
}

/// Parses a "HTTP/1.1" string.
fn parse_http_version(version: &str) -> Result<HTTPVersion, ReadError> {
    let (major, minor) = match version {
        "HTTP/0.9" => (0, 9),
        "HTTP/1.0" => (1, 0),
        "HTTP/1.1" => (1, 1),
        "HTTP/2.0" => (2, 0),
        "HTTP/3.0" => (3, 0),
        _ => return Err(ReadError::WrongRequestLine),
    };

    Ok(HTTPVersion(major, minor))
}

/// Parses the request line of the request.
/// eg. GET / HTTP/1.1
fn parse_request_line(line: &str) -> Result<(Method, String, HTTPVersion), ReadError> {
    let mut parts = line.split(' ');

    let method = parts.next().and_then(|w| w.parse().ok());
    let path = parts.next().map(ToOwned::to_owned);
    let version = parts.next().and_then(|w| parse_http_version(w).ok());

    method
        .and_then(|method| Some((method, path?, version?)))
        .ok_or(ReadError::WrongRequestLine)
}

#[cfg(test)]
mod test {
    #[test]
    fn test_parse_request_line() {
        let (method, path, ver) = super::parse_request_line("GET /hello HTTP/1.1").unwrap();

        assert!(method == crate::Method::Get);
        assert!(path == "/hello");
        assert!(ver == crate::common::HTTPVersion(1, 1));

        assert!(super::parse_request_line("GET /hello").is_err());
        assert!(super::parse_request_line("qsd qsd qsd").is_err());
    }
}
