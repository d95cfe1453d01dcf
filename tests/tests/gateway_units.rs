//! Specifies purchases of several units through the gateway, over HTTP on
//! a real, private Redis: the body's `quantity`, the `Idempotency-Key`
//! header, each answer of the contract (202 again for a repeat, 410
//! `not_enough_stock`, 409 `limit_reached`, 422 `idempotency_key_reused`,
//! 400 `idempotency_key_required` and above the sale's limit per
//! purchase), a refusal that binds no key and which refusals count in the
//! buyer's share, the status read's `quantity` and list of reservations,
//! the units counted in `/metrics`, and a crowd buying a mix of
//! quantities with retries that sells the stock exactly in units.
//!
//! The sales' limits are written into their Redis meta after loading
//! (`max_per_buyer`, `max_per_purchase`), as `sale load` writes them.

use crate::support::gateway::{
    format_request, get, open_sale, open_units_sale, raw, Gateway, Resp,
};
use redis::Commands;
use seckill_common::allowance::Held;
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::RedisServer;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A purchase by `user` with the raw JSON `quantity` (none: no field) and
/// an `Idempotency-Key` (none: no header), on a new connection.
fn purchase(port: u16, sale: u64, user: &str, quantity: Option<&str>, key: Option<&str>) -> Resp {
    let body = match quantity {
        Some(q) => format!(r#"{{"user_id":"{user}","quantity":{q}}}"#),
        None => format!(r#"{{"user_id":"{user}"}}"#),
    };
    let req = format_request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        true,
    );
    let req = match key {
        Some(k) => req.replacen("\r\n", &format!("\r\nIdempotency-Key: {k}\r\n"), 1),
        None => req,
    };
    raw(port, req.as_bytes()).expect("an answer")
}

fn rid_of(r: &Resp) -> String {
    r.json()["reservation_id"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn each_answer_of_a_purchase_of_units() {
    let redis = RedisServer::start();
    open_units_sale(&redis, 1, 5, 4, 3);
    open_sale(&redis, 2, 5);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let p = g.port;
    for (q, detail) in [
        ("0", "quantity must be at least 1"),
        ("-1", "quantity must be at least 1"),
        ("1.5", "quantity must be a whole number"),
        (
            "\"2\"",
            "quantity must be an integer from 1 to 100, not a string",
        ),
        (
            "null",
            "quantity must be an integer from 1 to 100, not null",
        ),
        ("101", "quantity must be at most 100"),
    ] {
        let r = purchase(p, 1, "a", Some(q), Some("k1"));
        assert_eq!(
            (r.status, r.error()),
            (400, "invalid_request".into()),
            "{q}"
        );
        assert!(
            r.json()["detail"].as_str().unwrap().starts_with(detail),
            "{q}: {}",
            r.body
        );
    }
    let r = purchase(p, 1, "a", Some("2"), Some("bad key!"));
    assert_eq!((r.status, r.error()), (400, "invalid_request".into()));
    assert!(r.body.contains("Idempotency-Key"), "{}", r.body);
    // No key on a sale of several units per buyer, whatever the quantity.
    for q in [None, Some("1"), Some("2")] {
        let r = purchase(p, 1, "a", q, None);
        assert_eq!(
            (r.status, r.error()),
            (400, "idempotency_key_required".into()),
            "{q:?}"
        );
        assert!(r.body.contains("Idempotency-Key"), "{}", r.body);
    }
    let r = purchase(p, 1, "a", Some("4"), Some("k1"));
    assert_eq!((r.status, r.error()), (400, "invalid_request".into()));
    assert_eq!(r.json()["max_per_purchase"], 3);
    let first = purchase(p, 1, "a", Some("3"), Some("k1"));
    assert_eq!(first.status, 202, "{}", first.body);
    let rid = rid_of(&first);
    assert_eq!(rid, keyed_reservation_id(1, "a", "k1"));
    let again = purchase(p, 1, "a", Some("3"), Some("k1"));
    assert_eq!((again.status, rid_of(&again)), (202, rid.clone()));
    let r = purchase(p, 1, "a", Some("2"), Some("k1"));
    assert_eq!(
        (r.status, r.error()),
        (422, "idempotency_key_reused".into())
    );
    let r = purchase(p, 1, "a", Some("2"), Some("k2"));
    assert_eq!((r.status, r.error()), (409, "limit_reached".into()));
    assert_eq!(
        r.json()["reservations"],
        serde_json::json!([{ "reservation_id": rid, "quantity": 3 }])
    );
    let r = purchase(p, 1, "b", Some("3"), Some("k1"));
    assert_eq!((r.status, r.error()), (410, "not_enough_stock".into()));
    assert_eq!(r.json()["units_left"], 2);
    // Not sold out: a smaller purchase fits, at once.
    let r = purchase(p, 1, "b", Some("2"), Some("k2"));
    assert_eq!(r.status, 202, "{}", r.body);
    let r = purchase(p, 1, "c", Some("1"), Some("k1"));
    assert_eq!((r.status, r.error()), (410, "sold_out".into()));
    // After the sell-out, a repeat is still the first answer.
    let again = purchase(p, 1, "a", Some("3"), Some("k1"));
    assert_eq!((again.status, rid_of(&again)), (202, rid.clone()));
    let s = get(p, "/v1/sales/1/purchases/a");
    assert_eq!(s.status, 200);
    assert_eq!(
        (
            s.json()["reservation_id"].as_str(),
            s.json()["quantity"].as_u64()
        ),
        (Some(rid.as_str()), Some(3))
    );
    // A sale of one unit per buyer: one unit with or without a key, and
    // its limit per purchase is 1.
    let r = purchase(p, 2, "a", Some("2"), None);
    assert_eq!(
        (r.status, r.json()["max_per_purchase"].as_u64()),
        (400, Some(1))
    );
    let r = purchase(p, 2, "a", Some("2"), Some("k"));
    assert_eq!(
        (r.status, r.json()["max_per_purchase"].as_u64()),
        (400, Some(1))
    );
    let r = purchase(p, 2, "a", Some("1"), Some("k"));
    assert_eq!(r.status, 202, "{}", r.body);
    let one = rid_of(&r);
    let r = purchase(p, 2, "a", None, None);
    assert_eq!((r.status, rid_of(&r)), (409, one.clone()));
    let s = get(p, "/v1/sales/2/purchases/a");
    assert_eq!(s.json()["quantity"], 1);
    let k = SaleKeys::new(2);
    let stock: i64 = redis.con().get(k.stock()).unwrap();
    assert_eq!(stock, 4);
    // Three purchases answered 202 reserved took 3 + 2 + 1 units; the two
    // repeats of a's first took none and are `repeated`, apart from the
    // two 409s (`limit_reached`, sale 2's `already_purchased`).
    let m = get(p, "/metrics");
    let outcome = |o: &str| {
        sample(
            &m.body,
            &format!(r#"seckill_gateway_purchases_total{{outcome="{o}"}}"#),
        )
    };
    assert_eq!(
        (
            outcome("reserved"),
            sample(&m.body, "seckill_gateway_units_reserved_total"),
            outcome("repeated"),
            outcome("already_purchased")
        ),
        (Some(3), Some(6), Some(2), Some(2)),
        "{}",
        m.body
    );
}

/// The value of series `series` on a `/metrics` page.
fn sample(page: &str, series: &str) -> Option<u64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The status read of a buyer holding several reservations of a sale of
/// several units per buyer lists each (id, quantity, status, in the order
/// they were made) beside the latest's fields; a buyer of a sale of one
/// unit per buyer reads the same body as before, without the list.
#[test]
fn the_status_read_lists_every_reservation_of_a_buyer() {
    let redis = RedisServer::start();
    open_units_sale(&redis, 1, 10, 4, 3);
    open_sale(&redis, 2, 5);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let p = g.port;
    let r1 = purchase(p, 1, "a", Some("1"), Some("k1"));
    let r2 = purchase(p, 1, "a", Some("2"), Some("k2"));
    assert_eq!((r1.status, r2.status), (202, 202));
    let (r1, r2) = (rid_of(&r1), rid_of(&r2));
    let k = SaleKeys::new(1);
    let _: () = redis.con().hset(k.status(), &r1, "confirmed").unwrap();
    let s = get(p, "/v1/sales/1/purchases/a");
    assert_eq!(s.status, 200);
    assert_eq!(
        s.json(),
        serde_json::json!({
            "reservation_id": r2,
            "status": "queued",
            "quantity": 2,
            "reservations": [
                {"reservation_id": r1, "quantity": 1, "status": "confirmed"},
                {"reservation_id": r2, "quantity": 2, "status": "queued"}
            ]
        })
    );
    let r = purchase(p, 2, "a", None, None);
    assert_eq!(r.status, 202);
    let s = get(p, "/v1/sales/2/purchases/a");
    assert_eq!(
        s.json(),
        serde_json::json!({"reservation_id": rid_of(&r), "status": "queued", "quantity": 1})
    );
}

/// A refused purchase takes nothing and binds no key: the key a 400
/// (above the limit per purchase), a 410 `not_enough_stock` or a 409
/// `limit_reached` refused buys another quantity after. The answers
/// decided once the buyer is verified (400 `idempotency_key_required`,
/// 422) count in the buyer's share as a 202 does; a malformed body or
/// `Idempotency-Key` header, refused before, does not (docs/openapi.yaml).
#[test]
fn a_refused_purchase_binds_no_key_and_counts_in_the_buyers_share() {
    let redis = RedisServer::start();
    open_units_sale(&redis, 1, 5, 4, 3);
    open_units_sale(&redis, 2, 5, 4, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let p = g.port;
    let answer = |r: &Resp| (r.status, r.error());
    let r = purchase(p, 1, "a", Some("4"), Some("k1"));
    assert_eq!(answer(&r), (400, "invalid_request".into()));
    assert_eq!(purchase(p, 1, "b", Some("3"), Some("kb")).status, 202);
    let r = purchase(p, 1, "a", Some("3"), Some("k1"));
    assert_eq!(answer(&r), (410, "not_enough_stock".into()));
    let r = purchase(p, 1, "a", Some("2"), Some("k1"));
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(rid_of(&r), keyed_reservation_id(1, "a", "k1"));
    let r = purchase(p, 1, "b", Some("2"), Some("kb2"));
    assert_eq!(answer(&r), (409, "limit_reached".into()));
    // Not 422: `kb2` made no reservation. The stock is gone.
    let r = purchase(p, 1, "b", Some("1"), Some("kb2"));
    assert_eq!(answer(&r), (410, "sold_out".into()));

    let (burst, rate, tries) = (2, 1, 6);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "1"),
            ("SECKILL_GATEWAY_BUYER_BURST", "2"),
        ],
    );
    let p = g.port;
    for _ in 0..tries {
        let r = purchase(p, 2, "d", Some("0"), Some("kd"));
        assert_eq!(answer(&r), (400, "invalid_request".into()));
        let r = purchase(p, 2, "d", Some("1"), Some("bad key!"));
        assert_eq!(answer(&r), (400, "invalid_request".into()));
    }
    let r = purchase(p, 2, "d", Some("1"), Some("kd"));
    assert_eq!(
        r.status, 202,
        "the malformed requests took no share: {}",
        r.body
    );
    let started = std::time::Instant::now();
    let mut refused = 0;
    for _ in 0..tries {
        let r = purchase(p, 2, "c", Some("1"), None);
        match answer(&r) {
            (400, e) if e == "idempotency_key_required" => refused += 1,
            (429, e) if e == "too_many_requests" => {}
            other => panic!("{other:?}: {}", r.body),
        }
    }
    // At most B + R × ⌈elapsed⌉ of them were served; the rest were 429.
    let share = burst + rate * started.elapsed().as_secs_f64().ceil() as u64;
    assert!(refused >= burst && refused <= share, "{refused} of {tries}");
}

/// What one buyer was answered.
#[derive(Default)]
struct Answers {
    /// (key, quantity, status, reservation id) of every attempt, in order.
    tries: Vec<(String, u32, u16, String)>,
}

/// Stock 100, at most 4 per buyer and 3 per purchase, 400 buyers sending
/// 1-3 units each: half send their purchase twice with the same key, a
/// quarter buy again with a new key. Units sold are exactly 100 (the
/// quantities of the 202s, one per reservation id, and the flow records
/// and queued messages), no buyer holds more than 4, every repeat of a
/// 202 is answered 202 with the first id, and the stock (polled as fast
/// as Redis answers) is never below 0.
#[test]
fn a_crowd_buying_one_to_three_units_sells_exactly_the_stock() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let sale = 7;
    open_units_sale(&redis, sale, 100, 4, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let port = g.port;
    let stop = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let poller = {
        let (stop, lowest) = (stop.clone(), lowest.clone());
        let mut con = redis.con();
        thread::spawn(move || {
            let key = SaleKeys::new(sale).stock();
            let mut polls = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let s: i64 = con.get(&key).unwrap();
                lowest.fetch_min(s, Ordering::SeqCst);
                polls += 1;
            }
            polls
        })
    };
    let buyers = 400u32;
    let answers: Arc<Mutex<HashMap<String, Answers>>> = Arc::default();
    let threads: Vec<_> = (0..16u32)
        .map(|t| {
            let answers = answers.clone();
            thread::spawn(move || {
                let mut seed = 0x9e37_79b9_u64 ^ u64::from(t);
                let mut next = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                for b in (t..buyers).step_by(16) {
                    let user = format!("u{b}");
                    let mut mine = Answers::default();
                    let mut attempt = |key: &str, q: u32| {
                        let r = purchase(port, sale, &user, Some(&q.to_string()), Some(key));
                        mine.tries.push((key.into(), q, r.status, rid_of(&r)));
                    };
                    let q = 1 + next(3) as u32;
                    attempt("first", q);
                    if b % 2 == 0 {
                        attempt("first", q);
                    }
                    if b % 4 == 1 {
                        attempt("second", 1 + next(3) as u32);
                    }
                    answers.lock().unwrap().insert(user, mine);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    let polls = poller.join().unwrap();
    assert!(polls > 0);
    assert_eq!(
        lowest.load(Ordering::SeqCst).min(0),
        0,
        "stock never below 0"
    );
    let answers = answers.lock().unwrap();
    assert_eq!(answers.len(), buyers as usize);
    let mut sold: HashMap<String, (String, u32)> = HashMap::new();
    let mut repeats = 0;
    for (user, a) in answers.iter() {
        let mut firsts: HashMap<&str, (u16, &str)> = HashMap::new();
        for (key, q, status, rid) in &a.tries {
            assert!(matches!(status, 202 | 409 | 410), "{user}: {status}");
            if *status == 202 {
                assert_eq!(rid, &keyed_reservation_id(sale, user, key));
                sold.insert(rid.clone(), (user.clone(), *q));
            }
            match firsts.get(key.as_str()) {
                Some((202, first)) => {
                    repeats += 1;
                    assert_eq!((*status, rid.as_str()), (202, *first), "{user} {key}");
                }
                Some(_) => {}
                None => {
                    firsts.insert(key, (*status, rid));
                }
            }
        }
    }
    assert!(repeats > 0);
    let units: u32 = sold.values().map(|(_, q)| q).sum();
    assert_eq!(units, 100, "units sold");
    let mut per_buyer: HashMap<&str, u32> = HashMap::new();
    for (user, q) in sold.values() {
        *per_buyer.entry(user).or_default() += q;
    }
    assert!(per_buyer.values().all(|&u| u <= 4), "{per_buyer:?}");
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(stock, 0);
    let flows: HashMap<String, String> = con.hgetall(k.flow()).unwrap();
    assert_eq!(
        flows.keys().cloned().collect::<HashSet<_>>(),
        sold.keys().cloned().collect()
    );
    let flow_units: u32 = flows
        .values()
        .map(|f| OrderMessage::parse(f.as_bytes()).unwrap().quantity)
        .sum();
    let queued: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let queued_units: u32 = queued
        .iter()
        .map(|m| OrderMessage::parse(m.as_bytes()).unwrap().quantity)
        .sum();
    assert_eq!(
        (flow_units, queued.len(), queued_units),
        (100, sold.len(), 100)
    );
    let lists: HashMap<String, String> = con.hgetall(k.buyers()).unwrap();
    for (user, list) in &lists {
        let h = Held::parse(list).unwrap();
        assert_eq!(u64::from(per_buyer[user.as_str()]), h.units(), "{user}");
    }
    assert_eq!(lists.len(), per_buyer.len());
}
