//! A replica the reconciler must not believe (`SECKILL_MYSQL_REPLICA_URL`):
//! one that reached the primary's GTID position but missed an event (a
//! delete made on the primary with `sql_log_bin = 0`), and a stale copy
//! named as the replica of a primary without a binary log (its position is
//! empty, so nothing can be checked). Both hold orders the primary lost;
//! a run with them reports exactly what a run on the primary alone does.

use crate::support::worker as worker_support;

use mysql::prelude::Queryable;
use seckill_tests::mariadb::MariaDb;
use seckill_tests::{create_sale, RedisServer, TempDir, TestDb};
use std::path::Path;
use std::time::Duration;
use worker_support::{wait_drained, wait_orders, Opts, WorkerProc};

/// `seckill-reconciler run` on `db`, with `replica` as
/// `SECKILL_MYSQL_REPLICA_URL` when given: exit code, stderr, and the
/// metrics file's `seckill_reconciler_replica_used` (-1 without it).
fn run(redis: &RedisServer, db: &TestDb, replica: Option<&str>, dir: &Path) -> (i32, String, f64) {
    let metrics = dir.join("reconciler.prom");
    let _ = std::fs::remove_file(&metrics);
    let mut c = seckill_tests::command("seckill-reconciler");
    c.arg("run")
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_REVIEW_DB", dir.join("review.sqlite3"))
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .env("SECKILL_RECONCILER_METRICS_FILE", &metrics);
    if let Some(url) = replica {
        c.env("SECKILL_MYSQL_REPLICA_URL", url)
            .env("SECKILL_MYSQL_REPLICA_WAIT", "10s");
    }
    let out = c.output().expect("run seckill-reconciler");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("{err}");
    let used = std::fs::read_to_string(&metrics)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("seckill_reconciler_replica_used "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0);
    (out.status.code().unwrap_or(-1), err, used)
}

/// `(kind, subject)` of every finding of the review file in `dir`.
fn findings(redis: &RedisServer, db: &TestDb, dir: &Path) -> Vec<(String, String)> {
    let out = seckill_tests::command("seckill-reconciler")
        .args(["findings", "--state", "all", "--json"])
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_REVIEW_DB", dir.join("review.sqlite3"))
        .output()
        .expect("findings");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut k: Vec<_> = v
        .iter()
        .map(|f| {
            let s = |n: &str| f[n].as_str().unwrap_or_default().to_string();
            (s("kind"), s("subject"))
        })
        .collect();
    k.sort();
    k
}

/// A sale of 100 with 3 orders a real worker wrote to `db`; its id.
fn three_orders(db: &TestDb, redis: &RedisServer) -> u64 {
    let sale = create_sale(db, redis, 100, -1000, 3_600_000);
    worker_support::reserve_users(redis, sale, "buyer", 3);
    let worker = WorkerProc::start(redis, db, "w1", &Opts::default());
    wait_orders(db, sale, 3, Duration::from_secs(60));
    wait_drained(redis, sale, Duration::from_secs(30));
    drop(worker);
    sale
}

/// The SQL that deletes `sale`'s order of `buyer-0` and its ledger row.
fn lose_order(sale: u64) -> String {
    format!(
        "DELETE FROM stock_ledger WHERE sale_id = {sale} AND user_id = 'buyer-0'; \
         DELETE FROM orders WHERE sale_id = {sale} AND user_id = 'buyer-0'"
    )
}

/// Runs with and without `replica` (each its own review file) and checks
/// they report the same non-empty findings; returns the run's
/// `replica_used`.
fn same_as_primary(redis: &RedisServer, db: &TestDb, replica: &str, says: &str) -> f64 {
    let (alone, with) = (TempDir::new(), TempDir::new());
    let (code, _, _) = run(redis, db, None, alone.path());
    assert_eq!(code, 1, "the primary shows the lost order");
    let expected = findings(redis, db, alone.path());
    assert!(
        expected.iter().any(|(k, _)| k == "flow_without_order"),
        "{expected:?}"
    );
    let (code, err, used) = run(redis, db, Some(replica), with.path());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(says), "{err}");
    assert_eq!(findings(redis, db, with.path()), expected);
    println!("{expected:?}, replica_used {used}");
    used
}

#[test]
fn a_replica_that_missed_an_event_is_not_believed() {
    let (primary, replica) = MariaDb::primary_and_replica();
    let db = primary.test_db();
    let redis = RedisServer::start();
    let sale = three_orders(&db, &redis);
    let orders = format!("SELECT COUNT(*) FROM `{}`.orders", db.name);
    seckill_tests::wait_until(Duration::from_secs(30), "the replica's 3 orders", || {
        replica.conn().query_first::<i64, _>(&orders).ok().flatten() == Some(3)
    });
    // On the primary alone: the replica never hears of it.
    let mut c = db.conn();
    c.query_drop(format!("SET SESSION sql_log_bin = 0; {}", lose_order(sale)))
        .expect("delete on the primary alone");
    drop(c);
    let _ = same_as_primary(
        &redis,
        &db,
        &replica.url(&db.name),
        "the replica's rows differ from the primary's",
    );
}

/// Copies every table of `from` into `to` (migrated, so the tables exist)
/// on `server`, generated columns left to the server.
fn copy_tables(server: &MariaDb, from: &str, to: &str) {
    let mut c = server.conn();
    let tables: Vec<String> = c
        .exec(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
            (from,),
        )
        .expect("tables");
    for t in tables {
        let cols: Vec<String> = c
            .exec(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = ? \
                 AND table_name = ? AND extra NOT LIKE '%GENERATED%' ORDER BY ordinal_position",
                (from, &t),
            )
            .expect("columns");
        let list = cols
            .iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(",");
        c.query_drop(format!(
            "INSERT IGNORE INTO `{to}`.`{t}` ({list}) SELECT {list} FROM `{from}`.`{t}`"
        ))
        .unwrap_or_else(|e| panic!("copy {t}: {e}"));
    }
}

#[test]
fn a_replica_of_a_primary_without_a_binary_log_is_not_read() {
    let server = MariaDb::start_without_binlog(1);
    let db = server.test_db();
    let copy = server.test_db();
    let redis = RedisServer::start();
    let sale = three_orders(&db, &redis);
    copy_tables(&server, &db.name, &copy.name);
    db.conn()
        .query_drop(lose_order(sale))
        .expect("lose an order");
    let used = same_as_primary(
        &redis,
        &db,
        &copy.url(),
        "the primary has no GTID position (@@gtid_binlog_pos is empty",
    );
    assert_eq!(used, 0.0, "the copy was not read");
}
