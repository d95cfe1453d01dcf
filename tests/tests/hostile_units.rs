//! Attacks purchases of several units through the real gateway on a
//! private Redis: the same `Idempotency-Key` sent from many connections at
//! once (with the same and with different quantities), one buyer's
//! interleaved purchases under distinct keys against the limit per buyer,
//! and malformed `Idempotency-Key` headers, each checked against Redis's
//! exact state afterwards (one reservation per key, units ≤ limit, bad
//! input a 4xx with nothing changed).

use crate::support::gateway::{format_request, open_sale, raw, snapshot, Gateway, Resp};
use redis::Commands;
use seckill_common::allowance::{Held, MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::RedisServer;
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;

/// An open sale `id` of `stock` units, limits `l` per buyer, `q` per purchase.
fn units_sale(redis: &RedisServer, id: u64, stock: u64, l: u32, q: u32) {
    open_sale(redis, id, stock);
    let _: () = redis
        .con()
        .hset_multiple(
            SaleKeys::new(id).meta(),
            &[(MAX_PER_BUYER_FIELD, l), (MAX_PER_PURCHASE_FIELD, q)],
        )
        .unwrap();
}

/// A purchase of `q` units by `user` with the raw header lines `headers`
/// (each without its CRLF), on a new connection.
fn purchase(port: u16, sale: u64, user: &str, q: u32, headers: &[&str]) -> Option<Resp> {
    let body = format!(r#"{{"user_id":"{user}","quantity":{q}}}"#);
    let mut req = format_request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        true,
    );
    for h in headers {
        req = req.replacen("\r\n", &format!("\r\n{h}\r\n"), 1);
    }
    raw(port, req.as_bytes())
}

/// `(units in flow records, flow records, queued messages, stock)` of `sale`.
fn state(redis: &RedisServer, sale: u64) -> (u32, usize, usize, i64) {
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    let flows: HashMap<String, String> = con.hgetall(k.flow()).unwrap();
    let units = flows
        .values()
        .map(|f| OrderMessage::parse(f.as_bytes()).unwrap().quantity)
        .sum();
    let queued: usize = con.llen(k.queue()).unwrap();
    let stock: i64 = con.get(k.stock()).unwrap();
    (units, flows.len(), queued, stock)
}

/// `n` threads released together, each sending one purchase of
/// `quantity(i)` units by `user` under key `key(i)`; their answers.
fn at_once(
    port: u16,
    sale: u64,
    user: &'static str,
    n: u32,
    key: fn(u32) -> String,
    quantity: fn(u32) -> u32,
) -> Vec<(u32, String, u16, String)> {
    let gate = Arc::new(Barrier::new(n as usize));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let gate = gate.clone();
            thread::spawn(move || {
                let (k, q) = (key(i), quantity(i));
                let h = format!("Idempotency-Key: {k}");
                gate.wait();
                let r = purchase(port, sale, user, q, &[&h]).expect("an answer");
                let rid = r.json()["reservation_id"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                (q, k, r.status, rid)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// 48 connections send the same key with 2 units at once: every answer
/// is 202 with the one keyed reservation id, and Redis holds exactly one
/// reservation of 2 units (stock 20 → 18, one queued message).
#[test]
fn one_key_from_many_connections_at_once_is_one_reservation() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    units_sale(&redis, 1, 20, 6, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let rid = keyed_reservation_id(1, "alice", "same-key");
    let answers = at_once(g.port, 1, "alice", 48, |_| "same-key".into(), |_| 2);
    for (_, _, status, got) in &answers {
        assert_eq!((*status, got.as_str()), (202, rid.as_str()));
    }
    assert_eq!(state(&redis, 1), (2, 1, 1, 18));
    let held: String = redis
        .con()
        .hget(SaleKeys::new(1).buyers(), "alice")
        .unwrap();
    assert_eq!(held, format!("{rid}:2"));
}

/// 45 connections send one key with quantities 1, 2 and 3 at once:
/// exactly one reservation is made; the answers of its quantity are 202
/// with its id, every other answer is 422 `idempotency_key_reused`, and
/// the stock went down by that quantity only.
#[test]
fn one_key_with_racing_quantities_reserves_once() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    units_sale(&redis, 2, 20, 6, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let rid = keyed_reservation_id(2, "bob", "racing");
    let answers = at_once(g.port, 2, "bob", 45, |_| "racing".into(), |i| 1 + i % 3);
    let (units, flows, queued, stock) = state(&redis, 2);
    assert_eq!((flows, queued, stock), (1, 1, 20 - i64::from(units)));
    for (q, _, status, got) in &answers {
        if *q == units {
            assert_eq!((*status, got.as_str()), (202, rid.as_str()), "{q}");
        } else {
            assert_eq!(*status, 422, "{q}");
        }
    }
}

/// One buyer (at most 5 units, 3 per purchase) sends 40 purchases under
/// 40 distinct keys at once: the units answered 202 never pass 5, equal
/// the buyer's Redis list and the flow records, and stock + units = 50.
#[test]
fn interleaved_keys_of_one_buyer_stay_within_the_limit() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    units_sale(&redis, 3, 50, 5, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let answers = at_once(g.port, 3, "carol", 40, |i| format!("k{i}"), |i| 1 + i % 3);
    let mut won = 0;
    for (q, k, status, got) in &answers {
        match status {
            202 => {
                assert_eq!(got, &keyed_reservation_id(3, "carol", k));
                won += q;
            }
            409 => {}
            other => panic!("{k}: {other}"),
        }
    }
    assert!(won <= 5 && won >= 3, "{won}");
    let (units, flows, _, stock) = state(&redis, 3);
    assert_eq!((units, stock), (won, 50 - i64::from(won)));
    let held: String = redis
        .con()
        .hget(SaleKeys::new(3).buyers(), "carol")
        .unwrap();
    let held = Held::parse(&held).unwrap();
    assert_eq!((held.units(), flows), (u64::from(won), flows));
}

/// Malformed `Idempotency-Key` headers are a 400 and change nothing: an
/// empty value, 65 characters, a space inside, non-ASCII bytes, two
/// headers (even with equal values), a forbidden character. The longest
/// key (64 characters) and a key with surrounding spaces are served.
#[test]
fn every_malformed_key_header_is_a_400_and_changes_nothing() {
    let redis = RedisServer::start();
    units_sale(&redis, 4, 10, 4, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let before = snapshot(&redis, 4);
    let long = format!("Idempotency-Key: {}", "a".repeat(65));
    let cases: Vec<Vec<String>> = vec![
        vec!["Idempotency-Key:".into()],
        vec!["Idempotency-Key: ".into()],
        vec![long],
        vec!["Idempotency-Key: a b".into()],
        vec!["Idempotency-Key: k\u{e9}y".into()],
        vec!["Idempotency-Key: a/b".into()],
        vec!["Idempotency-Key: a".into(), "Idempotency-Key: a".into()],
        vec!["Idempotency-Key: a".into(), "idempotency-key: b".into()],
    ];
    for headers in &cases {
        let hs: Vec<&str> = headers.iter().map(String::as_str).collect();
        let r = purchase(g.port, 4, "dave", 2, &hs).expect("an answer");
        assert_eq!(r.status, 400, "{headers:?}: {}", r.body);
        assert_eq!(snapshot(&redis, 4), before, "{headers:?}");
    }
    let max = "b".repeat(64);
    let h = format!("Idempotency-Key: {max}");
    let r = purchase(g.port, 4, "dave", 2, &[&h]).expect("an answer");
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        r.json()["reservation_id"],
        keyed_reservation_id(4, "dave", &max)
    );
    let r = purchase(g.port, 4, "dave", 1, &["Idempotency-Key:   k2   "]).expect("an answer");
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        r.json()["reservation_id"],
        keyed_reservation_id(4, "dave", "k2")
    );
    assert_eq!(state(&redis, 4), (3, 2, 2, 7));
}

/// `DELETE .../purchases/me` of a buyer holding two reservations of a
/// sale of several units per buyer (2 units pending payment, then 1 paid,
/// as the worker marks them): the pending one is queued for cancellation
/// under its own reservation id, one cancel message naming it; once it
/// is cancelled, the buyer's next DELETE names the paid one as not
/// cancellable. The buyer's mark (`RID:2,RID:1`) is never answered as a
/// reservation id.
#[test]
fn a_buyer_of_several_reservations_cancels_the_pending_one() {
    use crate::support::lifecycle_http::{gateway, me};
    let redis = RedisServer::start();
    units_sale(&redis, 5, 10, 4, 3);
    let g = gateway(&redis);
    let first = purchase(g.port, 5, "erin", 2, &["Idempotency-Key: a"]).expect("an answer");
    let second = purchase(g.port, 5, "erin", 1, &["Idempotency-Key: b"]).expect("an answer");
    assert_eq!((first.status, second.status), (202, 202));
    let (pending, paid) = (
        keyed_reservation_id(5, "erin", "a"),
        keyed_reservation_id(5, "erin", "b"),
    );
    let k = SaleKeys::new(5);
    let _: () = redis
        .con()
        .hset_multiple(
            k.status(),
            &[(&pending, "pending_payment"), (&paid, "paid")],
        )
        .unwrap();
    let r = me(g.port, "DELETE", 5, Some("erin"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (202, Some(pending.as_str())),
        "{}",
        r.body
    );
    assert_eq!(r.json()["cancellation"], "queued");
    let queued: Vec<String> = redis
        .con()
        .lrange(seckill_common::payment::QUEUE, 0, -1)
        .unwrap();
    assert_eq!(queued.len(), 1, "{queued:?}");
    let m: serde_json::Value = serde_json::from_str(&queued[0]).unwrap();
    assert_eq!(
        (m["reservation_id"].as_str(), m["user_id"].as_str()),
        (Some(pending.as_str()), Some("erin"))
    );
    let _: () = redis.con().hset(k.status(), &pending, "cancelled").unwrap();
    let r = me(g.port, "DELETE", 5, Some("erin"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (409, Some(paid.as_str())),
        "{}",
        r.body
    );
    assert_eq!(r.json()["status"], "paid");
}

/// A buyer's user id may be any token, 32 hex digits included, the shape
/// of a reservation id. In a sale of several units per buyer, where an
/// order's live key is its reservation id, a buyer named like another
/// buyer's reservation cancels only their own order: with the victim's
/// 2-unit order and the look-alike buyer's 1-unit order both pending,
/// the look-alike's cancellation (as the gateway queues it) cancels the
/// look-alike's order and leaves the victim's pending.
#[test]
fn a_buyer_named_like_another_reservation_cancels_only_their_own() {
    use crate::support::quantity::{self, reserve, Terms};
    use crate::support::worker::{wait_orders, Opts, WorkerProc};
    use mysql::prelude::Queryable;
    use seckill_common::payment::{enqueue_cancel, CancelMessage, KIND_CANCEL};
    use seckill_tests::{TempDir, TestDb};
    use std::time::Duration;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms {
        stock: 10,
        per_buyer: 4,
        per_purchase: 3,
        window: Some("1h"),
        rebuy: false,
    };
    let sale = quantity::create(&redis, &db, &file, &terms);
    let victim = reserve(&redis, sale, "victim", "k", 2);
    let own = reserve(&redis, sale, &victim, "k", 1);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, Duration::from_secs(120));
    let m = CancelMessage {
        v: 1,
        kind: KIND_CANCEL.into(),
        sale_id: sale,
        user_id: victim.clone(),
        reservation_id: own.clone(),
        received_ms: seckill_common::now_ms(),
    };
    enqueue_cancel(&mut redis.con(), &m).unwrap();
    let cancelled = || {
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled'"),
        )
    };
    seckill_tests::wait_until(Duration::from_secs(120), "one cancellation", || {
        cancelled() == 1
    });
    let statuses: Vec<(String, String)> = db
        .conn()
        .exec(
            "SELECT user_id, status FROM orders WHERE sale_id = ? ORDER BY user_id = 'victim'",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        statuses,
        [
            (victim.clone(), "cancelled".to_string()),
            ("victim".to_string(), "pending_payment".to_string())
        ]
    );
}
