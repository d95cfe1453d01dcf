//! Specifies the worker's crash safety with real processes and signals: a
//! worker killed right after it moved a batch (before MySQL) or right after
//! the MySQL commit (before the Redis clean-up), and a worker paused with
//! SIGSTOP past its heartbeat whose batch another worker reclaimed, all end
//! with every order exactly once.
//!
//! The exact crash points use the test-only `SECKILL_WORKER_CRASH_AT`
//! (`after_move`, `after_commit`: `abort()`, no clean-up, like `kill -9`;
//! `stop_after_move`: the worker sends itself SIGSTOP). The first runs on
//! one Redis and on a real Redis Cluster.

use crate::support::worker as support;

use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Duration;
use support::{assert_exactly_once, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

fn processing_len(redis: &impl TestRedis, sale: u64, worker: &str) -> usize {
    redis
        .target_con()
        .llen(SaleKeys::new(sale).processing(worker))
        .unwrap()
}

fn registered(redis: &impl TestRedis) -> Vec<String> {
    let mut ids: Vec<String> = redis.target_con().smembers(keys::WORKERS).unwrap();
    ids.sort();
    ids
}

#[test]
fn killed_after_the_move_and_after_the_commit_then_restarted_every_order_exactly_once() {
    killed_twice_then_restarted(&RedisServer::start());
}

#[test]
fn on_a_redis_cluster_killed_after_the_move_and_after_the_commit_every_order_exactly_once() {
    killed_twice_then_restarted(&RedisCluster::start());
}

fn killed_twice_then_restarted(redis: &impl TestRedis) {
    let db = TestDb::create();
    let sale = create_sale(&db, redis, 500, -1000, 600_000);
    reserve_users(redis, sale, "u", 500);
    let crash = |at| Opts {
        batch: 16,
        crash_at: Some(at),
        ..Opts::default()
    };

    // w1 dies holding a batch MySQL never saw.
    let mut w1 = WorkerProc::start(redis, &db, "w1", &crash("after_move"));
    let st = w1.wait_exit(LONG);
    assert!(!st.success(), "{st:?}");
    assert_eq!(processing_len(redis, sale, "w1"), 16);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 0);
    // A crash leaves it registered, so the others find and reclaim its list.
    assert_eq!(registered(redis), ["w1"]);

    // w2 dies after committing its batch, before settling it in Redis.
    let mut w2 = WorkerProc::start(redis, &db, "w2", &crash("after_commit"));
    let st = w2.wait_exit(LONG);
    assert!(!st.success(), "{st:?}");
    assert_eq!(processing_len(redis, sale, "w2"), 16);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 16);
    assert_eq!(registered(redis), ["w1", "w2"]);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 16);
    let confirmed: Vec<String> = redis
        .target_con()
        .hvals(SaleKeys::new(sale).status())
        .unwrap();
    assert_eq!(confirmed.iter().filter(|s| *s == "confirmed").count(), 0);

    // Both come back: their lists are reclaimed and re-applied harmlessly.
    let opts = Opts {
        batch: 16,
        ..Opts::default()
    };
    let w1 = WorkerProc::start(redis, &db, "w1", &opts);
    let w2 = WorkerProc::start(redis, &db, "w2", &opts);
    wait_orders(&db, sale, 500, LONG);
    wait_drained(redis, sale, LONG);
    assert_exactly_once(&db, redis, sale, 500);
    let applied = w1.metric("seckill_worker_orders_applied_total")
        + w2.metric("seckill_worker_orders_applied_total");
    let again = w1.metric("seckill_worker_messages_already_done_total")
        + w2.metric("seckill_worker_messages_already_done_total");
    assert_eq!((applied, again), (500 - 16, 16));
}

#[test]
fn a_paused_worker_whose_batch_was_reclaimed_resumes_without_a_double_effect() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 200, -1000, 600_000);
    reserve_users(&redis, sale, "u", 200);
    let opts = Opts {
        batch: 50,
        heartbeat_ttl: "1s",
        ..Opts::default()
    };

    let w1 = WorkerProc::start(
        &redis,
        &db,
        "w1",
        &Opts {
            crash_at: Some("stop_after_move"),
            ..opts.clone()
        },
    );
    seckill_tests::wait_until(LONG, "w1 to stop itself", || {
        seckill_tests::is_stopped(w1.pid())
    });
    assert_eq!(processing_len(&redis, sale, "w1"), 50);
    let mut con = redis.con();
    seckill_tests::wait_until(LONG, "w1's heartbeat to expire", || {
        !con.exists::<_, bool>(keys::worker_heartbeat("w1")).unwrap()
    });

    // w2 reclaims w1's batch and applies everything.
    let w2 = WorkerProc::start(&redis, &db, "w2", &opts);
    wait_orders(&db, sale, 200, LONG);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 200);
    assert_eq!(w2.metric("seckill_worker_reclaimed_total"), 50);
    assert_eq!(w2.metric("seckill_worker_orders_applied_total"), 200);

    // w1 resumes mid-batch: it applies the same 50 again, changing nothing.
    w1.signal("-CONT");
    seckill_tests::wait_until(LONG, "w1 to finish its batch", || {
        w1.metric("seckill_worker_messages_already_done_total") == 50
    });
    assert_eq!(w1.metric("seckill_worker_orders_applied_total"), 0);
    assert_exactly_once(&db, &redis, sale, 200);
}

/// The crash points are in no build but the tests': `seckill-worker`'s
/// `crash-points` feature exists, is not a default feature, and no
/// workspace crate enables it through a dependency (which, by feature
/// unification, would put it in `cargo build --release`). Only the test
/// build names it (`scripts/test.sh`: `--features
/// seckill-worker/crash-points`); the worker's unit test
/// `crash::tests::without_the_feature_every_value_is_ignored` checks that a
/// build without it ignores `SECKILL_WORKER_CRASH_AT`.
#[test]
fn crash_points_are_a_feature_no_crate_and_no_default_enables() {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let worker = packages
        .iter()
        .find(|p| p["name"] == "seckill-worker")
        .expect("seckill-worker in the workspace");
    let features = worker["features"].as_object().expect("features");
    assert!(features.contains_key("crash-points"), "{features:?}");
    let default = features.get("default").cloned().unwrap_or_default();
    assert!(
        !default.to_string().contains("crash-points"),
        "default features of seckill-worker: {default}"
    );
    let mut enabling = Vec::new();
    for p in packages {
        for d in p["dependencies"].as_array().expect("dependencies") {
            let turns_on = d["features"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "crash-points"));
            if d["name"] == "seckill-worker" && turns_on {
                enabling.push(format!("{} depends on it: {d}", p["name"]));
            }
        }
        if p["name"] == "seckill-worker" {
            continue;
        }
        for (name, list) in p["features"].as_object().expect("features") {
            if list.to_string().contains("crash-points") {
                enabling.push(format!("{} has feature {name} = {list}", p["name"]));
            }
        }
    }
    assert_eq!(enabling, Vec::<String>::new());
}
