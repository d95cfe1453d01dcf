//! Specifies that a burst of new keep-alive connections at a sale's opening
//! is answered in full: every connection gets its answer while all of them
//! stay open (the case that stalled tiny_http 0.12's thread pool; see
//! vendor/tiny_http/patches/0002-task-pool-idle-count.patch).

use crate::support::gateway as gateway_support;

use gateway_support::{counts, format_request, open_sale, read_resp, Gateway};
use seckill_tests::RedisServer;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const CONNECTIONS: usize = 400;

#[test]
fn a_burst_of_400_new_keep_alive_connections_is_answered_in_full() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_sale(&redis, 1, 1000);
    let gw = Gateway::start(&redis, &[]);
    let port = gw.port;
    let start = Arc::new(Barrier::new(CONNECTIONS));
    // Nobody closes before everyone has had an answer or given up: a stuck
    // connection must not be rescued by another connection's close.
    let done = Arc::new(Barrier::new(CONNECTIONS));
    let handles: Vec<_> = (0..CONNECTIONS)
        .map(|i| {
            let (start, done) = (start.clone(), done.clone());
            std::thread::spawn(move || {
                let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                // A bounded wait, not a speed claim: an answer normally takes
                // milliseconds; the stall it guards against lasted until some
                // other connection closed.
                s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
                let mut r = BufReader::new(s);
                start.wait();
                let body = format!(r#"{{"user_id":"burst-{i}"}}"#);
                let req = format_request("POST", "/v1/sales/1/purchases", Some(&body), false);
                r.get_mut().write_all(req.as_bytes()).unwrap();
                let status = read_resp(&mut r).map(|resp| resp.status);
                done.wait();
                status
            })
        })
        .collect();
    let statuses: Vec<Option<u16>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let answered = statuses.iter().filter(|s| s.is_some()).count();
    let accepted = statuses.iter().filter(|s| **s == Some(202)).count();
    assert_eq!(answered, CONNECTIONS, "connections left without an answer");
    assert_eq!(accepted, CONNECTIONS);
    assert_eq!(counts(&redis, 1), (600, 400, 400));
}
