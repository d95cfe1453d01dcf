//! Specifies the worker's normal operation on real Redis and MariaDB with
//! real `seckill-worker` processes: every reservation becomes exactly one
//! order, duplicates change nothing, bad messages are dead-lettered without
//! stopping the worker, SIGTERM exits 0 with nothing half-applied and the
//! worker deregistered.

use crate::support::worker as support;

use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::message::OrderMessage;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Duration;
use support::{
    assert_exactly_once, dead_letters, reserve_users, wait_drained, wait_orders, Opts, WorkerProc,
};

const LONG: Duration = Duration::from_secs(120);

#[test]
fn four_workers_turn_1200_reservations_of_two_sales_into_exactly_1200_orders() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let a = create_sale(&db, &redis, 1000, -1000, 600_000);
    let b = create_sale(&db, &redis, 200, -1000, 600_000);
    reserve_users(&redis, a, "a", 1000);
    reserve_users(&redis, b, "b", 200);

    let workers: Vec<WorkerProc> = (1..=4)
        .map(|i| WorkerProc::start(&redis, &db, &format!("w{i}"), &Opts::default()))
        .collect();
    wait_orders(&db, a, 1000, LONG);
    wait_orders(&db, b, 200, LONG);
    wait_drained(&redis, a, LONG);
    wait_drained(&redis, b, LONG);

    assert_exactly_once(&db, &redis, a, 1000);
    assert_exactly_once(&db, &redis, b, 200);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 1200);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 1200);
    assert_eq!(db.count("SELECT SUM(available_stock) FROM sales"), 0);

    // The four workers' metrics add up to the 1,200 orders.
    let applied: u64 = workers
        .iter()
        .map(|w| metric(&w.metrics(), "seckill_worker_orders_applied_total"))
        .sum();
    assert_eq!(applied, 1200);
    let registered: Vec<String> = redis.con().smembers(keys::WORKERS).unwrap();
    assert_eq!(registered.len(), 4);
}

/// The sum of every series of `name` on `page` (all label sets).
fn metric(page: &str, name: &str) -> u64 {
    let values: Vec<u64> = page
        .lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter(|rest| rest.starts_with('{') || rest.starts_with(' '))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(!values.is_empty(), "{name} missing from:\n{page}");
    values.iter().sum()
}

#[test]
fn the_same_message_pushed_twice_makes_one_order_one_ledger_row_one_decrement() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    reserve_users(&redis, sale, "u", 3);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    // Push one message a second time, as a redelivery would.
    let first: String = con.lindex(k.queue(), -1).unwrap();
    let _: () = con.lpush(k.queue(), &first).unwrap();

    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 10);
    let page = w.metrics();
    assert_eq!(metric(&page, "seckill_worker_orders_applied_total"), 3);
    assert_eq!(
        metric(&page, "seckill_worker_messages_already_done_total"),
        1
    );

    // And again, after the first copy was applied and settled.
    let _: () = con.lpush(k.queue(), &first).unwrap();
    wait_until_metric(&w, "seckill_worker_messages_already_done_total", 2);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 10);
}

fn wait_until_metric(w: &WorkerProc, name: &str, v: u64) {
    seckill_tests::wait_until(LONG, name, || metric(&w.metrics(), name) >= v);
}

#[test]
fn bad_messages_are_dead_lettered_with_reasons_and_the_worker_keeps_consuming() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let opts = Opts {
        max_attempts: 3,
        ..Opts::default()
    };
    let w = WorkerProc::start(&redis, &db, "w1", &opts);

    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    reserve_users(&redis, sale, "u", 5);
    let _: () = con.lpush(k.queue(), "this is not json").unwrap();
    // A sale Redis knows and MySQL does not.
    let unknown = sale + 1000;
    let ku = SaleKeys::new(unknown);
    let bad = OrderMessage {
        v: 1,
        reservation_id: "00000000000000000000000000000abc".into(),
        sale_id: unknown,
        user_id: "mallory".into(),
        reserved_at_ms: seckill_common::now_ms(),
        quantity: 1,
    };
    let _: () = con.sadd(keys::SALES, unknown).unwrap();
    // With its flow record, so the fence lets it through to MySQL.
    let _: () = con
        .hset(ku.flow(), &bad.reservation_id, bad.to_json())
        .unwrap();
    let _: () = con.lpush(ku.queue(), bad.to_json()).unwrap();
    reserve_users(&redis, sale, "v", 5);

    wait_orders(&db, sale, 10, LONG);
    seckill_tests::wait_until(LONG, "two dead letters", || {
        dead_letters(&redis, sale).len() + dead_letters(&redis, unknown).len() == 2
    });
    wait_drained(&redis, sale, LONG);
    wait_drained(&redis, unknown, LONG);

    let d = dead_letters(&redis, sale);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].message, "this is not json");
    assert!(
        d[0].reason.starts_with("malformed order message"),
        "{:?}",
        d[0]
    );
    assert_eq!((d[0].attempts, d[0].reservation_id.clone()), (0, None));
    assert_eq!(d[0].worker, "w1");

    let d = dead_letters(&redis, unknown);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].message, bad.to_json());
    assert_eq!(d[0].reason, format!("unknown sale {unknown}"));
    // An unknown sale is permanent: dead-lettered at its first application.
    assert_eq!(d[0].attempts, 1, "{:?}", d[0]);
    assert_eq!(
        d[0].reservation_id.as_deref(),
        Some(bad.reservation_id.as_str())
    );
    let status: String = con.hget(ku.status(), &bad.reservation_id).unwrap();
    assert_eq!(status, "on_hold");

    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 10);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 10);
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );

    // Still consuming, including a sale created after it started.
    let later = create_sale(&db, &redis, 5, -1000, 600_000);
    reserve_users(&redis, later, "x", 5);
    wait_orders(&db, later, 5, LONG);
    wait_drained(&redis, later, LONG);
    assert_exactly_once(&db, &redis, later, 5);
    assert_eq!(
        metric(&w.metrics(), "seckill_worker_dead_lettered_total"),
        2
    );
}

#[test]
fn mysql_stock_below_redis_stock_dead_letters_the_excess_as_failed() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    // Someone took 7 units in MySQL behind Redis's back: only 3 remain.
    use mysql::prelude::Queryable;
    db.conn()
        .exec_drop("UPDATE sales SET available_stock = 3 WHERE id = ?", (sale,))
        .unwrap();
    reserve_users(&redis, sale, "u", 5);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(LONG, "two dead letters", || {
        dead_letters(&redis, sale).len() == 2
    });
    wait_drained(&redis, sale, LONG);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 3);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 3);
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    let d = dead_letters(&redis, sale);
    assert!(
        d.iter().all(|d| d.reason == "stock exhausted in MySQL"),
        "{d:?}"
    );
    let statuses: std::collections::HashMap<String, String> =
        redis.con().hgetall(SaleKeys::new(sale).status()).unwrap();
    let on_hold = statuses.values().filter(|s| *s == "on_hold").count();
    let confirmed = statuses.values().filter(|s| *s == "confirmed").count();
    assert_eq!((confirmed, on_hold), (3, 2));
}

#[test]
fn sigterm_exits_0_with_every_taken_message_applied_and_settled() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 2000, -1000, 600_000);
    reserve_users(&redis, sale, "u", 2000);
    let opts = Opts {
        batch: 8,
        ..Opts::default()
    };
    let mut w = WorkerProc::start(&redis, &db, "w1", &opts);
    wait_orders(&db, sale, 100, LONG);
    w.signal("-TERM");
    let status = w.wait_exit(LONG);
    assert_eq!(status.code(), Some(0));

    // Nothing half-applied: every order has its ledger row and decrement,
    // and what was not applied is still queued, not stranded in processing.
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    let orders = db.count("SELECT COUNT(*) FROM orders");
    assert!((100..=2000).contains(&orders));
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), orders);
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        2000 - orders
    );
    let queued: i64 = con.llen(k.queue()).unwrap();
    assert_eq!(queued, 2000 - orders);
    let held: i64 = con.llen(k.processing("w1")).unwrap();
    assert_eq!(held, 0);
    let hb: bool = con.exists(keys::worker_heartbeat("w1")).unwrap();
    assert!(!hb, "heartbeat deleted on exit");
    // Its processing lists empty, the stopped worker left the registry: no
    // reclaim scan or reconciliation visits it any more.
    let registered: Vec<String> = con.smembers(keys::WORKERS).unwrap();
    assert!(registered.is_empty(), "{registered:?}");

    // A restart registers again and finishes the rest.
    let mut w = WorkerProc::start(&redis, &db, "w1", &opts);
    wait_orders(&db, sale, 2000, LONG);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 2000);
    let registered: Vec<String> = con.smembers(keys::WORKERS).unwrap();
    assert_eq!(registered, vec!["w1".to_string()]);
    w.signal("-TERM");
    assert_eq!(w.wait_exit(LONG).code(), Some(0));
    let registered: Vec<String> = con.smembers(keys::WORKERS).unwrap();
    assert!(registered.is_empty(), "{registered:?}");
}

#[test]
fn sigint_and_sighup_stop_a_busy_worker_as_sigterm_does() {
    // SIGTERM and SIGHUP are read by the signal thread, SIGINT by the
    // Ctrl-C handler: each stops the worker with exit 0, deregistered, and
    // nothing half-applied.
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 3000, -1000, 600_000);
    reserve_users(&redis, sale, "u", 3000);
    let opts = Opts {
        batch: 8,
        ..Opts::default()
    };
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    for (i, signal) in ["-INT", "-HUP", "-TERM"].iter().enumerate() {
        let mut w = WorkerProc::start(&redis, &db, "w1", &opts);
        wait_orders(&db, sale, 100 * (i as i64 + 1), LONG);
        w.signal(signal);
        assert_eq!(w.wait_exit(LONG).code(), Some(0), "{signal}");
        let orders = db.count("SELECT COUNT(*) FROM orders");
        assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), orders);
        let queued: i64 = con.llen(k.queue()).unwrap();
        assert_eq!(queued, 3000 - orders, "{signal}");
        let held: i64 = con.llen(k.processing("w1")).unwrap();
        assert_eq!(held, 0, "{signal}");
        let registered: Vec<String> = con.smembers(keys::WORKERS).unwrap();
        assert!(registered.is_empty(), "{signal}: {registered:?}");
    }
}

#[test]
fn a_bad_setting_exits_2() {
    let out = seckill_tests::command("seckill-worker")
        .env("SECKILL_WORKER_BATCH", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SECKILL_WORKER_BATCH"), "{err}");
}

#[test]
fn a_message_mysql_keeps_refusing_is_dead_lettered_after_max_attempts_and_the_rest_applied() {
    use mysql::prelude::Queryable;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    // A server error that no retry fixes, for one buyer only.
    db.conn()
        .query_drop(
            "CREATE TRIGGER poison BEFORE INSERT ON orders FOR EACH ROW \
             IF NEW.user_id = 'poison' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned order'; END IF",
        )
        .unwrap();
    reserve_users(&redis, sale, "u", 2);
    let mut con = redis.con();
    let r = seckill_common::reservation::reserve(&mut con, sale, "poison").unwrap();
    assert!(matches!(
        r,
        seckill_common::reservation::ReserveOutcome::Reserved(_)
    ));
    reserve_users(&redis, sale, "v", 2);

    let w = WorkerProc::start(
        &redis,
        &db,
        "w1",
        &Opts {
            max_attempts: 3,
            // Each attempt waits 1 s on the poisoned statement first.
            retry_for: Some("1s"),
            ..Opts::default()
        },
    );
    wait_orders(&db, sale, 4, LONG);
    seckill_tests::wait_until(LONG, "one dead letter", || {
        dead_letters(&redis, sale).len() == 1
    });
    wait_drained(&redis, sale, LONG);
    let d = dead_letters(&redis, sale);
    assert_eq!(d[0].attempts, 3);
    assert!(d[0].reason.starts_with("max attempts: "), "{:?}", d[0]);
    assert!(d[0].reason.contains("poisoned order"), "{:?}", d[0]);
    assert!(d[0].message.contains("\"user_id\":\"poison\""));
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 4);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 4);
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        6
    );
    let page = w.metrics();
    assert_eq!(metric(&page, "seckill_worker_requeued_total"), 2);
    assert_eq!(metric(&page, "seckill_worker_dead_lettered_total"), 1);
}
