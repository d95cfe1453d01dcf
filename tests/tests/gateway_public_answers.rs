//! Specifies the precedence of public answers over identity: a purchase of
//! a sold-out sale is answered 410 to anyone, without a signature check,
//! whatever token it carries (also across the memory's rechecks); a sale
//! known not to open yet is 403 `sale_not_started` the same way; only a
//! winner's retry (409 with its reservation id) waits for its token to be
//! verified, and a forged token naming a winner is 401, never its id.

use crate::support::gateway as gateway_support;

use gateway_support::{get, load_sale, open_sale, read_resp, Client, Gateway, Resp};
use seckill_tests::RedisServer;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A value of the gateway's `/metrics` page (0 when absent).
fn metric(port: u16, name: &str) -> u64 {
    let m = get(port, "/metrics");
    assert_eq!(m.status, 200, "/metrics");
    m.body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `token` with its signature changed: the same header and claims, a
/// signature no key made.
fn forged(token: &str) -> String {
    let (signed, sig) = token.rsplit_once('.').expect("a compact JWS");
    let flipped: String = sig
        .chars()
        .map(|c| if c == 'A' { 'B' } else { 'A' })
        .collect();
    format!("{signed}.{flipped}")
}

/// A purchase of `sale` with `{}` and `Authorization: Bearer token` on
/// the keep-alive connection `c`.
fn buy_with(c: &mut BufReader<TcpStream>, sale: u64, token: &str) -> Resp {
    let req = format!(
        "POST /v1/sales/{sale}/purchases HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\n\r\n{{}}"
    );
    c.get_mut().write_all(req.as_bytes()).expect("send");
    read_resp(c).expect("an answer")
}

fn connect(port: u16) -> BufReader<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    BufReader::new(s)
}

#[test]
fn forged_tokens_to_a_sold_out_sale_get_410_without_a_signature_check() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 1);
    let gw = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    let mut c = Client::connect(gw.port);
    let won = c.buy(1, "winner");
    assert_eq!(won.status, 202, "{won:?}");
    let rid = won.json()["reservation_id"].as_str().unwrap().to_string();
    assert_eq!(c.buy(1, "late").status, 410);
    // The sale's buyers are loaded once it is remembered sold out.
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(gw.port, "seckill_gateway_buyers_remembered") != 1 {
        assert!(Instant::now() < deadline, "the buyers were never loaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    let checks = metric(gw.port, "seckill_gateway_signature_checks_total");

    let tokens: Vec<String> = (0..10_000)
        .map(|i| forged(&seckill_tests::auth::token_for(&format!("crowd-{i}"))))
        .collect();
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = tokens
            .chunks(1250)
            .map(|part| {
                s.spawn(move || {
                    let mut c = connect(gw.port);
                    part.iter()
                        .map(|t| buy_with(&mut c, 1, t).status)
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a crowd thread"))
            .collect()
    });
    // Past the memory's recheck: made with no buyer, still 410.
    std::thread::sleep(Duration::from_millis(700));
    let mut c = connect(gw.port);
    for i in 0..10 {
        let t = forged(&seckill_tests::auth::token_for(&format!("after-{i}")));
        assert_eq!(buy_with(&mut c, 1, &t).status, 410);
    }
    assert_eq!(statuses.len(), 10_000);
    assert_eq!(statuses.iter().filter(|&&s| s == 410).count(), 10_000);
    assert_eq!(
        metric(gw.port, "seckill_gateway_signature_checks_total"),
        checks,
        "no signature was checked for a public answer"
    );

    // A forged token naming the winner: checked, refused, no id.
    let mut c = connect(gw.port);
    let r = buy_with(
        &mut c,
        1,
        &forged(&seckill_tests::auth::token_for("winner")),
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.error(), "invalid_token");
    assert!(!r.body.contains(&rid), "{r:?}");
    assert_eq!(
        metric(gw.port, "seckill_gateway_signature_checks_total"),
        checks + 1
    );
    // With its own valid token: 409 with its id.
    let r = buy_with(&mut c, 1, &seckill_tests::auth::token_for("winner"));
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.json()["reservation_id"], rid.as_str());
}

#[test]
fn forged_tokens_to_a_sale_not_yet_open_get_403_without_a_signature_check() {
    let redis = RedisServer::start();
    load_sale(&redis, 2, 10, 3_600_000, 600_000);
    let gw = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    let mut c = connect(gw.port);
    // A verified purchase reads the sale's window (with its bucket count).
    let first = buy_with(&mut c, 2, &seckill_tests::auth::token_for("early"));
    assert_eq!(
        (first.status, first.error()),
        (403, "sale_not_started".into())
    );
    let checks = metric(gw.port, "seckill_gateway_signature_checks_total");
    for i in 0..500 {
        let t = forged(&seckill_tests::auth::token_for(&format!("early-{i}")));
        let r = buy_with(&mut c, 2, &t);
        assert_eq!(
            (r.status, r.error()),
            (403, "sale_not_started".into()),
            "{r:?}"
        );
    }
    // Past the memory's second: the window is read again, with no buyer.
    std::thread::sleep(Duration::from_millis(1_300));
    for i in 0..10 {
        let t = forged(&seckill_tests::auth::token_for(&format!("late-{i}")));
        assert_eq!(buy_with(&mut c, 2, &t).status, 403);
    }
    assert_eq!(
        metric(gw.port, "seckill_gateway_signature_checks_total"),
        checks,
        "no signature was checked for a public answer"
    );
    assert_eq!(counts_of_stock(&redis, 2), 10);
}

/// The units left of sale `id` in Redis.
fn counts_of_stock(redis: &RedisServer, id: u64) -> i64 {
    gateway_support::counts(redis, id).0
}
