//! Specifies the consumer pool of one worker process against a real Redis
//! and MySQL: a backlog over 4 sales makes the pool grow from 1 consumer
//! to its maximum of 4 (one per sale with a backlog), drain, and shrink
//! back to 1 when idle, with exactly one order and one ledger row per
//! reservation; and a worker killed with `kill -9` while 4 consumers hold
//! batches is restarted, every processing list of its consumers is
//! reclaimed (exactly the messages they held), and the sales end exact;
//! and one sale over 4 buckets, whose batches all wait on the sale's MySQL
//! row, keeps one consumer.

use crate::support::worker as support;

use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::reservation::ReserveOutcome;
use seckill_common::reservation::{parse_batch, reserve_script, write_calls, ReserveKeys};
use seckill_tests::{create_sale, create_split_sale, RedisServer, TestDb};
use std::time::{Duration, Instant};
use support::{assert_exactly_once, wait_orders, Opts, WorkerProc};

/// Sales of the backlog.
const SALES: usize = 4;
/// Buyers per reservation script call while filling the queues.
const PER_CALL: usize = 1000;
const LONG: Duration = Duration::from_secs(600);

/// The pool's settings: 1 to 4 consumers, one more while a queue's oldest
/// message is 200 ms old, stopping after 1 s idle.
const POOL: &[(&str, &str)] = &[
    ("SECKILL_WORKER_CONSUMERS_MIN", "1"),
    ("SECKILL_WORKER_CONSUMERS_MAX", "4"),
    ("SECKILL_WORKER_SCALE_AFTER", "200ms"),
    ("SECKILL_WORKER_IDLE_AFTER", "1s"),
];

/// `SALES` sales of `per_sale` units each, every unit reserved through the
/// real reservation script (its batch form, `PER_CALL` buyers a call).
fn backlog(redis: &RedisServer, db: &TestDb, per_sale: usize) -> Vec<u64> {
    let sales: Vec<u64> = (0..SALES)
        .map(|_| create_sale(db, redis, per_sale as u64, -1000, 3_600_000))
        .collect();
    for &sale in &sales {
        fill(redis, SaleKeys::new(sale), per_sale);
    }
    sales
}

/// Reserves `units` units of bucket `k` for distinct buyers of that bucket.
fn fill(redis: &RedisServer, k: SaleKeys, units: usize) {
    let mut con = redis.con();
    let _: String = reserve_script().prepare_invoke().load(&mut con).unwrap();
    let sale = k.sale_id;
    {
        let keys = ReserveKeys::of(k);
        for c in 0..units.div_ceil(PER_CALL) {
            let n = PER_CALL.min(units - c * PER_CALL);
            let users: Vec<String> = (0..n)
                .map(|i| format!("b{sale}-{}-{c}-{i}", k.bucket))
                .collect();
            let ids: Vec<String> = (0..n)
                .map(|_| seckill_common::ids::new_reservation_id())
                .collect();
            let buyers: Vec<(&str, &str)> = users
                .iter()
                .zip(&ids)
                .map(|(u, r)| (u.as_str(), r.as_str()))
                .collect();
            let mut out = Vec::new();
            write_calls(&mut out, &keys, &buyers);
            let reply = redis::ConnectionLike::req_packed_command(&mut con, &out).unwrap();
            for r in parse_batch(&reply, n) {
                assert!(
                    matches!(r, Ok(ref r) if matches!(r.outcome, ReserveOutcome::Reserved(_))),
                    "{r:?}"
                );
            }
        }
    }
}

fn opts() -> Opts {
    Opts {
        env: POOL,
        ..Opts::default()
    }
}

fn registered(redis: &RedisServer) -> Vec<String> {
    let mut ids: Vec<String> = redis.con().smembers(keys::WORKERS).unwrap();
    ids.sort();
    ids
}

/// Messages in consumer `id`'s processing lists of `sales`.
fn held(redis: &RedisServer, sales: &[u64], id: &str) -> usize {
    let mut con = redis.con();
    sales
        .iter()
        .map(|&s| {
            con.llen::<_, usize>(SaleKeys::new(s).processing(id))
                .unwrap()
        })
        .sum()
}

#[test]
fn a_backlog_over_four_sales_grows_the_pool_to_its_maximum_drains_and_shrinks_back() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let per_sale = 25_000;
    let sales = backlog(&redis, &db, per_sale);
    let started = Instant::now();
    let w = WorkerProc::start(&redis, &db, "w", &opts());
    w.wait_metrics();
    for &s in &sales {
        wait_orders(&db, s, per_sale as i64, LONG);
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} orders over {SALES} sales in {secs:.1} s = {:.0} orders/s",
        SALES * per_sale,
        (SALES * per_sale) as f64 / secs
    );
    let log = w.log();
    for id in ["w.1", "w.2", "w.3"] {
        assert!(log.contains(&format!("consumer {id} started (")), "{log}");
    }
    assert!(log.contains("4 of at most 4 running"), "{log}");
    assert!(!log.contains("consumer w.4"), "{log}");
    // Idle: the three above the minimum stop and deregister.
    seckill_tests::wait_until(LONG, "the pool back at 1 consumer", || {
        w.metric("seckill_worker_consumers") == 1 && registered(&redis) == ["w"]
    });
    let log = w.log();
    for id in ["w.1", "w.2", "w.3"] {
        assert!(
            log.contains(&format!(
                "consumer {id}: took nothing for 1000 ms: stopping"
            )),
            "{log}"
        );
    }
    assert_eq!(w.metric("seckill_worker_consumers_max"), 4);
    for &s in &sales {
        assert_exactly_once(&db, &redis, s, per_sale as i64);
    }
    assert_eq!(w.metric("seckill_worker_messages_already_done_total"), 0);
    assert_eq!(w.metric("seckill_worker_reclaimed_total"), 0);
}

#[test]
fn a_worker_killed_while_four_consumers_hold_batches_is_reclaimed_on_restart_exactly() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let per_sale = 10_000;
    let sales = backlog(&redis, &db, per_sale);
    let ids = ["w", "w.1", "w.2", "w.3"];
    let w = WorkerProc::start(&redis, &db, "w", &opts());
    w.wait_metrics();
    seckill_tests::wait_until(LONG, "4 consumers running", || {
        w.metric("seckill_worker_consumers") == 4
    });
    // Frozen, the lists are what the kill leaves: freeze until the
    // consumers above the first hold a batch, then kill.
    let mut holding: Vec<usize>;
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(
            tries < 1000,
            "the consumers above the first never held a batch"
        );
        w.signal("-STOP");
        // Commands sent before the stop are done by now.
        std::thread::sleep(Duration::from_millis(50));
        holding = ids.iter().map(|id| held(&redis, &sales, id)).collect();
        if holding[1..].iter().sum::<usize>() > 0 {
            break;
        }
        w.signal("-CONT");
        std::thread::sleep(Duration::from_millis(20));
    }
    w.signal("-KILL");
    drop(w);
    let total: usize = holding.iter().sum();
    eprintln!("killed holding {holding:?}");

    let w = WorkerProc::start(&redis, &db, "w", &opts());
    w.wait_metrics();
    for &s in &sales {
        wait_orders(&db, s, per_sale as i64, LONG);
    }
    seckill_tests::wait_until(LONG, "the pool back at 1 consumer", || {
        w.metric("seckill_worker_consumers") == 1 && registered(&redis) == ["w"]
    });
    // Every message the dead consumers held went back to its queue once:
    // the restart's reclaim (or the heartbeat's expiry) moved exactly them.
    assert_eq!(w.metric("seckill_worker_reclaimed_total"), total as u64);
    for &s in &sales {
        assert_exactly_once(&db, &redis, s, per_sale as i64);
    }
    for id in ids {
        assert_eq!(held(&redis, &sales, id), 0, "{id}");
    }
}

#[test]
fn one_sale_over_four_buckets_keeps_one_consumer() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_split_sale(&db, &redis, 8_000, -1000, 3_600_000, 4);
    for b in 0..4 {
        fill(&redis, SaleKeys::bucket(sale, b), 2_000);
    }
    let w = WorkerProc::start(&redis, &db, "w", &opts());
    w.wait_metrics();
    wait_orders(&db, sale, 8_000, LONG);
    let log = w.log();
    assert!(!log.contains("consumer w.1 "), "{log}");
    assert_eq!(w.metric("seckill_worker_consumers"), 1);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 8_000);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM stock_ledger WHERE reason = 'order'"),
        8_000
    );
}
