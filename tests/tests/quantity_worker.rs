//! Specifies the worker on sales of several units per buyer: a message of
//! N units becomes one order of quantity N, one ledger row of delta −N and
//! N units off `available_stock`, exactly once across crashes; a message
//! MySQL's stock cannot cover is refused as the oversell guard refuses any
//! message; one that would take its buyer over the sale's limit in MySQL
//! is dead-lettered, the check reading only that batch's buyers' orders;
//! and the schema's migration to several units per purchase applies to a
//! database that holds orders already.

use crate::support::quantity::{self, books, num, redis_stock, reserve, Terms};
use crate::support::worker::{dead_letters, wait_drained, wait_orders, Opts, WorkerProc};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

/// Every order of `sale` has the quantity of its flow record's message, is
/// `confirmed` in Redis, with one ledger row of delta − its quantity.
fn assert_orders_match_flows(db: &TestDb, redis: &RedisServer, sale: u64) {
    let k = SaleKeys::new(sale);
    let flows: std::collections::HashMap<String, String> = redis.con().hgetall(k.flow()).unwrap();
    let rows: Vec<(String, u32, i64, bool)> = db
        .conn()
        .exec(
            "SELECT o.reservation_id, o.quantity, l.delta, o.multi_unit FROM orders o
             JOIN stock_ledger l ON l.reservation_id = o.reservation_id AND l.reason = 'order'
             WHERE o.sale_id = ?",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        rows.len(),
        flows.len(),
        "one order and one ledger row per flow record"
    );
    for (rid, q, delta, multi) in rows {
        let m = seckill_common::message::OrderMessage::parse(flows[&rid].as_bytes()).unwrap();
        assert_eq!(
            (q, delta, multi),
            (m.quantity, -i64::from(m.quantity), true),
            "{rid}"
        );
    }
    let st: Vec<String> = redis.con().hvals(k.status()).unwrap();
    assert!(st.iter().all(|s| s == "confirmed"), "{st:?}");
}

#[test]
fn messages_of_several_units_become_orders_in_units() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = quantity::create(&redis, &db, &file, &Terms::of(100));
    // 10 buyers with 3 + 1 units (two orders each, 4 units: their limit),
    // 5 buyers with 2 units: 25 reservations, 50 units.
    for i in 0..10 {
        reserve(&redis, sale, &format!("b{i}"), "k1", 3);
        reserve(&redis, sale, &format!("b{i}"), "k2", 1);
    }
    for i in 0..5 {
        reserve(&redis, sale, &format!("c{i}"), "k1", 2);
    }
    assert_eq!(redis_stock(&redis, sale), 50);
    let w = WorkerProc::start(
        &redis,
        &db,
        "w1",
        &Opts {
            batch: 8,
            ..Opts::default()
        },
    );
    wait_orders(&db, sale, 25, LONG);
    wait_drained(&redis, sale, LONG);
    assert_eq!(books(&db, sale), (25, 50, 50, 50));
    assert_orders_match_flows(&db, &redis, sale);
    assert!(dead_letters(&redis, sale).is_empty());
    assert_eq!(w.metric("seckill_worker_orders_applied_total"), 25);
    assert_eq!(
        num(
            &db,
            &format!("SELECT COUNT(DISTINCT user_id) FROM orders WHERE sale_id = {sale}")
        ),
        15
    );
    assert_eq!(quantity::findings(&redis, &db, &file), []);
}

#[test]
fn killed_mid_batch_every_message_of_several_units_applies_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = quantity::create(&redis, &db, &file, &Terms::of(300));
    for i in 0..60 {
        reserve(&redis, sale, &format!("u{i}"), "k", 3);
    }
    let crash = |at| Opts {
        batch: 16,
        crash_at: Some(at),
        ..Opts::default()
    };
    let mut w1 = WorkerProc::start(&redis, &db, "w1", &crash("after_move"));
    assert!(!w1.wait_exit(LONG).success());
    assert_eq!(books(&db, sale), (0, 0, 0, 300));
    let mut w2 = WorkerProc::start(&redis, &db, "w2", &crash("after_commit"));
    assert!(!w2.wait_exit(LONG).success());
    // 16 orders of 3 units committed, not settled in Redis.
    assert_eq!(books(&db, sale), (16, 48, 48, 252));
    let opts = Opts {
        batch: 16,
        ..Opts::default()
    };
    let w1 = WorkerProc::start(&redis, &db, "w1", &opts);
    let w2 = WorkerProc::start(&redis, &db, "w2", &opts);
    wait_orders(&db, sale, 60, LONG);
    wait_drained(&redis, sale, LONG);
    assert_eq!(books(&db, sale), (60, 180, 180, 120));
    assert_eq!(redis_stock(&redis, sale), 120);
    assert_orders_match_flows(&db, &redis, sale);
    let applied = w1.metric("seckill_worker_orders_applied_total")
        + w2.metric("seckill_worker_orders_applied_total");
    let again = w1.metric("seckill_worker_messages_already_done_total")
        + w2.metric("seckill_worker_messages_already_done_total");
    assert_eq!((applied, again), (60 - 16, 16));
    assert!(dead_letters(&redis, sale).is_empty());
    assert_eq!(quantity::findings(&redis, &db, &file), []);
}

#[test]
fn a_message_mysql_stock_cannot_cover_is_refused_alone() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let sale = quantity::create(
        &redis,
        &db,
        &review.path().join("r.sqlite3"),
        &Terms::of(10),
    );
    reserve(&redis, sale, "a", "k", 3);
    reserve(&redis, sale, "b", "k", 3);
    let c = reserve(&redis, sale, "c", "k", 3);
    // MySQL holds 7 units where Redis sold 9: the third message would
    // oversell (the guard's case, made here by hand).
    db.conn()
        .exec_drop("UPDATE sales SET available_stock = 7 WHERE id = ?", (sale,))
        .unwrap();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_drained(&redis, sale, LONG);
    let dead = dead_letters(&redis, sale);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].reason.as_str(), dead[0].reservation_id.as_deref()),
        ("stock exhausted in MySQL", Some(c.as_str()))
    );
    assert_eq!(books(&db, sale), (2, 6, 6, 1));
}

/// Buyer a's two messages of 3 units each (over the limit of 4: what
/// Redis refuses, written here by hand): the worker makes the first an
/// order and dead-letters the second with the figures (status `on_hold`,
/// nothing written to MySQL), whether they share a batch or not; b's
/// message beside them is applied.
#[test]
fn a_message_over_the_buyers_limit_in_mysql_is_dead_lettered_not_applied() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let sale = quantity::create(
        &redis,
        &db,
        &review.path().join("r.sqlite3"),
        &Terms::of(10),
    );
    reserve(&redis, sale, "a", "k1", 3);
    let over = reserve(&redis, sale, "a", "k2", 3);
    reserve(&redis, sale, "b", "k", 2);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_drained(&redis, sale, LONG);
    let dead = dead_letters(&redis, sale);
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].reason.as_str(), dead[0].reservation_id.as_deref()),
        (
            "buyer over limit in MySQL: the buyer's orders hold 3 unit(s), this message takes \
             3 more, max_per_buyer 4",
            Some(over.as_str())
        )
    );
    let status: Option<String> = redis
        .con()
        .hget(SaleKeys::new(sale).status(), &over)
        .unwrap();
    assert_eq!(status.as_deref(), Some("on_hold"));
    assert_eq!(books(&db, sale), (2, 5, 5, 5));
}

/// Applies migrations 1 to 8 only to database `db` (the schema a release
/// before several units per purchase left).
fn migrate_to_8(db: &TestDb) {
    let mut c = seckill_common::schema::connect(
        db.url().rsplit_once('/').unwrap().0,
        Duration::from_secs(10),
    )
    .unwrap();
    c.query_drop(format!("CREATE DATABASE `{}`", db.name))
        .unwrap();
    let mut c = db.conn();
    c.query_drop(
        "CREATE TABLE schema_migrations (version INT UNSIGNED NOT NULL PRIMARY KEY,
           description VARCHAR(255) NOT NULL,
           applied_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)))",
    )
    .unwrap();
    for (v, d, sql) in seckill_common::schema::MIGRATIONS
        .iter()
        .filter(|m| m.0 <= 8)
    {
        for stmt in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            c.query_drop(stmt).unwrap();
        }
        c.exec_drop(
            "INSERT INTO schema_migrations VALUES (?, ?, DEFAULT)",
            (v, d),
        )
        .unwrap();
    }
}

#[test]
fn the_units_migration_applies_to_a_database_with_orders() {
    let base = TestDb::create();
    let db = base.sibling("_old");
    migrate_to_8(&db);
    let mut c = db.conn();
    c.query_drop(
        "INSERT INTO sales (id, sku, total_stock, available_stock, starts_at, ends_at)
         VALUES (1, 'OLD', 10, 8, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR)",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, status) VALUES
           ('00000000000000000000000000000001', 1, 'a', 'confirmed'),
           ('00000000000000000000000000000002', 1, 'b', 'confirmed')",
    )
    .unwrap();
    let applied = seckill_common::schema::migrate(&db.url(), Duration::from_secs(10)).unwrap();
    assert_eq!(applied, [9, 10, 11]);
    assert_eq!(
        seckill_common::schema::migrate(&db.url(), Duration::from_secs(10)).unwrap(),
        Vec::<u32>::new()
    );
    let rows: Vec<(String, u32, bool, Option<String>)> = c
        .query("SELECT user_id, quantity, multi_unit, live_user_id FROM orders ORDER BY id")
        .unwrap();
    assert_eq!(
        rows,
        [
            ("a".into(), 1, false, Some("a".into())),
            ("b".into(), 1, false, Some("b".into()))
        ]
    );
    assert_eq!(
        c.query_first::<(u32, u32), _>("SELECT per_user_limit, max_per_purchase FROM sales")
            .unwrap(),
        Some((1, 1))
    );
    // One live order per buyer still, in a sale of one unit per buyer.
    let e = c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id) VALUES
           ('00000000000000000000000000000003', 1, 'a')",
    );
    assert!(format!("{e:?}").contains("orders_sale_live_user"), "{e:?}");
    // Several per buyer with multi_unit; a quantity of 0 and limits out of
    // bounds are refused by the CHECKs.
    c.query_drop(
        "INSERT INTO sales (id, sku, total_stock, available_stock, starts_at, ends_at,
                            per_user_limit, max_per_purchase)
         VALUES (2, 'NEW', 10, 10, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR, 4, 3)",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit) VALUES
           ('00000000000000000000000000000004', 2, 'a', 3, 1),
           ('00000000000000000000000000000005', 2, 'a', 1, 1)",
    )
    .unwrap();
    for bad in [
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit) VALUES \
         ('00000000000000000000000000000006', 2, 'z', 0, 1)",
        "UPDATE sales SET max_per_purchase = 5 WHERE id = 2",
        "UPDATE sales SET per_user_limit = 101 WHERE id = 2",
        "UPDATE sales SET per_user_limit = 0, max_per_purchase = 0 WHERE id = 2",
    ] {
        let e = c.query_drop(bad);
        assert!(format!("{e:?}").contains("CONSTRAINT"), "{bad}: {e:?}");
    }
}

/// The worker's check of a buyer's units reads that buyer's orders by
/// the index `orders_sale_buyer`, not every order of the sale: among 2,000
/// orders of 1,000 buyers, the units of 2 buyers (2 orders each) cost
/// MySQL 6 index reads (`Handler_read_key`, `Handler_read_next`), however
/// many orders the sale holds.
#[test]
fn a_buyers_units_are_read_from_their_own_orders_only() {
    let db = TestDb::create();
    seckill_common::schema::migrate(&db.url(), Duration::from_secs(10)).unwrap();
    let mut c = db.conn();
    c.query_drop(
        "INSERT INTO sales (id, sku, total_stock, available_stock, per_user_limit,
           max_per_purchase, starts_at, ends_at)
         VALUES (1, 'U', 10000, 4000, 4, 2, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3) + INTERVAL 1 HOUR)",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status)
         SELECT LPAD(HEX(seq), 32, '0'), 1, CONCAT('b', seq % 1000), 2, 1, 'confirmed'
         FROM seq_1_to_2000",
    )
    .unwrap();
    c.query_drop("ANALYZE TABLE orders").unwrap();
    let reads = |c: &mut mysql::Conn| -> u64 {
        let rows: Vec<(String, u64)> = c
            .query(
                "SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_next', \
                 'Handler_read_key', 'Handler_read_rnd_next')",
            )
            .unwrap();
        rows.iter().map(|r| r.1).sum()
    };
    let before = reads(&mut c);
    let held = seckill_common::buyer_units::held_units(&mut c, 1, &["b7", "b8"]).unwrap();
    let read = reads(&mut c) - before;
    let mut held: Vec<(String, u64)> = held.into_iter().collect();
    held.sort();
    assert_eq!(held, [("b7".to_string(), 4), ("b8".to_string(), 4)]);
    // One key looked up per buyer and one next entry per order of theirs
    // (2 + 4); by the sale's own index it is 2,036, every order of the sale.
    assert_eq!(read, 6, "rows read for 2 buyers' 4 orders");
}
