//! Specifies the worker's wait on a MySQL statement error with a real
//! worker and MariaDB: the orders table unavailable for 5 s (renamed away,
//! so every batch gets `ERROR 1146`) while a crowd buys leaves no dead
//! letter and exactly one order per reservation; the worker names the
//! remedy in its log at the first failure. The payments table away for
//! 5 s while 3 payments wait dead-letters none of them.

use crate::support::worker as support;

use mysql::prelude::Queryable;
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::{Duration, Instant};
use support::{assert_exactly_once, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

/// Reserves `n` buyers `PREFIX-I` on `threads` threads at once.
fn crowd(redis: &RedisServer, sale: u64, prefix: &str, n: usize, threads: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut con = redis.con();
                for i in (t..n).step_by(threads) {
                    let r = reserve(&mut con, sale, &format!("{prefix}-{i}")).expect("reserve");
                    assert!(matches!(r, ReserveOutcome::Reserved(_)), "{r:?}");
                }
            });
        }
    });
}

#[test]
fn the_orders_table_away_for_5s_under_a_crowd_leaves_no_dead_letter() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 400, -1000, 600_000);
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    crowd(&redis, sale, "before", 50, 4);
    wait_orders(&db, sale, 50, LONG);
    db.conn()
        .query_drop("RENAME TABLE orders TO orders_away")
        .unwrap();
    let away = Instant::now();
    crowd(&redis, sale, "during", 300, 8);
    let left = Duration::from_secs(5).saturating_sub(away.elapsed());
    std::thread::sleep(left);
    db.conn()
        .query_drop("RENAME TABLE orders_away TO orders")
        .unwrap();
    println!(
        "orders table away for {:.1} s while 300 buyers reserved",
        away.elapsed().as_secs_f64()
    );
    crowd(&redis, sale, "after", 50, 4);
    wait_drained(&redis, sale, LONG);
    let dead = support::dead_letters(&redis, sale);
    assert_eq!(dead.len(), 0, "the first: {:?}", dead.first());
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        400
    );
    assert_exactly_once(&db, &redis, sale, 400);
    let log = w.log();
    assert!(
        log.contains("ERROR 1146") && log.contains("seckill-reconciler migrate"),
        "the remedy is not in the worker's log:\n{log}"
    );
}

#[test]
fn the_payments_table_away_for_5s_dead_letters_no_payment() {
    use redis::Commands;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = seckill_tests::TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 3, "1h");
    support::reserve_users(&redis, sale, "p", 3);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    let rids: Vec<String> = db
        .conn()
        .query("SELECT reservation_id FROM orders ORDER BY user_id")
        .unwrap();
    db.conn()
        .query_drop("RENAME TABLE payments TO payments_away")
        .unwrap();
    let away = Instant::now();
    for (i, rid) in rids.iter().enumerate() {
        support::pay(&redis, rid, &format!("pay-{i}"), 1999);
    }
    std::thread::sleep(Duration::from_secs(5).saturating_sub(away.elapsed()));
    db.conn()
        .query_drop("RENAME TABLE payments_away TO payments")
        .unwrap();
    let dead = || -> i64 {
        redis
            .con()
            .llen(seckill_common::payment::DEAD_LETTERS)
            .unwrap()
    };
    seckill_tests::wait_until(LONG, "3 payments applied or one dead-lettered", || {
        db.count("SELECT COUNT(*) FROM payments") == 3 || dead() > 0
    });
    assert_eq!(dead(), 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM orders WHERE status = 'paid'"),
        3
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM payments WHERE outcome = 'paid'"),
        3
    );
}
