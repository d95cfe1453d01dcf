//! Specifies the gateway's HTTP framing on a raw socket, byte for byte
//! (docs/DESIGN.md, "Gateway"): a body the gateway will not read is answered at
//! once and the connection closed, with no 1xx the client did not ask for;
//! `Expect: 100-continue` is honoured as RFC 9110 section 10.1.1 says: a
//! `100 Continue` only before a body the gateway is going to read, never
//! before a final answer given without reading it, and never to HTTP/1.0;
//! a request of a version above HTTP/1.1 (the HTTP/2 preface) gets a 505.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use seckill_tests::RedisServer;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const SALE: u64 = 5;
const PATH: &str = "/v1/sales/5/purchases";

/// Starts Redis (sale `SALE`, stock 10) and the gateway, runs `client`
/// against the port, then checks that Redis is unchanged and that a valid
/// purchase right after is answered 202.
fn then_a_purchase_succeeds(client: impl FnOnce(u16)) {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let before = snapshot(&redis, SALE);
    client(g.port);
    assert_eq!(before, snapshot(&redis, SALE), "Redis changed");
    assert_eq!(buy(g.port, SALE, "after").status, 202);
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    // A guard against a hang, not a timed assertion: a read that waits
    // this long fails the test.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Every byte the gateway sends until it closes the connection. A read
/// error (a reset instead of the end of stream) fails the test.
fn read_to_end_of_stream(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        panic!(
            "{e} after {:?}: the connection must end with end of stream",
            String::from_utf8_lossy(&out)
        );
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks that `all` is one 413 answer with `Connection: close` and the
/// `payload_too_large` body, and nothing else (no interim answer).
fn assert_one_413_and_nothing_else(all: &str) {
    assert!(all.starts_with("HTTP/1.1 413 "), "{all:?}");
    assert_eq!(all.matches("HTTP/1.").count(), 1, "{all:?}");
    assert!(!all.contains(" 100 "), "{all:?}");
    let (head, body) = all.split_once("\r\n\r\n").expect("a head");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("Connection: close")),
        "{head:?}"
    );
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(json["error"], "payload_too_large", "{body:?}");
}

#[test]
fn a_declared_terabyte_gets_413_first_and_then_end_of_stream() {
    then_a_purchase_succeeds(|port| {
        let mut s = connect(port);
        let head =
            format!("POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(b"0123456789").unwrap();
        assert_one_413_and_nothing_else(&read_to_end_of_stream(&mut s));
    });
}

#[test]
fn expect_100_continue_with_a_declared_terabyte_gets_413_and_no_100() {
    then_a_purchase_succeeds(|port| {
        let mut s = connect(port);
        let head = format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000000000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        assert_one_413_and_nothing_else(&read_to_end_of_stream(&mut s));
    });
}

#[test]
fn expect_100_continue_with_a_length_over_the_limit_gets_413_and_no_100() {
    // 8,000 bytes: over the 4 KiB default limit, under the 1 MiB the gateway
    // would drain. The body is never asked for, so none is sent, and the
    // connection must close rather than wait for it.
    then_a_purchase_succeeds(|port| {
        let mut s = connect(port);
        let head = format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 8000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        assert_one_413_and_nothing_else(&read_to_end_of_stream(&mut s));
    });
}

/// Reads one head (up to its empty line) byte by byte, so that nothing
/// after it is taken from the socket.
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            other => panic!("{other:?} after {:?}", String::from_utf8_lossy(&head)),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn expect_100_continue_with_a_valid_purchase_gets_100_before_the_body_is_sent() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let mut s = connect(g.port);
    let body = r#"{"user_id":"expects"}"#;
    let head = format!(
        "POST {PATH} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        seckill_tests::auth::token_for("expects"),
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // Nothing of the body is sent until the 100 has arrived.
    assert_eq!(read_head(&mut s), "HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(body.as_bytes()).unwrap();
    let answer = read_head(&mut s);
    assert!(answer.starts_with("HTTP/1.1 202 "), "{answer:?}");
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
    // The connection stays usable: the next request is served.
    s.write_all(format_request("GET", "/healthz", None, true).as_bytes())
        .unwrap();
    let rest = read_to_end_of_stream(&mut s);
    assert!(rest.contains("HTTP/1.1 200 "), "{rest:?}");
    assert!(!rest.contains(" 100 "), "{rest:?}");
}

#[test]
fn expect_100_continue_in_http_1_0_gets_no_100() {
    // RFC 9110 10.1.1: a server must ignore a 100-continue expectation in an
    // HTTP/1.0 request (such a client may take the 100 for the answer).
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let mut s = connect(g.port);
    let body = r#"{"user_id":"ten"}"#;
    let req = format!(
        "POST {PATH} HTTP/1.0\r\nExpect: 100-continue\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        seckill_tests::auth::token_for("ten"),
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let all = read_to_end_of_stream(&mut s);
    assert!(all.starts_with("HTTP/1.0 202 "), "{all:?}");
    assert_eq!(all.matches("HTTP/1.").count(), 1, "{all:?}");
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
}

/// A purchase whose body cannot be framed, with a whole second request as
/// its "body": the gateway must answer 400 and close, never serve the
/// smuggled request (RFC 9112, 6.3 and 11.2).
fn assert_smuggled_request_is_never_served(framing: &str) {
    then_a_purchase_succeeds(|port| {
        let smuggled = format!("GET /v1/sales/{SALE} HTTP/1.1\r\nHost: x\r\n\r\n");
        let req = format!(
            "POST {PATH} HTTP/1.1\r\nHost: x\r\n{framing}Content-Type: application/json\r\n\r\n{smuggled}"
        );
        let mut s = connect(port);
        s.write_all(req.as_bytes()).unwrap();
        let all = read_to_end_of_stream(&mut s);
        assert!(all.starts_with("HTTP/1.1 400 "), "{framing:?}: {all:?}");
        assert_eq!(all.matches("HTTP/1.").count(), 1, "{framing:?}: {all:?}");
        assert!(all.contains("\"invalid_request\""), "{framing:?}: {all:?}");
    });
}

#[test]
fn a_request_smuggled_after_a_refused_transfer_encoding_is_never_served() {
    assert_smuggled_request_is_never_served("Transfer-Encoding: chunked\r\n");
    assert_smuggled_request_is_never_served("Transfer-Encoding: chunked\r\nContent-Length: 2\r\n");
}

#[test]
fn a_request_smuggled_after_a_refused_content_length_is_never_served() {
    assert_smuggled_request_is_never_served("Content-Length: 2\r\nContent-Length: 40\r\n");
    assert_smuggled_request_is_never_served("Content-Length: +2\r\n");
}

/// The HTTP/2 connection preface (RFC 9113 3.4) and an empty SETTINGS
/// frame, as an HTTP/2 client with prior knowledge sends them.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A request line naming a version above HTTP/1.1 (the HTTP/2 preface, or
/// `HTTP/3.0` in text) is answered at once: one 505 with the gateway's JSON
/// error and `Connection: close`, as HTTP/1.1, then the end of stream
/// (vendor/tiny_http patch 0013; upstream wrote nothing and held the
/// connection's thread for good).
#[test]
fn a_version_above_http_1_1_gets_a_505_and_the_connection_ends() {
    then_a_purchase_succeeds(|port| {
        for bytes in [H2_PREFACE, &b"GET /healthz HTTP/3.0\r\nHost: x\r\n\r\n"[..]] {
            let mut s = connect(port);
            s.write_all(bytes).unwrap();
            let all = read_to_end_of_stream(&mut s);
            let (head, body) = all.split_once("\r\n\r\n").expect("a head");
            let mut lines = head.split("\r\n");
            assert_eq!(
                lines.next(),
                Some("HTTP/1.1 505 HTTP Version Not Supported")
            );
            let headers: Vec<&str> = lines.filter(|l| !l.starts_with("Date: ")).collect();
            assert_eq!(
                headers,
                [
                    "Server: tiny-http (Rust)",
                    "Content-Type: application/json",
                    "Connection: close",
                    "Content-Length: 95",
                ],
                "{all:?}"
            );
            assert_eq!(
                body,
                r#"{"error":"http_version_not_supported","detail":"this server speaks HTTP/1.0 and HTTP/1.1 only"}"#
            );
        }
    });
}
