//! The reconciler reading from a real MariaDB replica
//! (`SECKILL_MYSQL_REPLICA_URL`): a primary and a GTID replica started by
//! the test (`seckill_tests::mariadb`), a sale drained by a real worker into
//! the primary while the replica is held back. A run waits for the replica
//! to catch up and reports exactly what a run on the primary reports; a
//! replica that shows discrepancies the primary does not have produces no
//! finding and no fix; a replica stopped for good, or dead, makes the run
//! read the primary and say so (stderr, metrics file).

use crate::support::worker as worker_support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::mariadb::MariaDb;
use seckill_tests::{create_sale, RedisServer, TempDir, TestDb};
use std::process::Output;
use std::time::{Duration, Instant};
use worker_support::{wait_drained, wait_orders, Opts, WorkerProc};

/// The test's servers and files.
struct World {
    primary: MariaDb,
    replica: MariaDb,
    db: TestDb,
    redis: RedisServer,
    dir: TempDir,
    sale: u64,
}

impl World {
    fn replica_url(&self) -> String {
        self.replica.url(&self.db.name)
    }

    /// `seckill-reconciler ARGS`, with the replica (and its wait bound)
    /// when `replica_wait` is given.
    fn reconciler(&self, replica_wait: Option<&str>, args: &[&str]) -> Output {
        let mut c = seckill_tests::command("seckill-reconciler");
        c.args(args)
            .env("SECKILL_MYSQL_URL", self.db.url())
            .env("SECKILL_REDIS_URL", self.redis.url())
            .env("SECKILL_REVIEW_DB", self.dir.path().join("review.sqlite3"))
            .env("SECKILL_RECONCILE_GRACE", "0s")
            .env(
                "SECKILL_RECONCILER_METRICS_FILE",
                self.dir.path().join("reconciler.prom"),
            );
        if let Some(wait) = replica_wait {
            c.env("SECKILL_MYSQL_REPLICA_URL", self.replica_url())
                .env("SECKILL_MYSQL_REPLICA_WAIT", wait);
        }
        c.output().expect("run seckill-reconciler")
    }

    /// `run`; returns its exit code and stderr.
    fn run(&self, replica_wait: Option<&str>) -> (i32, String) {
        let out = self.reconciler(replica_wait, &["run"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("{err}");
        (out.status.code().unwrap_or(-1), err)
    }

    /// `(kind, subject, state)` of every finding, sorted.
    fn findings(&self) -> Vec<(String, String, String)> {
        let out = self.reconciler(None, &["findings", "--state", "all", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("JSON");
        let mut k: Vec<_> = v
            .iter()
            .map(|f| {
                let s = |n: &str| f[n].as_str().unwrap_or_default().to_string();
                (s("kind"), s("subject"), s("state"))
            })
            .collect();
        k.sort();
        k
    }

    /// One gauge of the metrics file the last run wrote.
    fn metric(&self, name: &str) -> f64 {
        let text = std::fs::read_to_string(self.dir.path().join("reconciler.prom"))
            .expect("the metrics file");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {text}"))
    }

    fn count(&self, server: &MariaDb, sql: &str) -> i64 {
        use mysql::prelude::Queryable;
        let mut c =
            seckill_common::schema::connect(&server.url(&self.db.name), Duration::from_secs(10))
                .expect("connect");
        let sql = sql.replace("{sale}", &self.sale.to_string());
        c.query_first::<i64, _>(&sql).expect("query").unwrap_or(0)
    }

    /// Sells `n` units to `PREFIX-i` and has a real worker apply them to
    /// the primary.
    fn sell(&self, prefix: &str, n: usize, orders_after: i64) {
        worker_support::reserve_users(&self.redis, self.sale, prefix, n);
        let worker = WorkerProc::start(&self.redis, &self.db, "w1", &Opts::default());
        wait_orders(&self.db, self.sale, orders_after, Duration::from_secs(60));
        wait_drained(&self.redis, self.sale, Duration::from_secs(30));
        drop(worker);
    }
}

fn world() -> World {
    let (primary, replica) = MariaDb::primary_and_replica();
    let db = primary.test_db();
    let redis = RedisServer::start();
    let sale = create_sale(&db, &redis, 500, -1000, 3_600_000);
    World {
        primary,
        replica,
        db,
        redis,
        dir: TempDir::new(),
        sale,
    }
}

/// Reserves one unit for `user` and removes its message from the queue:
/// a flow record that will never become an order (one true finding).
fn lose_one(w: &World, user: &str) -> String {
    let mut con = w.redis.con();
    let ReserveOutcome::Reserved(rid) = reserve(&mut con, w.sale, user).expect("reserve") else {
        panic!("{user} could not reserve");
    };
    let k = SaleKeys::new(w.sale);
    let raw: String = con.hget(k.flow(), &rid).expect("flow record");
    let n: i64 = con.lrem(k.queue(), 0, &raw).expect("lrem");
    assert_eq!(n, 1);
    rid
}

fn assert_says(stderr: &str, what: &str) {
    assert!(stderr.contains(what), "stderr says {what:?}: {stderr}");
}

#[test]
fn a_run_reads_the_replica_only_once_caught_up_and_reports_what_the_primary_shows() {
    let w = world();
    let lost = lose_one(&w, "lost-1");
    let expected = vec![(
        "flow_without_order".to_string(),
        lost.clone(),
        "open".to_string(),
    )];

    // The replica held back while a worker writes 150 orders to the primary.
    w.replica.exec("STOP SLAVE SQL_THREAD");
    w.sell("buyer", 150, 150);
    assert_eq!(
        w.count(
            &w.replica,
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        ),
        0
    );

    // The reference: a run on the primary alone.
    let (code, _) = w.run(None);
    assert_eq!(code, 1, "one open finding");
    assert_eq!(w.findings(), expected);

    // A run with the replica: it waits until the replica is let go (2 s
    // later), then reads it, and reports the same.
    let replica_port = w.replica.port;
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let url = format!("mysql://root@127.0.0.1:{replica_port}/");
        let mut c = seckill_common::schema::connect(&url, Duration::from_secs(10)).expect("c");
        mysql::prelude::Queryable::query_drop(&mut c, "START SLAVE SQL_THREAD").expect("start");
    });
    let t = Instant::now();
    let (code, err) = w.run(Some("30s"));
    let took = t.elapsed();
    release.join().expect("release thread");
    assert_eq!(code, 1, "{err}");
    assert_says(&err, "read the replica");
    assert_eq!(w.findings(), expected);
    assert_eq!(w.metric("seckill_reconciler_replica_used"), 1.0);
    assert_eq!(w.metric("seckill_reconciler_replica_confirmed_sales"), 1.0);
    assert_eq!(w.metric("seckill_reconciler_replica_cleared_sales"), 0.0);
    let waited = w.metric("seckill_reconciler_replica_wait_seconds");
    assert!(waited > 0.0 && waited < 30.0, "{waited}");
    assert_eq!(
        w.count(
            &w.replica,
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        ),
        150
    );
    println!(
        "held-back replica: run waited {:.0} ms for the replica (released after 2,000 ms), run took {} ms",
        waited * 1000.0,
        took.as_millis()
    );

    // A caught-up replica: the wait costs one round trip.
    let (code, err) = w.run(Some("30s"));
    assert_eq!(code, 1, "{err}");
    println!(
        "caught-up replica: run waited {:.1} ms",
        w.metric("seckill_reconciler_replica_wait_seconds") * 1000.0
    );

    // A replica that shows what the primary does not (5 orders and 5
    // ledger rows it lacks): flagged there, re-read on the primary, and
    // nothing false recorded or fixed.
    w.replica.exec(&format!(
        "SET SESSION sql_log_bin = 0; \
         DELETE FROM `{db}`.stock_ledger WHERE sale_id = {s} ORDER BY id LIMIT 5; \
         DELETE FROM `{db}`.orders WHERE sale_id = {s} ORDER BY id DESC LIMIT 5",
        db = w.db.name,
        s = w.sale
    ));
    let ledger_before = w.count(&w.primary, "SELECT COUNT(*) FROM stock_ledger");
    let (code, err) = w.run(Some("30s"));
    assert_eq!(code, 1, "{err}");
    assert_says(&err, "discrepancies; the primary confirmed 1");
    assert_eq!(w.findings(), expected);
    assert_eq!(
        w.count(&w.primary, "SELECT COUNT(*) FROM stock_ledger"),
        ledger_before
    );
    assert_eq!(
        w.count(&w.replica, "SELECT COUNT(*) FROM stock_ledger"),
        ledger_before - 5
    );

    // `sale show` reads the replica (its 145 orders, the primary's 150).
    let out = w.reconciler(Some("30s"), &["sale", "show", &w.sale.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("orders holding    145 "), "{text}");
}

#[test]
fn a_stopped_or_dead_replica_makes_the_run_read_the_primary_and_say_so() {
    let mut w = world();
    w.sell("buyer", 40, 40);
    let (code, err) = w.run(Some("30s"));
    assert_eq!(code, 0, "{err}");
    assert_says(&err, "read the replica");

    // Stopped for good, with the primary ahead of it.
    w.replica.exec("STOP SLAVE");
    w.sell("more", 10, 50);
    let (code, err) = w.run(Some("1s"));
    assert_eq!(code, 0, "{err}");
    assert_says(
        &err,
        "reading from the primary: the replica did not reach the primary's GTID position",
    );
    assert_says(&err, "read the primary");
    assert_eq!(w.findings(), Vec::new());
    assert_eq!(w.metric("seckill_reconciler_replica_used"), 0.0);
    let waited = w.metric("seckill_reconciler_replica_wait_seconds");
    assert!(waited >= 1.0, "{waited}");
    println!(
        "stopped replica: gave up after {:.0} ms (bound 1,000 ms)",
        waited * 1000.0
    );

    // Dead.
    w.replica.kill();
    let (code, err) = w.run(Some("1s"));
    assert_eq!(code, 0, "{err}");
    assert_says(&err, "(SECKILL_MYSQL_REPLICA_URL) failed");
    assert_says(&err, "read the primary");
    assert_eq!(w.metric("seckill_reconciler_replica_used"), 0.0);
    assert_eq!(
        w.count(
            &w.primary,
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        ),
        50
    );
}
