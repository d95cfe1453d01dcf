//! Specifies that every worker metric docs/DESIGN.md "Metrics" lists is on
//! the worker's `/metrics` page and moves as documented, scraped
//! once while nothing is applied yet and once after a small sale:
//!
//! - 5 units reserved; the test holds the sale's MySQL row (`FOR UPDATE`),
//!   so the worker takes the 5 into its processing list and waits; 2 more
//!   reserved meanwhile wait in the queue; a registered worker `ghost` with
//!   a live heartbeat holds copies of 2 of the messages in its processing
//!   list. First scrape: queue 2, processing 7, the oldest queued message's
//!   age above 0, every counter 0.
//! - MySQL holds 4 units: the row released, 4 orders, 3 dead letters
//!   ("stock exhausted in MySQL"); the ghost's heartbeat deleted, its 2
//!   messages reclaimed and found already done. Second scrape: exactly
//!   those counts, the MySQL transactions and the batches taken (a batch
//!   MySQL's stock cannot cover is applied again message by message), every
//!   queue gauge back to 0, the sale's dead-letter gauge at 3, no retry,
//!   fence, requeue or Redis error; each MySQL transaction timed once
//!   (`batch_seconds_count` = `batches_total`).
//!
//! (`seckill_worker_retries_total` moving: worker_mysql.rs and
//! worker_frozen.rs; `..._fenced_total`: worker_fence.rs; `..._requeued_total`:
//! worker_queue.rs.)

use crate::support::worker as worker_support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{dead_letters, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(30);

/// The value of the series `name` whose labels include every one of
/// `labels` (`key="value"`), or `None` when the page has no such line.
fn value(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    page.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        let (series, v) = rest.rsplit_once(' ')?;
        labels
            .iter()
            .all(|lb| series.contains(lb))
            .then(|| v.parse().ok())
            .flatten()
    })
}

/// Every documented worker series with the labels it is read with.
fn documented(sale: u64) -> Vec<(&'static str, Vec<String>)> {
    let w = r#"worker="w1""#.to_string();
    let s = format!(r#"sale="{sale}""#);
    let worker = |name| (name, vec![w.clone()]);
    vec![
        worker("seckill_worker_orders_applied_total"),
        worker("seckill_worker_messages_already_done_total"),
        worker("seckill_worker_batches_total"),
        worker("seckill_worker_batch_size_count"),
        worker("seckill_worker_batch_size_sum"),
        worker("seckill_worker_batch_seconds_count"),
        (
            "seckill_worker_retries_total",
            vec![w.clone(), r#"cause="deadlock_or_lock_wait""#.into()],
        ),
        (
            "seckill_worker_retries_total",
            vec![w.clone(), r#"cause="connection""#.into()],
        ),
        (
            "seckill_worker_dead_lettered_total",
            vec![w.clone(), r#"reason="stock_exhausted""#.into()],
        ),
        worker("seckill_worker_fenced_total"),
        worker("seckill_worker_requeued_total"),
        worker("seckill_worker_reclaimed_total"),
        worker("seckill_worker_redis_errors_total"),
        ("seckill_queue_length", vec![s.clone()]),
        ("seckill_processing_length", vec![s.clone()]),
        ("seckill_dead_letter_length", vec![s.clone()]),
        ("seckill_queue_oldest_age_seconds", vec![s]),
    ]
}

/// The documented series on `page`, in [`documented`]'s order; panics
/// naming a missing one.
fn scrape(page: &str, sale: u64) -> Vec<f64> {
    documented(sale)
        .iter()
        .map(|(name, labels)| {
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            value(page, name, &labels)
                .unwrap_or_else(|| panic!("{name}{labels:?} missing from:\n{page}"))
        })
        .collect()
}

#[test]
fn every_documented_worker_metric_is_present_and_moves() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    db.conn()
        .exec_drop("UPDATE sales SET available_stock = 4 WHERE id = ?", (sale,))
        .unwrap();
    reserve_users(&redis, sale, "u", 5);
    // Copies of u-0's and u-1's messages for the ghost's processing list.
    let queued: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let copies: Vec<&String> = queued
        .iter()
        .filter(|m| m.contains(r#""user_id":"u-0""#) || m.contains(r#""user_id":"u-1""#))
        .collect();
    assert_eq!(copies.len(), 2, "{queued:?}");
    let _: () = con.sadd(keys::WORKERS, "ghost").unwrap();
    let _: () = con
        .set_ex(keys::worker_heartbeat("ghost"), "1", 300)
        .unwrap();
    let _: () = con.lpush(k.processing("ghost"), &copies).unwrap();

    let mut lock = db.conn();
    lock.query_drop("START TRANSACTION").unwrap();
    lock.exec_drop("SELECT id FROM sales WHERE id = ? FOR UPDATE", (sale,))
        .unwrap();
    // A heartbeat TTL of 20 s: the worker waits up to 10 s for the row
    // (no lock-wait retry), and reclaims every 10 s.
    let opts = Opts {
        batch: 10,
        heartbeat_ttl: "20s",
        // At least the 10 s session limits the TTL sets, else refused.
        env: &[("SECKILL_MYSQL_TIMEOUT", "15s")],
        ..Opts::default()
    };
    let w = WorkerProc::start(&redis, &db, "w1", &opts);
    seckill_tests::wait_until(LONG, "the worker to hold the 5 messages", || {
        let held: usize = con.llen(k.processing("w1")).unwrap();
        held == 5
    });
    reserve_users(&redis, sale, "v", 2);
    let mut before = Vec::new();
    seckill_tests::wait_until(LONG, "the gauges to show queue 2, processing 7", || {
        let page = w.metrics();
        let q = value(
            &page,
            "seckill_queue_length",
            &[&format!(r#"sale="{sale}""#)],
        );
        let p = value(
            &page,
            "seckill_processing_length",
            &[&format!(r#"sale="{sale}""#)],
        );
        if (q, p) == (Some(2.0), Some(7.0)) {
            before = scrape(&page, sale);
            true
        } else {
            false
        }
    });
    let age = before.pop().unwrap();
    assert!(age > 0.0, "oldest queued message's age: {age}");
    let mut zero = vec![0.0; before.len()];
    zero[13] = 2.0; // queue
    zero[14] = 7.0; // processing
    assert_eq!(before, zero, "first scrape, in the order of `documented`");

    lock.query_drop("COMMIT").unwrap();
    wait_orders(&db, sale, 4, LONG);
    seckill_tests::wait_until(LONG, "three dead letters", || {
        dead_letters(&redis, sale).len() == 3
    });
    let _: () = con.del(keys::worker_heartbeat("ghost")).unwrap();
    wait_drained(&redis, sale, LONG);
    let mut after = Vec::new();
    seckill_tests::wait_until(LONG, "the reclaimed messages counted, gauges at 0", || {
        after = scrape(&w.metrics(), sale);
        after[1] == 2.0 && after[13..] == [0.0, 0.0, 3.0, 0.0]
    });
    // MySQL transactions (`..._batches_total`, `..._batch_size`): the 5
    // as one (over the 4 units MySQL holds), then one by one (5: 4 orders,
    // 1 dead letter); the 2 as one, then one by one (2 dead letters); the
    // reclaimed 2 as one (already done): 10 transactions of 16 messages,
    // each timed (`..._batch_seconds`).
    let expected = vec![
        4.0,  // orders applied
        2.0,  // already done (the ghost's copies)
        10.0, // MySQL transactions
        10.0, // batch_size count: one per transaction
        16.0, // batch_size sum: the messages of each transaction
        10.0, // batch_seconds count: one per transaction
        0.0,  // retries, lock wait (the row was released within 10 s)
        0.0,  // retries, connection
        3.0,  // dead lettered, stock exhausted in MySQL
        0.0,  // fenced
        0.0,  // requeued
        2.0,  // reclaimed
        0.0,  // Redis errors
        0.0,  // queue
        0.0,  // processing
        3.0,  // the sale's dead letters
        0.0,  // oldest age
    ];
    assert_eq!(
        after, expected,
        "second scrape, in the order of `documented`"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 4);
}

/// The payment consumer and the expiry sweep count what they did by
/// outcome, and the gauges of the shared lists come from one worker at a
/// time (the holder of the gauge lease), so a sum over workers counts each
/// list once: a sale of 3 with a 1 ms payment window whose 2 orders
/// expire (2 expiries, 2 units released in Redis); a payment of no
/// reservation, a cancellation by a buyer holding no order, a message that
/// is neither (dead-lettered); then a second worker that exports none of
/// the shared gauges until the first stops.
#[test]
fn payments_cancellations_expiries_and_releases_are_counted_and_one_worker_exports_shared_gauges() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = seckill_tests::TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &review, 3, "1ms");
    reserve_users(&redis, sale, "x", 2);
    let mut w1 = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    w1.wait_metrics();
    let w = r#"worker="w1""#;
    seckill_tests::wait_until(LONG, "two expiries and two releases", || {
        let page = w1.metrics();
        value(&page, "seckill_worker_orders_expired_total", &[w]) == Some(2.0)
            && value(
                &page,
                "seckill_worker_releases_total",
                &[w, r#"outcome="released""#],
            ) == Some(2.0)
    });
    worker_support::pay(&redis, &"0".repeat(32), "pay-none", 1999);
    let cancel = seckill_common::payment::CancelMessage::new(
        sale,
        "nobody",
        &"1".repeat(32),
        seckill_common::now_ms(),
    );
    seckill_common::payment::enqueue_cancel(&mut redis.con(), &cancel).unwrap();
    con_lpush(&redis, seckill_common::payment::QUEUE, "neither");
    let want = [
        (
            "seckill_worker_payments_total",
            r#"outcome="unknown_reservation""#,
            1.0,
        ),
        (
            "seckill_worker_payments_total",
            r#"outcome="dead_lettered""#,
            1.0,
        ),
        ("seckill_worker_payments_total", r#"outcome="paid""#, 0.0),
        (
            "seckill_worker_cancellations_total",
            r#"outcome="no_order""#,
            1.0,
        ),
        (
            "seckill_worker_cancellations_total",
            r#"outcome="cancelled""#,
            0.0,
        ),
        (
            "seckill_worker_releases_total",
            r#"outcome="not_found""#,
            0.0,
        ),
        ("seckill_worker_shared_lists_exporter", "", 1.0),
    ];
    let mut page = String::new();
    seckill_tests::wait_until(LONG, "the payments counted", || {
        page = w1.metrics();
        want.iter()
            .all(|(n, l, v)| value(&page, n, &[w, l]) == Some(*v))
            && value(&page, "seckill_payments_dead_letter_length", &[]) == Some(1.0)
    });
    let version = format!(r#"version="{}""#, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        value(&page, "seckill_worker_build_info", &[w, &version]),
        Some(1.0)
    );
    assert!(value(&page, "process_threads", &[]).is_some_and(|t| t >= 4.0));

    // A second worker: exactly one of the two exports the shared gauges.
    let mut w2 = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    w2.wait_metrics();
    let sale_label = format!(r#"sale="{sale}""#);
    let shared = |page: &str| {
        (
            value(page, "seckill_queue_length", &[&sale_label]),
            value(page, "seckill_payments_dead_letter_length", &[]),
        )
    };
    seckill_tests::wait_until(LONG, "w2 to run its housekeeping", || {
        value(&w2.metrics(), "seckill_worker_shared_lists_exporter", &[]) == Some(0.0)
    });
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(shared(&w1.metrics()), (Some(0.0), Some(1.0)));
        assert_eq!(shared(&w2.metrics()), (None, None));
    }
    // The reporter stops: the other takes the lease over.
    w1.signal("-TERM");
    assert!(w1.wait_exit(LONG).success());
    seckill_tests::wait_until(LONG, "w2 to export the shared gauges", || {
        shared(&w2.metrics()) == (Some(0.0), Some(1.0))
    });
    assert_eq!(
        value(&w2.metrics(), "seckill_worker_shared_lists_exporter", &[]),
        Some(1.0)
    );
    w2.signal("-TERM");
    assert!(w2.wait_exit(LONG).success());
}

fn con_lpush(redis: &RedisServer, key: &str, v: &str) {
    redis.con().lpush(key, v).unwrap()
}

/// A cancellation's Redis step is a release like an expiry's: 2 pending
/// orders of a sale with a 1 h payment window cancelled by their buyers
/// count 2 `cancelled` cancellations and 2 `released` releases, with no
/// expiry.
#[test]
fn a_cancellations_redis_step_counts_as_a_release() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = seckill_tests::TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &review, 3, "1h");
    reserve_users(&redis, sale, "c", 2);
    let mut w1 = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    w1.wait_metrics();
    wait_orders(&db, sale, 2, LONG);
    let orders: Vec<(String, String)> = db
        .conn()
        .exec(
            "SELECT user_id, reservation_id FROM orders WHERE sale_id = ?",
            (sale,),
        )
        .unwrap();
    assert_eq!(orders.len(), 2);
    for (user, rid) in &orders {
        let m =
            seckill_common::payment::CancelMessage::new(sale, user, rid, seckill_common::now_ms());
        seckill_common::payment::enqueue_cancel(&mut redis.con(), &m).unwrap();
    }
    let w = r#"worker="w1""#;
    let counts = |page: &str| {
        (
            value(
                page,
                "seckill_worker_cancellations_total",
                &[w, r#"outcome="cancelled""#],
            ),
            value(
                page,
                "seckill_worker_releases_total",
                &[w, r#"outcome="released""#],
            ),
            value(page, "seckill_worker_orders_expired_total", &[w]),
        )
    };
    seckill_tests::wait_until(LONG, "two cancellations released in Redis", || {
        counts(&w1.metrics()) == (Some(2.0), Some(2.0), Some(0.0))
    });
    // Two sweeps later, still 2: each unit released once.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(counts(&w1.metrics()), (Some(2.0), Some(2.0), Some(0.0)));
    let released: i64 = db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled' AND redis_released_at IS NOT NULL"
    ));
    assert_eq!(released, 2);
    w1.signal("-TERM");
    assert!(w1.wait_exit(LONG).success());
}
