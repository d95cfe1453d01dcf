//! Specifies the order lifecycle of a sale split over buckets (`sale
//! create --shards 3 --payment-window`) with the real gateway, worker and
//! reconciler on a private Redis and MySQL: every payment, cancellation
//! and expiry acts in the bucket that holds the reservation (its buyer's
//! home bucket), each released unit goes back to that bucket's stock and
//! is sold again (pulled to other buckets as any unit), and the
//! reconciler's books balance per bucket and in total.

use crate::support::gateway as gateway_support;
use crate::support::lifecycle_http as lifecycle;
use crate::support::worker as support;

use gateway_support::{buy, buy_final, Client};
use lifecycle::{gateway, me, pay, PRICE};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::buckets::home_bucket;
use seckill_common::keys::SaleKeys;
use seckill_tests::{users_of, wait_until, RedisServer, TempDir, TestDb};
use std::time::Duration;
use support::{wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);
const K: u32 = 3;

/// Each bucket's stock, bucket 0 first.
fn stocks(redis: &RedisServer, sale: u64) -> Vec<i64> {
    let mut con = redis.con();
    (0..K)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect()
}

/// Each bucket's released units (its `released` hash), bucket 0 first.
fn released(redis: &RedisServer, sale: u64) -> Vec<i64> {
    let mut con = redis.con();
    (0..K)
        .map(|b| con.hlen(SaleKeys::bucket(sale, b).released()).unwrap())
        .collect()
}

/// The Redis status of every reservation, read in its buyer's home bucket.
fn home_statuses(redis: &RedisServer, sale: u64, rids: &[(String, String)]) -> Vec<Option<String>> {
    let mut con = redis.con();
    rids.iter()
        .map(|(u, rid)| {
            con.hget(SaleKeys::bucket(sale, home_bucket(u, K)).status(), rid)
                .unwrap()
        })
        .collect()
}

/// Orders of `sale` by status, in status order.
fn order_counts(db: &TestDb, sale: u64) -> Vec<(String, i64)> {
    db.conn()
        .exec(
            "SELECT status, COUNT(*) FROM orders WHERE sale_id = ? GROUP BY status ORDER BY status",
            (sale,),
        )
        .unwrap()
}

fn pairs(v: &[(&str, i64)]) -> Vec<(String, i64)> {
    v.iter().map(|(a, b)| (a.to_string(), *b)).collect()
}

/// Buys one unit for each of `users` (retrying a 503, as a client would):
/// 202 each; (user, reservation id) in order.
fn buy_each(port: u16, sale: u64, users: &[String]) -> Vec<(String, String)> {
    let mut c = Client::connect(port);
    users
        .iter()
        .map(|u| {
            let (status, body) = buy_final(&mut c, sale, u);
            assert_eq!(status, 202, "{u}: {body}");
            (
                u.clone(),
                body["reservation_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// What a buyer does with a pending order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pay,
    Cancel,
    Expire,
}

/// 300 units over 3 buckets to 300 buyers skewed by the hash (150/100/50
/// against 100 units each: units move), all pending; half pay, a quarter
/// cancel, a quarter let their deadline pass → exactly the cancelled and
/// expired units of each bucket's buyers back in that bucket's stock (and
/// its `released` hash), 150 back in MySQL, each status final in its home
/// bucket, `run` clean; sold again to 150 buyers of bucket 0 alone (pulled
/// from the others), who pay → 300 paid, every stock 0, `run` clean.
#[test]
fn released_units_go_back_to_their_bucket_and_are_sold_again() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_split_sale(&redis, &db, &file, 300, "1h", K);
    let g = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());

    let mut crowd = users_of("b", 0, K, 150);
    crowd.extend(users_of("b", 1, K, 100));
    crowd.extend(users_of("b", 2, K, 50));
    let rids = buy_each(g.port, sale, &crowd);
    assert_eq!(stocks(&redis, sale), [0, 0, 0]);
    wait_orders(&db, sale, 300, LONG);
    wait_until(
        LONG,
        "every order pending_payment in its home bucket",
        || {
            home_statuses(&redis, sale, &rids)
                .iter()
                .all(|s| s.as_deref() == Some("pending_payment"))
        },
    );

    let fate = |i: usize| match i % 4 {
        1 => Fate::Cancel,
        3 => Fate::Expire,
        _ => Fate::Pay,
    };
    let mut back = [0i64; K as usize];
    let mut expiring = Vec::new();
    for (i, (u, rid)) in rids.iter().enumerate() {
        match fate(i) {
            Fate::Pay => {}
            Fate::Cancel => back[home_bucket(u, K) as usize] += 1,
            Fate::Expire => {
                back[home_bucket(u, K) as usize] += 1;
                expiring.push(rid.clone());
            }
        }
    }
    // The deadline passes for a quarter: their `pay_by` is moved into the
    // past in MySQL (what the sweep reads), so the test waits for no clock
    // and the payers are never late.
    db.conn()
        .exec_drop(
            format!(
                "UPDATE orders SET pay_by = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND
                 WHERE reservation_id IN ({})",
                seckill_common::schema::placeholders(expiring.len())
            ),
            expiring,
        )
        .unwrap();
    for (i, (u, rid)) in rids.iter().enumerate() {
        match fate(i) {
            Fate::Pay => pay(g.port, rid, &format!("pay-{u}"), PRICE),
            Fate::Cancel => {
                let r = me(g.port, "DELETE", sale, Some(u));
                assert_eq!(
                    (r.status, r.json()["cancellation"].clone()),
                    (202, "queued".into())
                );
            }
            Fate::Expire => {}
        }
    }
    wait_until(LONG, "150 paid, 75 cancelled, 75 expired", || {
        order_counts(&db, sale) == pairs(&[("cancelled", 75), ("expired", 75), ("paid", 150)])
    });
    wait_until(
        LONG,
        "each bucket's released units back in its stock",
        || stocks(&redis, sale) == back,
    );
    wait_until(LONG, "every status final in its home bucket", || {
        let st = home_statuses(&redis, sale, &rids);
        st.iter().enumerate().all(|(i, s)| {
            s.as_deref()
                == Some(match fate(i) {
                    Fate::Pay => "paid",
                    Fate::Cancel => "cancelled",
                    Fate::Expire => "expired",
                })
        })
    });
    assert_eq!(back.iter().sum::<i64>(), 150);
    assert_eq!(released(&redis, sale), back);
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        150
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'"
        )),
        150
    );
    // Without --rebuy-after-release the mark stays in the home bucket.
    let (cancelled_buyer, cancelled_rid) = &rids[1];
    let again = buy(g.port, sale, cancelled_buyer);
    assert_eq!(again.status, 409, "{again:?}");
    assert_eq!(
        again.json()["reservation_id"].as_str(),
        Some(cancelled_rid.as_str())
    );
    assert_eq!(
        me(g.port, "GET", sale, Some(&rids[299].0)).json()["status"],
        "expired"
    );
    seckill_tests::assert_reconciles_clean(&redis, &db, &file);

    // Sold again, all to buyers of bucket 0: the other buckets' released
    // units are pulled to it.
    let second = users_of("n", 0, K, 150);
    let rids2 = buy_each(g.port, sale, &second);
    let mut late = Client::connect(g.port);
    let (status, body) = buy_final(&mut late, sale, &users_of("late", 2, K, 1)[0]);
    assert_eq!(status, 410, "{body}");
    assert_eq!(stocks(&redis, sale), [0, 0, 0]);
    wait_orders(&db, sale, 450, LONG);
    wait_until(LONG, "the new orders pending_payment", || {
        home_statuses(&redis, sale, &rids2)
            .iter()
            .all(|s| s.as_deref() == Some("pending_payment"))
    });
    for (u, rid) in &rids2 {
        pay(g.port, rid, &format!("pay-{u}"), PRICE);
    }
    wait_until(LONG, "300 paid", || {
        order_counts(&db, sale) == pairs(&[("cancelled", 75), ("expired", 75), ("paid", 300)])
    });
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM payments WHERE outcome = 'paid'"),
        300
    );
    assert_eq!(stocks(&redis, sale), [0, 0, 0]);
    seckill_tests::assert_reconciles_clean(&redis, &db, &file);
}

/// A cancellation MySQL decided whose Redis step never ran (the worker
/// stopped between them): the reconciler finds the unit still held in the
/// buyer's home bucket (bucket 1, not bucket 0), does the Redis step there
/// once (`auto_fixed`), and the unit is back in bucket 1's stock only.
#[test]
fn a_release_left_half_done_is_completed_in_the_buyers_bucket() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_split_sale(&redis, &db, &file, 9, "1h", K);
    let g = gateway(&redis);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let buyers: Vec<String> = (0..K).map(|b| users_of("h", b, K, 1).remove(0)).collect();
    let rids = buy_each(g.port, sale, &buyers);
    wait_orders(&db, sale, 3, LONG);
    wait_until(LONG, "the orders pending_payment", || {
        home_statuses(&redis, sale, &rids)
            .iter()
            .all(|s| s.as_deref() == Some("pending_payment"))
    });
    drop(w);
    let done = seckill_common::lifecycle::cancel(&mut db.conn(), sale, &buyers[1]).unwrap();
    assert_eq!(
        done,
        seckill_common::lifecycle::Cancelled::Done(rids[1].1.clone())
    );
    assert_eq!(stocks(&redis, sale), [2, 2, 2]);

    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");
    let (_, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["findings", "--state", "all", "--json"],
    );
    let f: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let kinds: Vec<(&str, &str, &str)> = f
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap(),
                f["state"].as_str().unwrap(),
                f["reservation_id"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [(
            "released_in_mysql_held_in_redis",
            "auto_fixed",
            rids[1].1.as_str()
        )],
        "{out}"
    );
    assert_eq!(stocks(&redis, sale), [2, 3, 2]);
    assert_eq!(released(&redis, sale), [0, 1, 0]);
    assert_eq!(
        home_statuses(&redis, sale, &rids[1..2]),
        [Some("cancelled".to_string())]
    );
    // A second run finds nothing new and moves nothing.
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(stocks(&redis, sale), [2, 3, 2]);
}

/// Per-bucket books. A unit moved from bucket 1's stock to bucket 2's by
/// hand leaves the sale's sum right, but bucket 1 then holds a unit taken
/// without its buyer mark and flow record, which is what a bucket that
/// lost writes looks like: the data-loss watch finds it first (one
/// `redis_data_loss` naming bucket 1; the sale pauses, its other rules
/// wait) and `sale repair` puts every bucket back from MySQL. A unit added
/// to bucket 2 alone breaks only its `stock + reservations = total_stock`:
/// one `bucket_stock:b2` finding, beside the sale's own `redis_stock`.
#[test]
fn a_unit_in_the_wrong_bucket_is_found_per_bucket() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_split_sale(&db, &redis, 9, -1_000, 600_000, K);
    let mut con = redis.con();
    let _: i64 = con.decr(SaleKeys::bucket(sale, 1).stock(), 1).unwrap();
    let _: i64 = con.incr(SaleKeys::bucket(sale, 2).stock(), 1).unwrap();
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "{out}");
    let findings = |file: &std::path::Path| -> Vec<serde_json::Value> {
        let (_, out) = seckill_tests::reconciler(&redis, &db, file, &["findings", "--json"]);
        serde_json::from_str(&out).unwrap()
    };
    let f = findings(&file);
    let subjects: Vec<(&str, &str)> = f
        .iter()
        .map(|f| (f["kind"].as_str().unwrap(), f["subject"].as_str().unwrap()))
        .collect();
    assert_eq!(subjects, [("redis_data_loss", "sale")], "{f:?}");
    let behind: Vec<u64> = f[0]["evidence"]["buckets_behind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["bucket"].as_u64().unwrap())
        .collect();
    assert_eq!(behind, [1]);
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["sale", "repair", &sale.to_string(), "--by", "op"],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(stocks(&redis, sale), [3, 3, 3]);
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");

    let other = review.path().join("other.sqlite3");
    let _: i64 = con.incr(SaleKeys::bucket(sale, 2).stock(), 1).unwrap();
    let (code, out) = seckill_tests::reconciler(&redis, &db, &other, &["run"]);
    assert_eq!(code, 1, "{out}");
    let f = findings(&other);
    let mut subjects: Vec<(&str, &str)> = f
        .iter()
        .map(|f| (f["kind"].as_str().unwrap(), f["subject"].as_str().unwrap()))
        .collect();
    subjects.sort_unstable();
    assert_eq!(
        subjects,
        [
            ("stock_mismatch", "bucket_stock:b2"),
            ("stock_mismatch", "redis_stock")
        ],
        "{f:?}"
    );
}

/// A split sale sold out, every order expired, its 6
/// units back in their buckets; the first buyer after the memory's trust
/// gets one, and the 19 behind it get the other 5: exactly 5 × 202 and
/// 14 × 410 (a reservation did not reopen the memory of a split sale, so
/// one unit sold per recheck and the others heard `sold_out`).
#[test]
fn units_back_in_a_split_sale_are_sold_to_buyers_arriving_at_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_split_sale(&redis, &db, &file, 6, "1h", K);
    let g = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let first: Vec<String> = (0..6).map(|i| format!("first-{i}")).collect();
    buy_each(g.port, sale, &first);
    // The gateway remembers the sale sold out.
    let mut c = Client::connect(g.port);
    assert_eq!(buy_final(&mut c, sale, "seventh").0, 410);
    wait_orders(&db, sale, 6, LONG);
    db.conn()
        .exec_drop(
            "UPDATE orders SET pay_by = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE sale_id = ?",
            (sale,),
        )
        .unwrap();
    wait_until(LONG, "every unit back in Redis", || {
        stocks(&redis, sale).iter().sum::<i64>() == 6
    });
    // Past the memory's trust (RECHECK_AFTER, 500 ms): the next purchase
    // asks Redis and gets a unit; the 19 right behind it must go to Redis
    // too (answered from memory within the recheck's 100 ms window they
    // would get 19 × 410 with 5 units on sale).
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(buy(g.port, sale, "late-first").status, 202);
    let port = g.port;
    let answers: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..19)
            .map(|i| s.spawn(move || buy(port, sale, &format!("late-{i}")).status))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let count = |st: u16| answers.iter().filter(|&&a| a == st).count();
    assert_eq!((count(202), count(410)), (5, 14), "{answers:?}");
    assert_eq!(stocks(&redis, sale), [0, 0, 0]);
}
