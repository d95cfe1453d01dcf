//! Specifies the reservation script on a real, private Redis: exact counts
//! under concurrency, one purchase per user, and the sale window.

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{reserve, ReserveError, ReserveOutcome};
use seckill_common::sale::{load_into_redis, Sale};
use seckill_tests::{sale_snapshot, RedisServer};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;

fn sale(id: u64, stock: u64, starts_in_ms: i64, len_ms: u64) -> Sale {
    seckill_tests::test_sale(id, stock, starts_in_ms, len_ms)
}

#[test]
fn stock_100_and_1000_users_on_50_threads_reserve_exactly_100() {
    let redis = RedisServer::start();
    let id = 7;
    assert!(load_into_redis(&mut redis.con(), &sale(id, 100, -1000, 600_000), 0).unwrap());
    let k = SaleKeys::new(id);

    // A poller that records the lowest stock it ever sees while buyers run.
    let done = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let poller = {
        let (done, lowest, mut con, key) = (done.clone(), lowest.clone(), redis.con(), k.stock());
        thread::spawn(move || {
            let mut polls = 0u64;
            while !done.load(Ordering::SeqCst) {
                let v: i64 = con.get(&key).unwrap();
                lowest.fetch_min(v, Ordering::SeqCst);
                polls += 1;
            }
            polls
        })
    };

    let handles: Vec<_> = (0..50)
        .map(|t| {
            let mut con = redis.con();
            thread::spawn(move || {
                (0..20)
                    .map(|i| reserve(&mut con, id, &format!("user-{t}-{i}")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let outcomes: Vec<ReserveOutcome> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    done.store(true, Ordering::SeqCst);
    let polls = poller.join().unwrap();

    let ids: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::Reserved(r) => Some(r),
            _ => None,
        })
        .collect();
    let sold_out = outcomes
        .iter()
        .filter(|o| **o == ReserveOutcome::SoldOut)
        .count();
    assert_eq!(outcomes.len(), 1000);
    assert_eq!(ids.len(), 100);
    assert_eq!(sold_out, 900);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        100,
        "a reservation id repeated"
    );

    let mut con = redis.con();
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(stock, 0);
    assert!(polls > 0);
    assert!(lowest.load(Ordering::SeqCst) >= 0, "stock seen below zero");
    let flows: usize = con.hlen(k.flow()).unwrap();
    let queued: usize = con.llen(k.queue()).unwrap();
    let buyers: usize = con.hlen(k.buyers()).unwrap();
    assert_eq!((flows, queued, buyers), (100, 100, 100));

    // Each queued message is the flow record of one reserved id.
    let msgs: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let mut seen = HashSet::new();
    for m in &msgs {
        let parsed = seckill_common::message::OrderMessage::parse(m.as_bytes()).unwrap();
        assert_eq!(parsed.sale_id, id);
        let flow: String = con.hget(k.flow(), &parsed.reservation_id).unwrap();
        assert_eq!(&flow, m);
        let status: String = con.hget(k.status(), &parsed.reservation_id).unwrap();
        assert_eq!(status, "queued");
        seen.insert(parsed.reservation_id);
    }
    assert_eq!(seen.len(), 100);
}

#[test]
fn one_user_50_times_at_once_reserves_exactly_once() {
    let redis = RedisServer::start();
    let id = 8;
    load_into_redis(&mut redis.con(), &sale(id, 10, -1000, 600_000), 0).unwrap();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let mut con = redis.con();
            thread::spawn(move || reserve(&mut con, id, "alice").unwrap())
        })
        .collect();
    let outcomes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let reserved: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::Reserved(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    let again: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::AlreadyPurchased(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reserved.len(), 1);
    assert_eq!(again.len(), 49);
    assert!(again.iter().all(|r| *r == reserved[0]));
    let stock: i64 = redis.con().get(SaleKeys::new(id).stock()).unwrap();
    assert_eq!(stock, 9);
}

#[test]
fn window_and_unknown_sale_are_refused_without_any_change() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(1, 5, 60_000, 60_000), 0).unwrap(); // opens in 60 s
    load_into_redis(&mut con, &sale(2, 5, -120_000, 60_000), 0).unwrap(); // ended 60 s ago
    let before: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&i| sale_snapshot(&mut con, i))
        .collect();

    assert_eq!(
        reserve(&mut con, 1, "bob").unwrap(),
        ReserveOutcome::NotStarted
    );
    assert_eq!(reserve(&mut con, 2, "bob").unwrap(), ReserveOutcome::Ended);
    assert_eq!(
        reserve(&mut con, 3, "bob").unwrap(),
        ReserveOutcome::UnknownSale
    );
    assert!(matches!(
        reserve(&mut con, 1, "bad user"),
        Err(ReserveError::InvalidUser)
    ));
    assert!(matches!(
        reserve(&mut con, 1, ""),
        Err(ReserveError::InvalidUser)
    ));

    let after: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&i| sale_snapshot(&mut con, i))
        .collect();
    assert_eq!(before, after);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("seckill:{sale:3}:*")
        .query(&mut con)
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn script_refuses_a_bad_user_id_even_when_called_directly() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(4, 5, -1000, 60_000), 0).unwrap();
    let before = sale_snapshot(&mut con, 4);
    let rid = seckill_common::ids::new_reservation_id();
    let r: redis::RedisResult<redis::Value> =
        seckill_common::reservation::prepare(4, "a\"b", &rid).invoke(&mut con);
    let e = r.unwrap_err();
    assert!(seckill_common::is_error_reply(&e), "{e}");
    assert!(e.to_string().contains("invalid user id"), "{e}");
    assert_eq!(before, sale_snapshot(&mut con, 4));
}

#[test]
fn script_is_reloaded_after_script_flush() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(5, 5, -1000, 60_000), 0).unwrap();
    assert!(matches!(
        reserve(&mut con, 5, "u1").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(matches!(
        reserve(&mut con, 5, "u2").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    let stock: i64 = con.get(SaleKeys::new(5).stock()).unwrap();
    assert_eq!(stock, 3);
}
