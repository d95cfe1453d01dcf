//! Specifies purchases answered by the Redis thread that reserved them
//! (gateway/src/http/answer.rs): on a connection that pipelines requests every
//! answer comes back in the order of its request, with exact records in
//! Redis; and a client that pipelines purchases and never reads its
//! answers holds up nobody else, even with one Redis thread serving every
//! connection, then gets every answer, in order, once it reads.

use crate::support::gateway as gateway_support;

use gateway_support::*;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::RedisServer;
use socket2::{Domain, Socket, Type};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const SALE: u64 = 7;

fn purchase(user: &str) -> String {
    format_request(
        "POST",
        &format!("/v1/sales/{SALE}/purchases"),
        Some(&format!(r#"{{"user_id":"{user}"}}"#)),
        false,
    )
}

/// The reservation id Redis holds for `user`'s purchase.
fn reservation_of(redis: &RedisServer, user: &str) -> Option<String> {
    redis
        .con()
        .hget(SaleKeys::new(SALE).buyers(), user)
        .unwrap()
}

/// The `seckill_gateway_slow_answers_total` counter.
fn slow_answers(port: u16) -> u64 {
    let m = get(port, "/metrics");
    m.body
        .lines()
        .find_map(|l| l.strip_prefix("seckill_gateway_slow_answers_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("seckill_gateway_slow_answers_total on /metrics")
}

#[test]
fn pipelined_requests_on_one_connection_are_answered_in_order() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(&redis, &[]);
    let mut s = TcpStream::connect(("127.0.0.1", g.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // One write: every request is in the gateway's buffer before the
    // first is answered.
    let all = [
        purchase("p1"),
        purchase("p2"),
        format_request("GET", "/healthz", None, false),
        purchase("p3"),
        purchase("p1"),
        format_request(
            "GET",
            &format!("/v1/sales/{SALE}/purchases/p2"),
            None,
            false,
        ),
        purchase("p4"),
    ]
    .concat();
    s.write_all(all.as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let answers: Vec<Resp> = (0..7)
        .map(|i| read_resp(&mut r).unwrap_or_else(|| panic!("answer {i}")))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses, [202, 202, 200, 202, 409, 200, 202]);
    let rid = |a: &Resp| a.json()["reservation_id"].as_str().unwrap().to_string();
    for (i, user) in [(0, "p1"), (1, "p2"), (3, "p3"), (6, "p4")] {
        assert_eq!(
            Some(rid(&answers[i])),
            reservation_of(&redis, user),
            "{user}"
        );
    }
    assert_eq!(answers[2].json()["status"], "ok");
    assert_eq!(
        rid(&answers[4]),
        rid(&answers[0]),
        "p1's retry names p1's id"
    );
    assert_eq!(answers[4].error(), "already_purchased");
    assert_eq!(
        answers[5].json()["reservation_id"],
        rid(&answers[1]).as_str()
    );
    assert_eq!(counts(&redis, SALE), (6, 4, 4));
}

/// Requests of a connection take effect in their order (RFC 9112, 9.3.2):
/// a status read and a retry pipelined behind a purchase the Redis thread
/// answers see that purchase. Before, the connection thread served them
/// as soon as it had handed the purchase over, so the read often ran
/// before the reservation script: 202 for the purchase, then 404
/// `purchase_not_found` for its status (on 10 to 17 of 50 connections).
#[test]
fn requests_pipelined_behind_a_purchase_see_it() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 200);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    for i in 0..100 {
        let user = format!("r{i}");
        let mut s = TcpStream::connect(("127.0.0.1", g.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let all = [
            purchase(&user),
            format_request(
                "GET",
                &format!("/v1/sales/{SALE}/purchases/{user}"),
                None,
                false,
            ),
            purchase(&user),
        ]
        .concat();
        s.write_all(all.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let answers: Vec<Resp> = (0..3)
            .map(|n| read_resp(&mut r).unwrap_or_else(|| panic!("{user}: answer {n}")))
            .collect();
        let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        assert_eq!(statuses, [202, 200, 409], "{user}: {answers:?}");
        let rid = answers[0].json()["reservation_id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(Some(rid.clone()), reservation_of(&redis, &user), "{user}");
        assert_eq!(answers[1].json()["reservation_id"], rid.as_str(), "{user}");
        assert_eq!(answers[2].error(), "already_purchased", "{user}");
        assert_eq!(answers[2].json()["reservation_id"], rid.as_str(), "{user}");
    }
    assert_eq!(counts(&redis, SALE), (100, 100, 100));
}

/// A client with the smallest receive buffer the kernel allows that
/// writes `users`' purchases from a thread of its own and reads nothing
/// until told.
fn silent_client(port: u16, users: Vec<String>) -> (TcpStream, std::thread::JoinHandle<()>) {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(2048).unwrap();
    s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for u in users {
            // The gateway may have closed a connection it gave up on.
            if w.write_all(purchase(&u).as_bytes()).is_err() {
                return;
            }
        }
    });
    (s, writer)
}

/// Waits until the stock of the sale has not moved for 500 ms (a silent
/// client's connection is stuck on its full socket) and returns it.
fn settled_stock(redis: &RedisServer) -> i64 {
    let mut con = redis.con();
    let stock_key = SaleKeys::new(SALE).stock();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last: i64 = con.get(&stock_key).unwrap();
    let mut since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now: i64 = con.get(&stock_key).unwrap();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= Duration::from_millis(500) {
            return now;
        }
        assert!(Instant::now() < deadline, "the stock never settled");
    }
}

#[test]
fn a_client_that_pipelines_purchases_and_never_reads_holds_up_no_one_else() {
    const STOCK: i64 = 1_000_000;
    const EACH: usize = 400;
    let redis = RedisServer::start();
    open_sale(&redis, SALE, STOCK as u64);
    // One Redis thread answers every handed-off purchase: if it waited on
    // a silent client, nobody would be answered.
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
            // One client address sends every purchase here.
            ("SECKILL_GATEWAY_ADDRESS_RATE", "0"),
            // A client socket is full after some 40 answers (the kernel's
            // autotuning would take up to 4 MiB of them).
            ("SECKILL_GATEWAY_SEND_BUFFER", "4096"),
            // Longer than a client's read timeout (30 s): a thread that
            // waited on a silent client would fail the others' reads.
            ("SECKILL_GATEWAY_WRITE_TIMEOUT", "60s"),
        ],
    );
    let mut silent = Vec::new();
    let mut bought = 0;
    // Each silent client stops the gateway's writes to it once its socket
    // is full; which thread meets the full socket first (its connection
    // thread, or the Redis thread that answers a handed-off purchase) is
    // up to the scheduler, so more clients are sent until the Redis
    // thread has met one (about one in two; 16 at most).
    for c in 0..16 {
        let users: Vec<String> = (0..EACH).map(|i| format!("s{c}-{i}")).collect();
        silent.push((silent_client(g.port, users.clone()), users));
        settled_stock(&redis);
        // Somebody else is served meanwhile, each purchase answered.
        let mut other = Client::connect(g.port);
        for i in 0..5 {
            let r = other.buy(SALE, &format!("o{c}-{i}"));
            assert_eq!(r.status, 202, "{:?}", r.body);
            bought += 1;
        }
        if slow_answers(g.port) > 0 {
            break;
        }
    }
    assert!(
        slow_answers(g.port) > 0,
        "no answer was ever left to a finisher thread: the test did not test it"
    );
    // Now every silent client reads: all its answers, in order.
    for ((s, writer), users) in silent {
        let mut r = BufReader::new(s);
        for (i, u) in users.iter().enumerate() {
            let a = read_resp(&mut r).unwrap_or_else(|| panic!("answer {i} of {u}"));
            assert_eq!(a.status, 202, "{u}: {:?}", a.body);
            assert_eq!(
                a.json()["reservation_id"].as_str(),
                reservation_of(&redis, u).as_deref(),
                "answer {i} is {u}'s"
            );
            bought += 1;
        }
        writer.join().unwrap();
    }
    assert_eq!(counts(&redis, SALE).0, STOCK - bought);
    assert_eq!(counts(&redis, SALE).1 as i64, bought);
    assert_eq!(get(g.port, "/healthz").status, 200);
}

/// The `seckill_gateway_purchases_total` count of `outcome`.
fn purchases_of(port: u16, outcome: &str) -> u64 {
    let m = get(port, "/metrics");
    let line = format!("seckill_gateway_purchases_total{{outcome=\"{outcome}\"}} ");
    m.body
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A connection to the gateway at `port` from 127.0.0.1:`local` (0: any
/// port), bound with `SO_REUSEADDR`; closing it resets it (`SO_LINGER`
/// 0), so no `TIME_WAIT` keeps its port from the next one.
fn from_local_port(port: u16, local: u16) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.set_linger(Some(Duration::ZERO)).unwrap();
    s.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], local)).into())
        .unwrap();
    s.connect(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into())
        .unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

/// A connection's state is keyed by the connection, not its peer address:
/// a connection whose purchase was handed off and is still undecided (its
/// Redis stopped) is reset, and a new connection from the same address and
/// port, served by the same connection thread (the pool's other idle
/// threads are kept busy), is not taken for it: its health check is
/// answered at once, while that purchase is still undecided (no purchase
/// answered `unavailable` yet), instead of waiting for its decision.
#[test]
fn a_new_connection_from_the_same_port_is_not_taken_for_the_one_before() {
    let redis = RedisServer::start();
    open_sale(&redis, SALE, 10);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_REDIS_TIMEOUT", "10s"),
            ("SECKILL_GATEWAY_ADDRESS_RATE", "0"),
        ],
    );
    // tiny_http keeps at least 4 connection threads (more after a burst,
    // for 5 s): 16 idle keep-alive connections hold every idle one, so
    // the next connection that ends leaves the only idle thread, and the
    // connection after it is served there.
    let _busy: Vec<Client> = (0..16)
        .map(|_| {
            let mut c = Client::connect(g.port);
            assert_eq!(c.send("GET", "/healthz", None).status, 200);
            c
        })
        .collect();
    // The sale's bucket count is read and remembered for a second: the
    // next purchase reaches its hand-off with no other Redis call.
    assert_eq!(buy(g.port, SALE, "warm").status, 202);
    let pid = redis.pid().expect("redis runs");
    signal(pid, "STOP");
    let mut first = from_local_port(g.port, 0);
    let local = first.local_addr().unwrap().port();
    first.write_all(purchase("held").as_bytes()).unwrap();
    // Let it be handed off, then reset its connection and let the
    // connection thread go back to the pool.
    std::thread::sleep(Duration::from_millis(300));
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    let second = from_local_port(g.port, local);
    let mut second = BufReader::new(second);
    second
        .get_mut()
        .write_all(format_request("GET", "/healthz", None, false).as_bytes())
        .unwrap();
    let r = read_resp(&mut second).expect("an answer");
    let undecided = purchases_of(g.port, "unavailable") == 0;
    signal(pid, "CONT");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        undecided,
        "the new connection's request waited for the purchase of the reset one"
    );
}
