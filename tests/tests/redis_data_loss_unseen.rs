//! Specifies what happens when Redis loses a sale's keys before any worker
//! has seen them: a sale created with `sale create` (which records its load
//! in MySQL), 3,000 purchases answered 202 with no worker running, then an
//! eviction policy switched on live over the memory limit evicts every key.
//! The next `run` pauses the sale and opens one critical
//! `redis_data_loss` finding; purchases and the sale's page answer 503
//! `sale_paused` (not 404, not a fresh sale); `sale load` refuses it,
//! naming `sale repair`, and writes nothing; the repair puts every unit
//! MySQL did not sell back on sale (the 3,000 lost buyers are unknown to
//! MySQL: each may buy again). With a worker running from the start, the
//! same eviction is caught by its watch, naming the 3,000 lost orders.
//! A loaded sale that lost only its stock counter, or only its meta, is
//! paused the same way; so is a split sale whose buckets are all gone.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{Client, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{wait_until, RedisServer, TempDir, TestDb};
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

/// Units on sale.
const STOCK: u64 = 20_000;
/// Purchases answered 202 before the loss.
const BOUGHT: usize = 3_000;

fn reconciler(redis: &RedisServer, db: &TestDb, dir: &TempDir, args: &[&str]) -> (i32, String) {
    seckill_tests::reconciler(redis, db, &dir.path().join("review.sqlite3"), args)
}

fn config_set(redis: &RedisServer, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut redis.con())
        .unwrap();
}

/// `sale create` (the operator's command, which records the load), `stock`
/// units for an hour, split over `shards` buckets; the new id.
fn create(redis: &RedisServer, db: &TestDb, dir: &TempDir, stock: u64, shards: u32) -> u64 {
    let (stock, shards) = (stock.to_string(), shards.to_string());
    let (code, out) = reconciler(
        redis,
        db,
        dir,
        &[
            "sale",
            "create",
            "--sku",
            "HOT-1",
            "--stock",
            &stock,
            "--starts-at",
            "now",
            "--ends-at",
            "now+1h",
            "--shards",
            &shards,
        ],
    );
    assert_eq!(code, 0, "{out}");
    out.lines().find_map(|l| l.trim().parse().ok()).unwrap()
}

/// Users `u0` .. buying `n` units, each answered 202.
fn buy(c: &mut Client, sale: u64, n: usize) {
    for i in 0..n {
        let r = c.buy(sale, &format!("u{i}"));
        assert_eq!(r.status, 202, "u{i}: {r:?}");
    }
}

/// A full Redis whose policy is switched live to `allkeys-lru`: the limit
/// is set below what the sale holds (1 byte, so every key goes and the
/// outcome is exact), the policy switched, and the keys evicted at the
/// next command. Then the operator sets the policy back (every binary
/// refuses `allkeys-lru`) and lifts the limit.
fn evict_everything(redis: &RedisServer) {
    config_set(redis, "maxmemory", "1");
    config_set(redis, "maxmemory-policy", "allkeys-lru");
    wait_until(Duration::from_secs(10), "every key evicted", || {
        let n: u64 = redis::cmd("DBSIZE").query(&mut redis.con()).unwrap();
        n == 0
    });
    config_set(redis, "maxmemory-policy", "noeviction");
    config_set(redis, "maxmemory", "0");
}

/// The open findings, as `findings --json` lists them.
fn findings(redis: &RedisServer, db: &TestDb, dir: &TempDir) -> Vec<serde_json::Value> {
    let (code, listed) = reconciler(redis, db, dir, &["findings", "--json"]);
    assert_eq!(code, 0, "{listed}");
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    v.as_array().unwrap().clone()
}

/// One critical `redis_data_loss` finding, nothing else; its evidence.
fn one_critical_loss(redis: &RedisServer, db: &TestDb, dir: &TempDir) -> serde_json::Value {
    let all = findings(redis, db, dir);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["kind"], "redis_data_loss");
    assert_eq!(all[0]["severity"], "critical");
    all[0]["evidence"].clone()
}

fn paused_in_mysql(db: &TestDb, sale: u64) -> i64 {
    db.count(&format!(
        "SELECT COUNT(*) FROM sale_redis_state WHERE sale_id = {sale} \
         AND paused_reason = 'redis_data_loss'"
    ))
}

/// `sale load` of the lost sale: refused (exit 1), naming the repair, and
/// nothing written to Redis.
fn load_is_refused(redis: &RedisServer, db: &TestDb, dir: &TempDir, sale: u64) {
    let before = seckill_tests::sale_snapshot(&mut redis.con(), sale);
    let (code, out) = reconciler(redis, db, dir, &["sale", "load", &sale.to_string()]);
    assert_eq!(code, 1, "{out}");
    // Before a run paused it, the load finds the keys gone itself; after,
    // the sale's data-loss pause refuses it first: both name the repair.
    assert!(
        (out.contains("Redis has lost its stock counter or meta since")
            || out.contains(&format!("sale {sale} is paused (redis_data_loss)")))
            && out.contains(&format!("sale repair {sale} --by NAME"))
            && out.contains("nothing loaded"),
        "{out}"
    );
    assert_eq!(seckill_tests::sale_snapshot(&mut redis.con(), sale), before);
}

#[test]
fn keys_evicted_before_any_worker_ran_pause_the_sale_and_sale_load_refuses_it() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create(&redis, &db, &dir, STOCK, 1);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM sales WHERE id = {sale} AND loaded_at IS NOT NULL"
        )),
        1
    );
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    buy(&mut c, sale, BOUGHT);
    evict_everything(&redis);

    // No worker, no mark: until a run looks, the sale is unknown to Redis
    // (once the gateway's fitness check, every 100 ms, has seen
    // `noeviction` again: while it saw `allkeys-lru` it answered 503).
    wait_until(
        Duration::from_secs(5),
        "the gateway to take purchases again",
        || c.buy(sale, "early").error() != "unavailable",
    );
    assert_eq!(c.buy(sale, "early").error(), "sale_not_found");
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 0);

    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let evidence = one_critical_loss(&redis, &db, &dir);
    assert_eq!(evidence["detected_by"], "reconciler", "{evidence:#}");
    assert_eq!(evidence["keys_gone_in_buckets"], serde_json::json!([0]));
    assert_eq!(evidence["lost_orders"], 0);
    assert_eq!(evidence["orders_in_mysql"], 0);
    assert_eq!(evidence["reserved_at_last_marks"], 0);
    assert!(evidence["loaded_at"].is_string(), "{evidence:#}");
    assert_eq!(paused_in_mysql(&db, sale), 1);

    // Paused for every buyer and on the sale's page, not sold as new.
    wait_until(Duration::from_secs(2), "purchases paused", || {
        c.buy(sale, "late").error() == "sale_paused"
    });
    for i in [0, 1, BOUGHT - 1] {
        let r = c.buy(sale, &format!("u{i}"));
        assert_eq!((r.status, r.error().as_str()), (503, "sale_paused"));
    }
    let page = gateway_support::get(g.port, &format!("/v1/sales/{sale}"));
    assert_eq!((page.status, page.error().as_str()), (503, "sale_paused"));
    assert_eq!(page.header("Retry-After"), Some("1"));
    load_is_refused(&redis, &db, &dir, sale);

    // The next run finds nothing new: the same one finding.
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(" 0 new, "), "{out}");
    assert_eq!(findings(&redis, &db, &dir).len(), 1);

    // The repair offers every unit MySQL did not sell; the lost buyers
    // are unknown to MySQL, so one of them buys again.
    let (code, out) = reconciler(
        &redis,
        &db,
        &dir,
        &["sale", "repair", &sale.to_string(), "--by", "alice"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("stock {STOCK}")), "{out}");
    let stock: i64 = redis.con().get(SaleKeys::new(sale).stock()).unwrap();
    assert_eq!(stock, STOCK as i64);
    assert_eq!(paused_in_mysql(&db, sale), 0);
    for u in ["u0", "new"] {
        wait_until(Duration::from_secs(2), "the sale sells again", || {
            c.buy(sale, u).status == 202
        });
    }
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, Duration::from_secs(20));
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" 0 new, "), "{out}");
}

#[test]
fn keys_evicted_under_a_running_worker_pause_the_sale_naming_every_lost_order() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create(&redis, &db, &dir, STOCK, 1);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    buy(&mut c, sale, BOUGHT);
    wait_orders(&db, sale, BOUGHT as i64, Duration::from_secs(60));
    evict_everything(&redis);

    // The worker's watch pauses it, no run needed.
    wait_until(Duration::from_secs(5), "paused by the worker", || {
        paused_in_mysql(&db, sale) == 1
    });
    wait_until(Duration::from_secs(2), "purchases paused", || {
        c.buy(sale, "late").error() == "sale_paused"
    });
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let evidence = one_critical_loss(&redis, &db, &dir);
    assert_eq!(evidence["paused"], "redis_data_loss", "{evidence:#}");
    assert_eq!(evidence["lost_orders"], BOUGHT);
    assert_eq!(evidence["orders_in_mysql"], BOUGHT);
    assert_eq!(evidence["keys_gone_in_buckets"], serde_json::json!([0]));
    load_is_refused(&redis, &db, &dir, sale);
}

/// A run that saw the sale before the loss left its mark: the evidence
/// then counts the acknowledged purchases MySQL holds no order of.
#[test]
fn a_run_before_the_loss_lets_the_finding_count_the_lost_purchases() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create(&redis, &db, &dir, 500, 1);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    buy(&mut c, sale, 300);
    // The timer's run, with the default grace: the reservations are young.
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", dir.path().join("review.sqlite3"))
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for i in 300..320 {
        assert_eq!(c.buy(sale, &format!("u{i}")).status, 202);
    }
    evict_everything(&redis);
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let evidence = one_critical_loss(&redis, &db, &dir);
    // 320 were acknowledged; the 20 after the mark are counted nowhere.
    assert_eq!(evidence["reserved_at_last_marks"], 300, "{evidence:#}");
    assert_eq!(evidence["reserved_without_order_at_last_marks"], 300);
}

/// Only the stock counter lost (the meta kept: the sale's page said
/// `sold_out`), or only the meta (the stock and records kept): each is a
/// loss of a loaded sale, paused by the run, with no worker.
#[test]
fn a_loaded_sale_that_lost_its_stock_or_its_meta_alone_is_paused() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    let mut sales = Vec::new();
    for lose_meta in [false, true] {
        let sale = create(&redis, &db, &dir, 50, 1);
        buy(&mut c, sale, 10);
        let k = SaleKeys::new(sale);
        let lost = if lose_meta { k.meta() } else { k.stock() };
        let _: () = redis.con().del(lost).unwrap();
        sales.push(sale);
    }
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let mut all = findings(&redis, &db, &dir);
    all.sort_by_key(|f| f["sale_id"].as_u64());
    assert_eq!(all.len(), 2, "{all:#?}");
    for (f, sale) in all.iter().zip(&sales) {
        assert_eq!(f["kind"], "redis_data_loss", "{f:#}");
        assert_eq!(f["severity"], "critical");
        assert_eq!(f["sale_id"], *sale, "{f:#}");
        assert_eq!(paused_in_mysql(&db, *sale), 1);
        wait_until(Duration::from_secs(2), "purchases paused", || {
            c.buy(*sale, "late").error() == "sale_paused"
        });
        load_is_refused(&redis, &db, &dir, *sale);
    }
}

/// A split sale whose buckets are all gone, no worker: `sales.buckets`
/// tells the run every bucket; each is paused, the load refused, and the
/// repair rebuilds all three with their shares.
#[test]
fn a_split_sale_whose_buckets_are_all_gone_is_paused_and_repaired_whole() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create(&redis, &db, &dir, 9, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    buy(&mut c, sale, 4);
    evict_everything(&redis);
    let (code, out) = reconciler(&redis, &db, &dir, &["run"]);
    assert_eq!(code, 1, "{out}");
    let evidence = one_critical_loss(&redis, &db, &dir);
    assert_eq!(
        evidence["keys_gone_in_buckets"],
        serde_json::json!([0, 1, 2])
    );
    let mut con = redis.con();
    for b in 0..3 {
        let p: Option<String> = con
            .hget(SaleKeys::bucket(sale, b).meta(), "paused")
            .unwrap();
        assert_eq!(p.as_deref(), Some("redis_data_loss"), "bucket {b}");
    }
    wait_until(Duration::from_secs(2), "purchases paused", || {
        c.buy(sale, "late").error() == "sale_paused"
    });
    load_is_refused(&redis, &db, &dir, sale);
    let (code, out) = reconciler(
        &redis,
        &db,
        &dir,
        &["sale", "repair", &sale.to_string(), "--by", "alice"],
    );
    assert_eq!(code, 0, "{out}");
    let stocks: Vec<i64> = (0..3)
        .map(|b| con.get(SaleKeys::bucket(sale, b).stock()).unwrap())
        .collect();
    assert_eq!(stocks, [3, 3, 3]);
    let k: Option<u32> = con.hget(SaleKeys::new(sale).meta(), "buckets").unwrap();
    assert_eq!(k, Some(3));
}
