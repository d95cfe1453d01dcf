//! Specifies the precedence of public answers over identity: a purchase of
//! a sold-out sale is answered 410 to anyone, without a signature check,
//! whatever token it carries (also across the memory's rechecks); a sale
//! known not to open yet is 403 `sale_not_started` the same way; only a
//! winner's retry (409 with its reservation id) waits for its token to be
//! verified, and a forged token naming a winner is 401, never its id. A
//! sale split over buckets answers its sold-out crowd the same way, and a
//! paused sale is 503 `sale_paused` to anyone without a signature check,
//! while `sale resume` still takes effect within a second.

use crate::support::gateway as gateway_support;

use gateway_support::{get, load_sale, open_sale, read_resp, Client, Gateway, Resp};
use seckill_tests::{RedisServer, TempDir, TestDb};
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

/// `n` purchases of `sale`, each with a distinct forged token (users
/// `PREFIX-i`), over 8 keep-alive connections at once: their statuses.
fn forged_crowd(port: u16, sale: u64, prefix: &str, n: usize) -> Vec<u16> {
    let tokens: Vec<String> = (0..n)
        .map(|i| forged(&seckill_tests::auth::token_for(&format!("{prefix}-{i}"))))
        .collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = tokens
            .chunks(n.div_ceil(8))
            .map(|part| {
                s.spawn(move || {
                    let mut c = connect(port);
                    part.iter()
                        .map(|t| buy_with(&mut c, sale, t).status)
                        .collect::<Vec<u16>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a crowd thread"))
            .collect()
    })
}

#[test]
fn forged_tokens_to_a_sold_out_split_sale_get_410_without_a_signature_check() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    // As `sale create --shards 3`: MySQL's sale, loaded over 3 buckets.
    let id = seckill_tests::create_split_sale(&db, &redis, 3, -1000, 3_600_000, 3);
    let gw = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    let mut c = connect(gw.port);
    for user in ["w0", "w1", "w2"] {
        let r = buy_with(&mut c, id, &seckill_tests::auth::token_for(user));
        assert_eq!(r.status, 202, "{user}: {r:?}");
    }
    // The pull finds every bucket empty: sold out, remembered.
    let late = buy_with(&mut c, id, &seckill_tests::auth::token_for("late"));
    assert_eq!(late.status, 410, "{late:?}");
    let checks = metric(gw.port, "seckill_gateway_signature_checks_total");

    let statuses = forged_crowd(gw.port, id, "crowd", 10_000);
    // Past the memory's recheck: every bucket read with no buyer, still 410.
    std::thread::sleep(Duration::from_millis(700));
    for i in 0..10 {
        let t = forged(&seckill_tests::auth::token_for(&format!("after-{i}")));
        assert_eq!(buy_with(&mut c, id, &t).status, 410);
    }
    assert_eq!(statuses.len(), 10_000);
    assert_eq!(statuses.iter().filter(|&&s| s == 410).count(), 10_000);
    assert_eq!(
        metric(gw.port, "seckill_gateway_signature_checks_total"),
        checks,
        "no signature was checked for a public answer"
    );
    // A winner's retry is still verified: 409 with its id.
    let r = buy_with(&mut c, id, &seckill_tests::auth::token_for("w1"));
    assert_eq!(r.status, 409, "{r:?}");
}

#[test]
fn forged_tokens_to_a_paused_sale_get_503_without_a_signature_check_until_resume() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let id = seckill_tests::create_sale(&db, &redis, 5, -1000, 3_600_000);
    let s = id.to_string();
    let gw = Gateway::start(&redis, &[("SECKILL_GATEWAY_ADDRESS_RATE", "0")]);
    let op = |args: &[&str]| {
        let (code, out) = seckill_tests::reconciler(&redis, &db, &review, args);
        assert_eq!(code, 0, "{args:?}: {out}");
    };
    op(&["sale", "pause", &s, "--reason", "fraud check", "--by", "op"]);
    let mut c = connect(gw.port);
    // A verified purchase hears the pause from the script.
    let first = buy_with(&mut c, id, &seckill_tests::auth::token_for("early"));
    assert_eq!((first.status, first.error()), (503, "sale_paused".into()));
    let checks = metric(gw.port, "seckill_gateway_signature_checks_total");

    let statuses = forged_crowd(gw.port, id, "crowd", 2_000);
    assert_eq!(statuses.iter().filter(|&&s| s == 503).count(), 2_000);
    // Past the pause memory's half second: read again with no buyer.
    std::thread::sleep(Duration::from_millis(700));
    for i in 0..10 {
        let t = forged(&seckill_tests::auth::token_for(&format!("later-{i}")));
        let r = buy_with(&mut c, id, &t);
        assert_eq!((r.status, r.error()), (503, "sale_paused".into()), "{r:?}");
        assert_eq!(r.header("Retry-After"), Some("1"));
    }
    assert_eq!(
        metric(gw.port, "seckill_gateway_signature_checks_total"),
        checks,
        "no signature was checked for a public answer"
    );
    assert_eq!(counts_of_stock(&redis, id), 5);

    // `sale resume` promises purchases again within a second.
    op(&["sale", "resume", &s, "--by", "op"]);
    std::thread::sleep(Duration::from_secs(1));
    let r = buy_with(&mut c, id, &seckill_tests::auth::token_for("buyer"));
    assert_eq!(r.status, 202, "{r:?}");
    let t = forged(&seckill_tests::auth::token_for("forger"));
    assert_eq!(buy_with(&mut c, id, &t).status, 401);
}
