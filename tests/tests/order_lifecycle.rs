//! Specifies the order lifecycle with real processes: a sale with a
//! payment window makes `pending_payment` orders; those left unpaid expire
//! and their units go back on sale exactly once, in MySQL and in Redis,
//! even when the sweeping worker is killed between the two steps; and the
//! returned units sell again. A sale without a window behaves as before
//! (`confirmed` at creation; the other worker tests).

use crate::support::worker as support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::time::{Duration, Instant};
use support::{dead_letters, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

/// A sale of `stock` units with `--payment-window window`
/// ([`seckill_tests::create_windowed_sale`], with a review file of its own).
fn create_windowed_sale(redis: &RedisServer, db: &TestDb, stock: u64, window: &str) -> u64 {
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    seckill_tests::create_windowed_sale(redis, db, &file, stock, window)
}

fn count(db: &TestDb, sql: &str) -> i64 {
    db.count(sql)
}

fn status_count(db: &TestDb, sale: u64, status: &str) -> i64 {
    count(
        db,
        &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = '{status}'"),
    )
}

fn redis_stock(redis: &RedisServer, sale: u64) -> i64 {
    redis
        .con()
        .get::<_, Option<i64>>(SaleKeys::new(sale).stock())
        .unwrap()
        .unwrap_or(-1)
}

fn releases(redis: &RedisServer, sale: u64) -> i64 {
    redis
        .con()
        .hget::<_, _, Option<i64>>(SaleKeys::new(sale).meta(), "releases")
        .unwrap()
        .unwrap_or(0)
}

/// Asserts the books of a sale where `released` units were released and
/// `held` orders hold one: MySQL (available, ledger rows, Redis marks) and
/// Redis (stock, releases counted once each, flow records moved).
fn assert_released_once(
    db: &TestDb,
    redis: &RedisServer,
    sale: u64,
    total: i64,
    released: i64,
    held: i64,
) {
    let ledger_release = count(
        db,
        &format!("SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release' AND delta = 1"),
    );
    assert_eq!(ledger_release, released, "release ledger rows");
    let available = count(
        db,
        &format!("SELECT available_stock FROM sales WHERE id = {sale}"),
    );
    assert_eq!(available, total - held, "available_stock");
    let undone = count(
        db,
        &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status IN ('expired','cancelled') AND redis_released_at IS NULL"),
    );
    assert_eq!(
        undone, 0,
        "released orders whose Redis step is not marked done"
    );
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    let flows: i64 = con.hlen(k.flow()).unwrap();
    let moved: i64 = con.hlen(k.released()).unwrap();
    assert_eq!(
        (moved, flows),
        (released, held),
        "released / flow records in Redis"
    );
    assert_eq!(releases(redis, sale), released, "meta releases");
    assert_eq!(redis_stock(redis, sale), total - held, "Redis stock");
}

fn reconcile_clean(redis: &RedisServer, db: &TestDb) {
    let review = TempDir::new();
    let (code, out) =
        seckill_tests::reconciler(redis, db, &review.path().join("review.sqlite3"), &["run"]);
    assert_eq!(code, 0, "reconciler run: {out}");
    let (code, out) = seckill_tests::reconciler(
        redis,
        db,
        &review.path().join("review.sqlite3"),
        &["findings", "--state", "all", "--json"],
    );
    assert_eq!((code, out.trim()), (0, "[]"), "findings");
}

#[test]
fn unpaid_orders_expire_once_and_their_units_sell_again() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_windowed_sale(&redis, &db, 200, "2s");
    reserve_users(&redis, sale, "a", 200);
    assert_eq!(redis_stock(&redis, sale), 0);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 200, LONG);
    // Pending with a deadline 2 s after each reservation (none can have
    // expired yet unless the worker took 2 s to apply them).
    let with_deadline = count(
        &db,
        &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND pay_by = reserved_at + INTERVAL 2 SECOND"),
    );
    assert_eq!(with_deadline, 200);
    let last_deadline_ms = count(
        &db,
        &format!("SELECT CAST(MAX(UNIX_TIMESTAMP(pay_by)) * 1000 AS SIGNED) FROM orders WHERE sale_id = {sale}"),
    ) as u64;
    seckill_tests::wait_until(LONG, "200 units back in Redis", || {
        redis_stock(&redis, sale) == 200
    });
    let lag_ms = seckill_common::now_ms().saturating_sub(last_deadline_ms);
    eprintln!("deadline -> unit back on sale in Redis (last of 200, 20 ms polling): {lag_ms} ms");
    seckill_tests::wait_until(LONG, "the Redis steps marked", || {
        count(&db, &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND redis_released_at IS NOT NULL")) == 200
    });
    assert_eq!(status_count(&db, sale, "expired"), 200);
    assert_released_once(&db, &redis, sale, 200, 200, 0);
    let k = SaleKeys::new(sale);
    let st: Option<String> = redis
        .con()
        .hget(k.status(), {
            let ids: Vec<String> = redis.con().hkeys(k.released()).unwrap();
            ids[0].clone()
        })
        .unwrap();
    assert_eq!(st.as_deref(), Some("expired"));
    reconcile_clean(&redis, &db);

    // The default sale keeps the buyer mark: the same buyers are refused,
    // new ones buy the returned units.
    let r = seckill_common::reservation::reserve(&mut redis.con(), sale, "a-0").unwrap();
    assert!(
        matches!(
            r,
            seckill_common::reservation::ReserveOutcome::AlreadyPurchased(_)
        ),
        "{r:?}"
    );
    reserve_users(&redis, sale, "b", 200);
    assert_eq!(redis_stock(&redis, sale), 0);
    wait_orders(&db, sale, 400, LONG);
    assert_eq!(
        status_count(&db, sale, "pending_payment") + status_count(&db, sale, "expired"),
        400
    );
}

#[test]
fn killed_between_the_mysql_and_the_redis_step_each_unit_is_released_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_windowed_sale(&redis, &db, 100, "1ms");
    reserve_users(&redis, sale, "u", 100);
    let crash = |at| Opts {
        batch: 16,
        crash_at: Some(at),
        ..Opts::default()
    };
    // Each round: one worker dies right after a pass expired up to 16
    // orders in MySQL, the next right after one Redis step (before its
    // MySQL mark).
    for round in 0..4 {
        for (i, at) in ["expire_after_mysql", "expire_after_redis"]
            .into_iter()
            .enumerate()
        {
            let mut w = WorkerProc::start(&redis, &db, &format!("w{round}{i}"), &crash(at));
            let st = w.wait_exit(LONG);
            assert!(!st.success(), "{at}: {st:?}");
        }
        let expired = status_count(&db, sale, "expired");
        assert!(expired > 0, "round {round}: something expired");
        // Never more units in Redis than MySQL released.
        assert!(releases(&redis, sale) <= expired, "round {round}");
    }
    let _w = WorkerProc::start(&redis, &db, "w-final", &Opts::default());
    seckill_tests::wait_until(
        LONG,
        "every order expired and its Redis step marked",
        || {
            count(&db, &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'expired' AND redis_released_at IS NOT NULL")) == 100
        },
    );
    assert_released_once(&db, &redis, sale, 100, 100, 0);
    reconcile_clean(&redis, &db);
}

#[test]
fn a_release_done_in_mysql_only_is_completed_by_the_reconciler_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_windowed_sale(&redis, &db, 10, "1ms");
    reserve_users(&redis, sale, "u", 10);
    // The worker dies after expiring the 10 in MySQL, before any Redis step.
    let mut w = WorkerProc::start(
        &redis,
        &db,
        "w1",
        &Opts {
            crash_at: Some("expire_after_mysql"),
            ..Opts::default()
        },
    );
    assert!(!w.wait_exit(LONG).success());
    assert_eq!(status_count(&db, sale, "expired"), 10);
    assert_eq!((redis_stock(&redis, sale), releases(&redis, sale)), (0, 0));
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");
    let (_, json) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["findings", "--state", "all", "--json"],
    );
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let kinds: Vec<(&str, &str)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["kind"].as_str().unwrap(), f["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![("released_in_mysql_held_in_redis", "auto_fixed"); 10]
    );
    assert_released_once(&db, &redis, sale, 10, 10, 0);
    // A worker afterwards, and a second run, change nothing.
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    std::thread::sleep(Duration::from_millis(500));
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");
    assert_released_once(&db, &redis, sale, 10, 10, 0);
    let _ = Instant::now();
}

/// A worker dies right after committing a batch of a windowed sale; the
/// orders expire and their units go back on sale before another worker
/// reclaims the dead one's processing list. The redelivered messages are
/// of released units: they leave the list with no dead letter and no
/// finding (a fence that dead-lettered each would leave one open finding
/// per unit for a person).
#[test]
fn redelivered_messages_of_released_units_are_settled_without_dead_letters() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_windowed_sale(&redis, &db, 20, "1ms");
    reserve_users(&redis, sale, "u", 20);
    let mut dying = WorkerProc::start(
        &redis,
        &db,
        "w-dies",
        &Opts {
            batch: 32,
            crash_at: Some("after_commit"),
            ..Opts::default()
        },
    );
    assert!(!dying.wait_exit(LONG).success(), "the crash point fired");
    assert_eq!(
        status_count(&db, sale, "pending_payment") + status_count(&db, sale, "expired"),
        20
    );
    let _w = WorkerProc::start(&redis, &db, "w-lives", &Opts::default());
    seckill_tests::wait_until(LONG, "every unit released in MySQL and Redis", || {
        count(&db, &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'expired' AND redis_released_at IS NOT NULL")) == 20
    });
    // The dead worker's list is reclaimed (heartbeat TTL 3 s) and drained.
    wait_drained(&redis, sale, LONG);
    assert_eq!(dead_letters(&redis, sale).len(), 0);
    assert_released_once(&db, &redis, sale, 20, 20, 0);
    reconcile_clean(&redis, &db);
}
