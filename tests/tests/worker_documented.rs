//! Specifies documented worker behaviours no other test exercises: a
//! message in another sale's queue is dead-lettered at once with its
//! reason and makes no order; a worker goes on after its Redis restarts
//! (AOF on), ordering what was queued before and after; a busy sale
//! does not starve a quiet one (one batch per sale per pass); and bad
//! values of other binaries' variables do not stop a worker.

use crate::support::worker as worker_support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{dead_letters, reserve_users, wait_orders, Opts, WorkerProc};

#[test]
fn a_message_in_another_sales_queue_is_dead_lettered_at_once() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let a = create_sale(&db, &redis, 5, -1000, 600_000);
    let b = create_sale(&db, &redis, 5, -1000, 600_000);
    reserve_users(&redis, a, "a", 1);
    // Move sale a's message onto sale b's queue.
    let mut con = redis.con();
    let msg: String = con.rpop(SaleKeys::new(a).queue(), None).unwrap();
    let _: () = con.lpush(SaleKeys::new(b).queue(), &msg).unwrap();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(Duration::from_secs(20), "the dead letter", || {
        dead_letters(&redis, b).len() == 1
    });
    let d = &dead_letters(&redis, b)[0];
    assert_eq!(
        d.reason,
        format!("order message for sale {a} in the queue of sale {b}")
    );
    assert_eq!((d.attempts, d.message.as_str()), (0, msg.as_str()));
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 0);
    // Settled in the keys of the queue it was found in (one hash tag per
    // batch); sale a's own status still says queued, and a's flow record
    // without an order is the reconciler's flow_without_order.
    let rid = d.reservation_id.as_deref().unwrap();
    let in_b: Option<String> = con.hget(SaleKeys::new(b).status(), rid).unwrap();
    let in_a: Option<String> = con.hget(SaleKeys::new(a).status(), rid).unwrap();
    assert_eq!(
        (in_b.as_deref(), in_a.as_deref()),
        (Some("on_hold"), Some("queued"))
    );
}

/// The worker reads only its own settings (`worker/src/config.rs`): bad
/// values of the gateway's and the reconciler's variables, set in a shared
/// environment file, do not stop it.
#[test]
fn a_bad_value_of_a_gateway_or_reconciler_variable_does_not_stop_the_worker() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let opts = Opts {
        env: &[
            ("SECKILL_GATEWAY_BUYER_RATE", "lots"),
            ("SECKILL_LISTEN", "8080"),
            ("SECKILL_AUTH", "JWT"),
            ("SECKILL_ARCHIVE_AFTER", "abc"),
        ],
        ..Opts::default()
    };
    let _w = WorkerProc::start(&redis, &db, "w1", &opts);
    reserve_users(&redis, sale, "u", 3);
    wait_orders(&db, sale, 3, Duration::from_secs(20));
    worker_support::assert_exactly_once(&db, &redis, sale, 10);
}

#[test]
fn a_worker_goes_on_after_its_redis_restarts() {
    let mut redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 20, -1000, 600_000);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    reserve_users(&redis, sale, "before", 5);
    wait_orders(&db, sale, 5, Duration::from_secs(20));
    redis.stop();
    std::thread::sleep(Duration::from_millis(500));
    redis.restart();
    // A restarted server holds purchases until the worker's data-loss
    // watch has checked the sale on it (its two stamps equal again).
    let k = seckill_common::keys::SaleKeys::new(sale);
    seckill_tests::wait_until(Duration::from_secs(20), "the watch's check", || {
        let stamps: (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(k.meta())
            .arg(seckill_common::data_loss::STAMP_FIELD)
            .arg(seckill_common::data_loss::LOCAL_STAMP_FIELD)
            .query(&mut redis.con())
            .unwrap_or_default();
        stamps.0 == stamps.1
    });
    reserve_users(&redis, sale, "after", 5);
    wait_orders(&db, sale, 10, Duration::from_secs(30));
    worker_support::assert_exactly_once(&db, &redis, sale, 20);
}

/// docs/DESIGN.md "Fair over many sales": each pass takes at most one batch
/// from every sale. With 500 messages queued for a busy sale and 1 for a
/// quiet one, the quiet sale's order is committed in the first pass: either
/// before the busy sale's first batch, or right after it — never behind
/// more of the busy sale's orders (the orders' auto-increment ids give the
/// commit order of the one worker).
#[test]
fn a_busy_sale_does_not_starve_a_quiet_one() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let busy = create_sale(&db, &redis, 500, -1000, 600_000);
    let quiet = create_sale(&db, &redis, 5, -1000, 600_000);
    reserve_users(&redis, busy, "busy", 500);
    reserve_users(&redis, quiet, "quiet", 1);
    let opts = Opts {
        batch: 10,
        ..Opts::default()
    };
    let _w = WorkerProc::start(&redis, &db, "w1", &opts);
    wait_orders(&db, busy, 500, Duration::from_secs(60));
    wait_orders(&db, quiet, 1, Duration::from_secs(20));
    let before_quiet = db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE id < (SELECT id FROM orders WHERE sale_id = {quiet})"
    ));
    assert!(
        before_quiet == 0 || before_quiet == 10,
        "{before_quiet} orders of the busy sale were committed before the quiet sale's one"
    );
}
