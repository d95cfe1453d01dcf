//! Shared by the reconciler tests (`reconciler_*.rs`): a test world
//! (private Redis, fresh MySQL database, review file in a temporary
//! directory), running the real
//! `seckill-reconciler` binary, real reservations, and orders applied with
//! plain SQL that mirrors the worker's transaction.

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::{create_sale, RedisServer, TempDir, TestDb};
use std::process::Output;

/// One test's private Redis, MySQL database and review file.
pub struct World {
    pub redis: RedisServer,
    pub db: TestDb,
    pub dir: TempDir,
    pub sale: u64,
}

impl World {
    /// A world with one open sale of `stock` units.
    pub fn new(stock: u64) -> World {
        let redis = RedisServer::start();
        let db = TestDb::create();
        let sale = create_sale(&db, &redis, stock, -1000, 3_600_000);
        World {
            redis,
            db,
            dir: TempDir::new(),
            sale,
        }
    }

    /// The review file's path.
    pub fn review_path(&self) -> std::path::PathBuf {
        self.dir.path().join("review.sqlite3")
    }

    /// Runs `seckill-reconciler ARGS` with the grace period `grace`.
    pub fn cmd(&self, grace: &str, args: &[&str]) -> Output {
        seckill_tests::command("seckill-reconciler")
            .args(args)
            .env("SECKILL_MYSQL_URL", self.db.url())
            .env("SECKILL_REDIS_URL", self.redis.url())
            .env("SECKILL_REVIEW_DB", self.review_path())
            .env("SECKILL_RECONCILE_GRACE", grace)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run seckill-reconciler")
    }

    /// `run` with no grace period; returns the exit code.
    pub fn run(&self) -> i32 {
        let out = self.cmd("0s", &["run"]);
        let code = out.status.code().unwrap_or(-1);
        assert!(
            code == 0 || code == 1,
            "run failed ({code}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        code
    }

    /// Every finding in the review store (`findings --state all --json`).
    pub fn findings(&self) -> Vec<serde_json::Value> {
        let out = self.cmd("0s", &["findings", "--state", "all", "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("findings JSON")
    }

    /// `(kind, subject, state)` of every finding, sorted.
    pub fn finding_keys(&self) -> Vec<(String, String, String)> {
        let mut v: Vec<_> = self
            .findings()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap().to_string(),
                    f["subject"].as_str().unwrap().to_string(),
                    f["state"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// One integer from the review file.
    pub fn review_count(&self, sql: &str) -> i64 {
        let c = rusqlite::Connection::open(self.review_path()).expect("open review");
        c.query_row(sql, [], |r| r.get(0)).expect("query review")
    }

    /// Reserves one unit for each of `users` through the real script;
    /// returns the reservation ids.
    pub fn reserve(&self, users: &[&str]) -> Vec<String> {
        let mut con = self.redis.con();
        users
            .iter()
            .map(
                |u| match reserve(&mut con, self.sale, u).expect("reserve") {
                    ReserveOutcome::Reserved(rid) => rid,
                    other => panic!("{u}: {other:?}"),
                },
            )
            .collect()
    }

    /// Does what the worker does for `rids`, with plain SQL: the order, the
    /// ledger row and the decrement in one transaction, then status
    /// `confirmed` and the message removed from the queue.
    pub fn apply(&self, rids: &[String]) {
        let k = SaleKeys::new(self.sale);
        let mut con = self.redis.con();
        let mut db = self.db.conn();
        for rid in rids {
            let raw: String = con.hget(k.flow(), rid).unwrap();
            let m = OrderMessage::parse(raw.as_bytes()).unwrap();
            let mut tx = db.start_transaction(mysql::TxOpts::default()).unwrap();
            tx.exec_drop(
                "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at)
                 VALUES (?, ?, ?, 1, 'confirmed', FROM_UNIXTIME(? / 1000))",
                (rid, self.sale, &m.user_id, m.reserved_at_ms),
            )
            .unwrap();
            tx.exec_drop(
                "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
                 VALUES (?, ?, ?, -1, 'order')",
                (rid, self.sale, &m.user_id),
            )
            .unwrap();
            tx.exec_drop(
                "UPDATE sales SET available_stock = available_stock - 1 WHERE id = ?",
                (self.sale,),
            )
            .unwrap();
            tx.commit().unwrap();
            let _: () = con.hset(k.status(), rid, "confirmed").unwrap();
            let _: i64 = con.lrem(k.queue(), 1, &raw).unwrap();
        }
    }

    /// Removes the queued message of `rid` (a message lost on its way).
    pub fn lose_message(&self, rid: &str) {
        let k = SaleKeys::new(self.sale);
        let mut con = self.redis.con();
        let raw: String = con.hget(k.flow(), rid).unwrap();
        let n: i64 = con.lrem(k.queue(), 0, &raw).unwrap();
        assert_eq!(n, 1);
    }

    /// One integer from MySQL, with `{sale}` replaced by the sale id.
    pub fn sql(&self, q: &str) -> i64 {
        self.db.count(&q.replace("{sale}", &self.sale.to_string()))
    }

    /// The Redis stock counter.
    pub fn redis_stock(&self) -> i64 {
        self.redis
            .con()
            .get(SaleKeys::new(self.sale).stock())
            .unwrap()
    }
}

/// The stdout of a command that must have exited 0 (its stderr in the
/// panic otherwise).
pub fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
