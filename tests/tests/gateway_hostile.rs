//! Specifies the gateway against hostile clients, one test per input: each
//! gets its exact stated answer (a connection closed without an answer is
//! a failure, except where a limit closes it on purpose: 431), Redis is unchanged, the process keeps serving, and a valid purchase
//! right after succeeds.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use seckill_tests::{wait_until, RedisServer};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const SALE: u64 = 9;
/// A second sale, for the purchases of hostile clients.
const OTHER_SALE: u64 = 8;

/// Starts Redis and the gateway (with `env`), runs `hostile` against the
/// port, then checks: Redis unchanged, the gateway alive, a valid purchase
/// answered 202.
fn survives(env: &[(&str, &str)], hostile: impl FnOnce(u16)) {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let mut g = Gateway::start(&redis, env);
    let before = snapshot(&redis, SALE);
    hostile(g.port);
    assert_eq!(before, snapshot(&redis, SALE), "Redis changed");
    assert!(g.alive(), "the gateway died");
    let r = buy(g.port, SALE, "valid-after");
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
}

/// A purchase with these body bytes, carrying the token of the body's
/// `user_id` when it has one (else of `hostile`: a bad body is refused
/// before the token is looked at).
fn post_bytes(port: u16, body: &[u8]) -> Option<Resp> {
    let user = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["user_id"].as_str().map(String::from))
        .filter(|u| seckill_common::is_valid_token(u))
        .unwrap_or_else(|| "hostile".into());
    let mut req = format!(
        "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n",
        seckill_tests::auth::token_for(&user),
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    raw(port, &req)
}

fn assert_400(port: u16, body: &[u8]) {
    let r = post_bytes(port, body).expect("an answer");
    assert_eq!(
        (r.status, r.error()),
        (400, "invalid_request".into()),
        "{r:?}"
    );
    assert!(r.json()["detail"].is_string());
}

#[test]
fn malformed_json_is_400() {
    survives(&[], |p| assert_400(p, b"{user_id: \"a\"}"));
}

#[test]
fn empty_body_is_400() {
    survives(&[], |p| assert_400(p, b""));
}

#[test]
fn truncated_json_is_400() {
    survives(&[], |p| assert_400(p, br#"{"user_id": "ali"#));
}

#[test]
fn non_utf8_bytes_are_400() {
    survives(&[], |p| assert_400(p, b"{\"user_id\": \"\xff\xfe\xc0\"}"));
}

#[test]
fn one_hundred_thousand_nested_brackets_are_400() {
    // The default 4 KiB limit would answer 413; raise it so the parser sees them.
    survives(&[("SECKILL_BODY_LIMIT", "200000")], |p| {
        assert_400(p, &vec![b'['; 100_000]);
        let mut nested = br#"{"user_id":"#.to_vec();
        nested.extend(vec![b'['; 100_000]);
        assert_400(p, &nested);
    });
}

#[test]
fn user_id_as_number_is_400() {
    survives(&[], |p| assert_400(p, br#"{"user_id": 42}"#));
}

#[test]
fn user_id_as_null_is_400() {
    survives(&[], |p| assert_400(p, br#"{"user_id": null}"#));
}

#[test]
fn user_id_as_array_is_400() {
    survives(&[], |p| assert_400(p, br#"{"user_id": ["a"]}"#));
}

#[test]
fn missing_user_id_is_400() {
    survives(&[], |p| assert_400(p, br#"{"name": "a"}"#));
}

#[test]
fn user_id_of_65_characters_is_400() {
    let body = format!(r#"{{"user_id": "{}"}}"#, "a".repeat(65));
    survives(&[], |p| assert_400(p, body.as_bytes()));
}

#[test]
fn user_id_with_a_space_is_400() {
    survives(&[], |p| assert_400(p, br#"{"user_id": "a b"}"#));
}

#[test]
fn user_id_with_control_characters_is_400() {
    survives(&[], |p| {
        assert_400(p, b"{\"user_id\": \"a\\u0000b\"}");
        assert_400(p, b"{\"user_id\": \"a\\nb\"}");
    });
}

#[test]
fn unknown_fields_are_refused_with_400() {
    survives(&[], |p| {
        assert_400(p, br#"{"user_id": "a", "quantity": 2}"#)
    });
}

#[test]
fn a_body_over_the_limit_is_413_before_it_is_read() {
    survives(&[], |p| {
        // Declare 8,000 bytes, send 100: the answer comes without the rest.
        let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: 8000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&[b' '; 100]).unwrap();
        let r = read_resp(&mut std::io::BufReader::new(s)).expect("an answer");
        assert_eq!((r.status, r.error()), (413, "payload_too_large".into()));
    });
}

#[test]
fn a_body_just_over_the_limit_sent_whole_is_413() {
    let mut body = br#"{"user_id":"big"}"#.to_vec();
    body.extend(vec![b' '; 5000]);
    survives(&[], |p| {
        let r = post_bytes(p, &body).expect("an answer");
        assert_eq!(r.status, 413);
    });
}

#[test]
fn a_valid_body_of_2000_bytes_is_read_off_the_handler_threads() {
    // Above tiny_http's 1 KiB in-memory bodies, within the 4 KiB limit.
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let mut body = br#"{"user_id":"padded"}"#.to_vec();
    body.extend(vec![b' '; 2000]);
    assert_eq!(post_bytes(g.port, &body).unwrap().status, 202);
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
}

#[test]
fn a_declared_terabyte_with_10_bytes_is_413_and_the_process_survives() {
    survives(&[], |p| {
        for _ in 0..3 {
            let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let head = format!(
                "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n0123456789"
            );
            s.write_all(head.as_bytes()).unwrap();
            let r = read_resp(&mut std::io::BufReader::new(s)).expect("an answer");
            assert_eq!((r.status, r.error()), (413, "payload_too_large".into()));
            // The gateway closes the connection without reading the body.
        }
        let m = get(p, "/metrics");
        assert!(
            m.body
                .contains("seckill_gateway_parked_connections_total 3"),
            "{}",
            m.body
        );
    });
}

/// The gateway's open TCP sockets (its own descriptors, from /proc).
fn open_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .map(|l| l.to_string_lossy().starts_with("socket:"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn declared_terabytes_are_closed_by_the_gateway_even_while_their_clients_hold_on() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let pid = g.child.id();
    assert_eq!(get(g.port, "/healthz").status, 200);
    let idle = open_sockets(pid);
    let mut clients = Vec::new();
    for _ in 0..40 {
        let mut s = TcpStream::connect(("127.0.0.1", g.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let head = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n0123456789"
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut r = std::io::BufReader::new(s);
        let resp = read_resp(&mut r).expect("an answer");
        assert_eq!(resp.status, 413);
        assert_eq!(resp.header("Connection"), Some("close"), "{resp:?}");
        // Then the end of stream: the gateway has closed its side.
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).expect("end of stream");
        assert!(rest.is_empty(), "{rest:?}");
        clients.push(r);
    }
    // The clients hold their sockets open and send nothing more: the
    // gateway still closes every one of those connections (upstream
    // tiny_http could only keep them until the declared terabyte arrived,
    // or abort).
    wait_until(
        Duration::from_secs(30),
        "the refused connections to close",
        || open_sockets(pid) <= idle + 1,
    );
    drop(clients);
    assert_eq!(buy(g.port, SALE, "after").status, 202);
}

/// Runs `hold` (which keeps hostile connections open while it runs
/// `during`), where `during` is a valid purchase by another client: it must
/// be answered 202 while the hostile clients hang on. Then the gateway is
/// alive and another purchase succeeds; only the two purchases changed Redis.
fn purchases_go_on_beside(hold: impl FnOnce(u16, &dyn Fn())) {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let mut g = Gateway::start(&redis, &[]);
    let p = g.port;
    let during = move || {
        let t = Instant::now();
        let r = buy(p, SALE, "during");
        eprintln!(
            "purchase beside hostile clients: {} in {:?}",
            r.status,
            t.elapsed()
        );
        assert_eq!(r.status, 202, "{r:?}");
    };
    hold(p, &during);
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
    assert!(g.alive(), "the gateway died");
    assert_eq!(buy(p, SALE, "after").status, 202);
    assert_eq!(counts(&redis, SALE), (8, 2, 2));
}

/// Reads what the gateway sends on `s` until it closes: a 431, or nothing
/// when the reset that closing a socket with unread bytes sends came first.
fn assert_431_or_reset(s: &mut TcpStream) {
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let head = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || head.starts_with("HTTP/1.1 431"),
        "expected 431, got {:?}",
        head.lines().next()
    );
}

#[test]
fn an_endless_header_line_does_not_stop_other_purchases() {
    purchases_go_on_beside(|p, during| {
        let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"POST /v1/sales/9/purchases HTTP/1.1\r\nX-Endless: ")
            .unwrap();
        // Up to 64 MiB of one header line; the gateway stops reading after
        // 8 KiB (patched tiny_http), answers 431 and closes, so the writes
        // fail long before.
        // First 4 KiB: the line is open and within the limit meanwhile.
        s.write_all(&[b'a'; 4096]).unwrap();
        during();
        let chunk = vec![b'a'; 1 << 16];
        let mut sent = 4096usize;
        for _ in 0..1024 {
            if s.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len();
        }
        eprintln!("{sent} bytes of one header line sent before the gateway closed");
        assert!(sent < 64 << 20, "the whole 64 MiB was taken");
        assert_431_or_reset(&mut s);
    });
}

/// A header block of many short lines is bounded too: 64 KiB in all.
#[test]
fn too_many_header_lines_are_431() {
    survives(&[], |p| {
        let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rq = b"GET /healthz HTTP/1.1\r\n".to_vec();
        for i in 0..2000 {
            rq.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "b".repeat(40)).as_bytes());
        }
        rq.extend_from_slice(b"\r\n");
        let _ = s.write_all(&rq);
        assert_431_or_reset(&mut s);
    });
}

/// At most 100 header lines: a line costs far more memory parsed than its
/// bytes (64 KiB of `:` lines took about 1 MB). A browser-like request with
/// a few dozen headers is served.
#[test]
fn more_than_100_header_lines_are_431_and_30_are_fine() {
    survives(&[], |p| {
        let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rq = b"GET /healthz HTTP/1.1\r\n".to_vec();
        rq.extend(b"a:\r\n".repeat(150));
        rq.extend_from_slice(b"\r\n");
        let _ = s.write_all(&rq);
        assert_431_or_reset(&mut s);

        let mut rq =
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".to_string();
        for i in 0..30 {
            rq.push_str(&format!("X-Browser-{i}: {}\r\n", "v".repeat(60)));
        }
        rq.push_str("\r\n");
        let r = raw(p, rq.as_bytes()).expect("an answer");
        assert_eq!(r.status, 200);
    });
}

#[test]
fn three_hundred_slow_clients_do_not_stop_other_purchases() {
    purchases_go_on_beside(|p, during| {
        // Each sends a byte, waits, sends another: a request line that never ends.
        let mut slow: Vec<TcpStream> = (0..300)
            .map(|_| {
                let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
                s.write_all(b"P").unwrap();
                s
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        for s in &mut slow {
            s.write_all(b"O").unwrap();
        }
        during();
        drop(slow);
    });
}

/// Clients that pipeline requests and never read the answers: once their
/// socket buffers are full, the gateway's writes to them block (for the
/// 60 s send timeout set here). Only their own connections may wait: a
/// purchase by another client is answered at once. (When handler threads
/// or the Redis threads wrote the answers, 16 such clients held every one
/// of them.)
#[test]
fn clients_that_never_read_their_answers_do_not_stop_other_purchases() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    open_sale(&redis, OTHER_SALE, 100_000);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_WRITE_TIMEOUT", "60s")]);
    let p = g.port;
    let writers: Vec<_> = (0..16)
        .map(|c| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", p)).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut sent = 0usize;
                // Purchases first (answered by way of the group commit),
                // then health checks until the gateway stops reading.
                for i in 0..50 {
                    let body = format!(r#"{{"user_id":"mute-{c}-{i}"}}"#);
                    let rq = format_request(
                        "POST",
                        &format!("/v1/sales/{OTHER_SALE}/purchases"),
                        Some(&body),
                        false,
                    );
                    if s.write_all(rq.as_bytes()).is_err() {
                        return (s, sent);
                    }
                    sent += 1;
                }
                let hz = format_request("GET", "/healthz", None, false).repeat(1000);
                while s.write_all(hz.as_bytes()).is_ok() {
                    sent += 1000;
                }
                (s, sent)
            })
        })
        .collect();
    // Every writer is blocked (its socket and the gateway's are full).
    let mute: Vec<(TcpStream, usize)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    eprintln!(
        "requests sent by clients that never read: {:?}",
        mute.iter().map(|m| m.1).collect::<Vec<_>>()
    );
    let t = Instant::now();
    let r = buy(p, SALE, "reader");
    eprintln!(
        "purchase beside 16 clients that never read: {} in {:?}",
        r.status,
        t.elapsed()
    );
    assert_eq!(r.status, 202, "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "answered only after {:?}",
        t.elapsed()
    );
    assert_eq!(get(p, "/healthz").status, 200);
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
    drop(mute);
    assert_eq!(buy(p, SALE, "after").status, 202);
    assert_eq!(counts(&redis, SALE), (8, 2, 2));
}

/// Each odd path of a purchase, with the exact answer it gets.
#[test]
fn odd_paths_get_their_exact_answers_never_a_500() {
    survives(&[], |p| {
        let body = Some(r#"{"user_id":"odd"}"#);
        let table: [(&str, u16, &str); 8] = [
            ("/v1/sales/../../etc/passwd", 404, "not_found"),
            // Not a sale id (digits only, within u64): no such sale.
            ("/v1/sales/abc/purchases", 404, "sale_not_found"),
            (
                "/v1/sales/99999999999999999999999/purchases",
                404,
                "sale_not_found",
            ),
            ("/v1/sales/%39/purchases", 404, "sale_not_found"),
            // A trailing slash (the documented 404; it was 405 with
            // `Allow: GET`, the per-buyer route's, for an empty buyer).
            ("/v1/sales/9/purchases/", 404, "not_found"),
            // A query string is refused, not ignored.
            ("/v1/sales/9/purchases?user_id=x", 400, "invalid_request"),
            ("/v1/sales/9/", 404, "not_found"),
            ("//v1/sales/9/purchases", 404, "not_found"),
        ];
        let got: Vec<(&str, u16, String)> = table
            .iter()
            .map(|(path, _, _)| {
                let r = request(p, "POST", path, body);
                (*path, r.status, r.error())
            })
            .collect();
        let want: Vec<(&str, u16, String)> = table
            .iter()
            .map(|(path, status, error)| (*path, *status, error.to_string()))
            .collect();
        assert_eq!(got, want);
    });
}

/// The answer to a request the HTTP layer cannot read: exactly a 400 with
/// the gateway's error shape, this `detail`, and `Connection: close` (the
/// next request's start is unknown). A connection closed without an answer
/// fails.
fn assert_unreadable(r: Option<Resp>, detail: &str) {
    let r = r.expect("an answer, not a closed connection");
    assert_eq!(
        (
            r.status,
            r.error(),
            r.json()["detail"].as_str(),
            r.header("Connection")
        ),
        (
            400,
            "invalid_request".to_string(),
            Some(detail),
            Some("close")
        ),
        "{r:?}"
    );
}

#[test]
fn content_length_with_chunked_transfer_encoding_is_refused() {
    survives(&[], |p| {
        let req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: 17\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n{{\"user_id\":\"te\"}}\r\n0\r\n\r\n"
        );
        let r = raw(p, req.as_bytes()).expect("an answer");
        assert_eq!(
            (r.status, r.error(), r.header("Connection")),
            (400, "invalid_request".to_string(), Some("close")),
            "{r:?}"
        );
    });
}

#[test]
fn a_space_before_a_header_colon_is_refused() {
    survives(&[], |p| {
        let req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length : 17\r\n\r\n{{\"user_id\":\"sp\"}}"
        );
        assert_unreadable(raw(p, req.as_bytes()), "malformed header line");
    });
}

#[test]
fn a_request_line_of_garbage_is_refused() {
    survives(&[], |p| {
        // The start of a TLS handshake sent to the plain-HTTP port.
        let r = raw(p, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n");
        assert_unreadable(r, "malformed request line");
    });
}

#[test]
fn a_header_line_that_is_not_ascii_is_refused() {
    survives(&[], |p| {
        let req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nX-Name: \u{e9}t\u{e9}\r\nContent-Length: 17\r\n\r\n{{\"user_id\":\"na\"}}"
        );
        assert_unreadable(raw(p, req.as_bytes()), "malformed header line");
    });
}

/// Sends the head of a purchase declaring `declared` bytes, then only
/// `{"user_id":"short"}`, then closes its sending side.
fn truncated_purchase(port: u16, declared: usize) -> Option<Resp> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n{{\"user_id\":\"short\"}}"
    );
    s.write_all(req.as_bytes()).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    read_resp(&mut std::io::BufReader::new(s))
}

#[test]
fn a_body_shorter_than_its_content_length_is_never_a_purchase() {
    survives(&[], |p| {
        // Read on the slow lane (declared over 1 KiB): a 400.
        let r = truncated_purchase(p, 2000).expect("an answer");
        assert_eq!(r.status, 400, "{r:?}");
        assert_eq!(r.error(), "invalid_request");
        // Read by tiny_http before the handler (declared up to 1 KiB): the
        // same 400, from the HTTP layer.
        assert_unreadable(
            truncated_purchase(p, 500),
            "the body ended before its Content-Length",
        );
    });
}

#[test]
fn a_signed_content_length_is_refused() {
    survives(&[], |p| {
        let req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: +17\r\n\r\n{{\"user_id\":\"ple\"}}"
        );
        let r = raw(p, req.as_bytes()).expect("an answer");
        assert_eq!(r.status, 400, "{r:?}");
    });
}

#[test]
fn a_request_pipelined_after_a_huge_body_is_never_served() {
    survives(&[], |p| {
        let s = TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let declared = (1 << 20) + 1;
        let mut req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n"
        )
        .into_bytes();
        req.extend(std::iter::repeat_n(b' ', declared));
        let smuggled = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\r\nContent-Length: 19\r\n\r\n{{\"user_id\":\"smugA\"}}"
        );
        req.extend_from_slice(smuggled.as_bytes());
        let mut writer = s.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            let _ = writer.write_all(&req);
        });
        let mut r = std::io::BufReader::new(s);
        let first = read_resp(&mut r).expect("an answer");
        assert_eq!(first.status, 413, "{first:?}");
        // The connection ends after the 413: the pipelined purchase gets no
        // answer and reserves nothing (`survives` checks Redis).
        assert!(
            read_resp(&mut r).is_none(),
            "the pipelined request was served"
        );
        let _ = sender.join();
    });
}

#[test]
fn a_request_with_bare_lf_line_ends_is_refused_at_once() {
    survives(&[], |p| {
        // Upstream waited for a CRLF that never came (until the read timeout).
        assert_unreadable(
            raw(p, b"GET /healthz HTTP/1.1\nHost: x\n\n"),
            "malformed request line",
        );
        let req = format!(
            "POST /v1/sales/{SALE}/purchases HTTP/1.1\r\nHost: x\nX-Smuggled: y\r\nContent-Length: 17\r\n\r\n{{\"user_id\":\"lf\"}}"
        );
        assert_unreadable(raw(p, req.as_bytes()), "malformed header line");
    });
}

#[test]
fn an_empty_header_name_or_a_control_character_in_a_header_is_refused() {
    survives(&[], |p| {
        for header in [": v", "X-Nul: a\0b", "X-Esc: a\x1bb", "X-Del: a\x7fb"] {
            let req = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n");
            assert_unreadable(raw(p, req.as_bytes()), "malformed header line");
        }
        // A tab in a value is allowed (RFC 9110 5.5).
        let r = raw(
            p,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Tab: a\tb\r\n\r\n",
        )
        .expect("an answer");
        assert_eq!(r.status, 200, "{r:?}");
    });
}

#[test]
fn a_request_on_a_connection_reset_before_it_was_accepted_makes_no_thread_panic() {
    use socket2::{Domain, Socket, Type};
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let dir = seckill_tests::TempDir::new();
    let log = dir.path().join("gateway.stderr");
    let port = seckill_tests::free_port();
    let mut child = seckill_tests::command("seckill-gateway")
        .env("SECKILL_LISTEN", format!("127.0.0.1:{port}"))
        .env("SECKILL_REDIS_URL", redis.url())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the gateway to listen", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // Each connection sends a request and is reset (SO_LINGER 0) at once,
    // while the gateway is stopped: the kernel completes them in the
    // listen backlog, and the gateway accepts them reset, the request
    // still to read but no peer address left (ENOTCONN).
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    signal(child.id(), "STOP");
    for _ in 0..50 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_linger(Some(Duration::ZERO)).unwrap();
        s.connect(&addr.into()).unwrap();
        // A whole request first: the gateway reads it, then finds no peer.
        let mut s: TcpStream = s.into();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        drop(s);
    }
    signal(child.id(), "CONT");
    // Served as usual afterwards.
    let r = buy(port, SALE, "after-resets");
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(counts(&redis, SALE), (9, 1, 1));
    let _ = child.kill();
    let _ = child.wait();
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        !err.contains("panicked"),
        "a reset connection made a thread panic:\n{err}"
    );
}
