//! Specifies that every script that writes takes effect whole or changes
//! nothing (docs/reliability.md §2): with any key it writes holding the wrong type (or
//! a counter that is not an integer), a purchase is answered 503 and every
//! key is left byte for byte as it was; once the key is fixed, the same user
//! buys and exactly one order is made. The release, load and worker's take
//! scripts refuse the same way.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{buy, Gateway};
use seckill_common::keys::{SaleKeys, SALES};
use seckill_common::release::{release, ReleaseError};
use seckill_tests::{create_sale, test_sale, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

/// The six keys the reservation script reads or writes, in its order.
fn purchase_keys(k: SaleKeys) -> Vec<String> {
    vec![
        k.meta(),
        k.stock(),
        k.buyers(),
        k.flow(),
        k.status(),
        k.queue(),
    ]
}

/// `DUMP` of every key a purchase touches (any type; `None`: absent).
fn dump(con: &mut redis::Connection, keys: &[String]) -> Vec<Option<Vec<u8>>> {
    keys.iter()
        .map(|k| redis::cmd("DUMP").arg(k).query(con).unwrap())
        .collect()
}

fn restore(con: &mut redis::Connection, key: &str, was: &Option<Vec<u8>>) {
    let _: () = redis::cmd("DEL").arg(key).query(con).unwrap();
    if let Some(bytes) = was {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(bytes.as_slice())
            .query(con)
            .unwrap();
    }
}

#[test]
fn a_purchase_with_any_written_key_of_the_wrong_type_changes_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    // The same buyer retries once per key: no per-buyer limit.
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let k = SaleKeys::new(sale);
    let keys = purchase_keys(k);
    assert_eq!(buy(g.port, sale, "first").status, 202);
    let mut con = redis.con();
    // (key, how to break it): a wrong type for each, and counters that are
    // not integers.
    let breaks: Vec<(String, Vec<redis::Cmd>)> = vec![
        (k.meta(), vec![redis::Cmd::set(k.meta(), "x")]),
        (k.stock(), vec![redis::Cmd::hset(k.stock(), "f", "1")]),
        (k.stock(), vec![redis::Cmd::set(k.stock(), "many")]),
        (k.stock(), vec![redis::Cmd::set(k.stock(), "1.5")]),
        (k.buyers(), vec![redis::Cmd::set(k.buyers(), "x")]),
        (k.flow(), vec![redis::Cmd::set(k.flow(), "x")]),
        (k.status(), vec![redis::Cmd::rpush(k.status(), "x")]),
        (k.queue(), vec![redis::Cmd::set(k.queue(), "x")]),
        (k.queue(), vec![redis::Cmd::hset(k.queue(), "f", "x")]),
    ];
    for (key, cmds) in &breaks {
        let before = dump(&mut con, &keys);
        let original = before[keys.iter().position(|x| x == key).unwrap()].clone();
        let _: () = redis::cmd("DEL").arg(key).query(&mut con).unwrap();
        for c in cmds {
            let _: () = c.query(&mut con).unwrap();
        }
        let broken = dump(&mut con, &keys);
        let r = buy(g.port, sale, "second");
        assert_eq!((r.status, r.error()), (503, "unavailable".into()), "{key}");
        assert_eq!(dump(&mut con, &keys), broken, "{key}: a key changed");
        restore(&mut con, key, &original);
        assert_eq!(dump(&mut con, &keys), before, "{key}: not restored");
    }
    // A release count that is not an integer in the meta hash.
    let _: () = redis::Cmd::hset(k.meta(), "releases", "x")
        .query(&mut con)
        .unwrap();
    let broken = dump(&mut con, &keys);
    assert_eq!(buy(g.port, sale, "second").status, 503);
    assert_eq!(dump(&mut con, &keys), broken);
    let _: () = redis::Cmd::hdel(k.meta(), "releases")
        .query(&mut con)
        .unwrap();

    // Fixed: the same user buys, and exactly two orders are made.
    let r = buy(g.port, sale, "second");
    assert_eq!(r.status, 202, "{r:?}");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, Duration::from_secs(20));
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND user_id = 'second'"
        )),
        1
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        2
    );
}

#[test]
fn release_and_load_refuse_a_key_of_the_wrong_type_and_change_nothing() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    let sale = test_sale(3, 5, -1000, 600_000);
    assert!(seckill_common::sale::load_into_redis(&mut con, &sale, 0).unwrap());
    let rid = match seckill_common::reservation::reserve(&mut con, 3, "alice").unwrap() {
        seckill_common::reservation::ReserveOutcome::Reserved(r) => r,
        o => panic!("{o:?}"),
    };
    let k = SaleKeys::new(3);
    let keys = purchase_keys(k);
    for (key, bad) in [
        (k.queue(), redis::Cmd::set(k.queue(), "x")),
        (k.stock(), redis::Cmd::set(k.stock(), "many")),
        (k.status(), redis::Cmd::set(k.status(), "x")),
        (k.buyers(), redis::Cmd::set(k.buyers(), "x")),
    ] {
        let before = dump(&mut con, &keys);
        let original = before[keys.iter().position(|x| *x == key).unwrap()].clone();
        let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
        let _: () = bad.query(&mut con).unwrap();
        let broken = dump(&mut con, &keys);
        let e = release(&mut con, 3, &rid, &[]).unwrap_err();
        assert!(
            matches!(e, ReleaseError::Refused(ref m) if m.contains(&key)),
            "{key}: {e}"
        );
        assert_eq!(dump(&mut con, &keys), broken, "{key}");
        restore(&mut con, &key, &original);
    }
    // The reservation's refusal names the key, whichever it is.
    for key in purchase_keys(k) {
        let was = dump(&mut con, std::slice::from_ref(&key)).remove(0);
        let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
        let _: () = redis::Cmd::sadd(&key, "x").query(&mut con).unwrap();
        match seckill_common::reservation::reserve(&mut con, 3, "bob") {
            Err(seckill_common::reservation::ReserveError::Refused(m)) => {
                assert!(m.contains(&key), "{key}: {m}")
            }
            other => panic!("{key}: {other:?}"),
        }
        restore(&mut con, &key, &was);
    }
    // Loading a new sale while the sales set is a string: nothing written.
    let _: () = redis::cmd("DEL").arg(SALES).query(&mut con).unwrap();
    let _: () = redis::Cmd::set(SALES, "x").query(&mut con).unwrap();
    let other = test_sale(4, 5, -1000, 600_000);
    let e = seckill_common::sale::load_into_redis(&mut con, &other, 0).unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
    let k4 = SaleKeys::new(4);
    assert_eq!(dump(&mut con, &[k4.meta(), k4.stock()]), vec![None, None]);
    // Everything fixed: the release goes through once.
    let _: () = redis::cmd("DEL").arg(SALES).query(&mut con).unwrap();
    assert_eq!(
        release(&mut con, 3, &rid, &[]).unwrap(),
        seckill_common::release::ReleaseOutcome::Released { stock_after: 5 }
    );
}

/// The worker's take script (`seckill_common::reliable_queue::take`): the
/// same lists as one `LMOVE queue processing RIGHT LEFT` per message, oldest
/// first; with the processing list of the wrong type it refuses and the
/// queue keeps every message (the script trims the queue only after both
/// types were checked).
#[test]
fn the_take_moves_like_lmove_and_refuses_a_processing_list_of_the_wrong_type() {
    use seckill_common::reliable_queue::take;
    let redis = RedisServer::start();
    let mut con = redis.con();
    let (queue, processing) = ("q", "p");
    // Pushed oldest first onto the left: m1 is the rightmost.
    for m in ["m1", "m2", "m3", "m4", "m5"] {
        let _: () = redis::cmd("LPUSH")
            .arg(queue)
            .arg(m)
            .query(&mut con)
            .unwrap();
    }
    let got = take(&mut con, queue, processing, 3).unwrap();
    assert_eq!(got, [b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec()]);
    let list = |con: &mut redis::Connection, k: &str| -> Vec<String> {
        redis::cmd("LRANGE")
            .arg(k)
            .arg(0)
            .arg(-1)
            .query(con)
            .unwrap()
    };
    assert_eq!(list(&mut con, queue), ["m5", "m4"]);
    assert_eq!(list(&mut con, processing), ["m3", "m2", "m1"]);
    // More than is left: the rest, and the queue key is gone.
    let got = take(&mut con, queue, processing, 10).unwrap();
    assert_eq!(got, [b"m4".to_vec(), b"m5".to_vec()]);
    assert_eq!(list(&mut con, processing), ["m5", "m4", "m3", "m2", "m1"]);
    let exists: u32 = redis::cmd("EXISTS").arg(queue).query(&mut con).unwrap();
    assert_eq!(exists, 0);
    assert!(take(&mut con, queue, processing, 10).unwrap().is_empty());

    let _: () = redis::cmd("RPUSH")
        .arg(queue)
        .arg("m6")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("bad")
        .arg("x")
        .query(&mut con)
        .unwrap();
    let e = take(&mut con, queue, "bad", 10).unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(list(&mut con, queue), ["m6"]);
    let bad: String = redis::cmd("GET").arg("bad").query(&mut con).unwrap();
    assert_eq!(bad, "x");
}
