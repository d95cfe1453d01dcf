//! Owns what the MySQL failover tests share: a real `seckill-worker` whose
//! `SECKILL_MYSQL_URL` names a primary and its replica, and a count read
//! from one server of the pair.

use mysql::prelude::Queryable;
use seckill_tests::mariadb::MariaDb;
use seckill_tests::RedisServer;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A `seckill-worker` (`w1`) with `SECKILL_MYSQL_URL` = `url` and
/// `SECKILL_MYSQL_TIMEOUT` = `timeout`, logging to `log`, killed on drop.
pub struct Worker(pub Child);

impl Worker {
    pub fn start(redis: &RedisServer, url: &str, timeout: &str, log: &Path) -> Worker {
        let child = seckill_tests::command("seckill-worker")
            .env("RUST_LOG", "info")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", url)
            .env("SECKILL_WORKER_ID", "w1")
            .env("SECKILL_WORKER_BLOCK", "200ms")
            .env("SECKILL_WORKER_HEARTBEAT_TTL", "3s")
            .env("SECKILL_MYSQL_TIMEOUT", timeout)
            .env(
                "SECKILL_WORKER_METRICS_LISTEN",
                format!("127.0.0.1:{}", seckill_tests::free_port()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).map(Stdio::from).expect("log"))
            .spawn()
            .expect("start seckill-worker");
        Worker(child)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first column of `sql`'s first row on `server`'s database `db`, 0
/// when no row.
pub fn count(server: &MariaDb, db: &str, sql: &str) -> i64 {
    let mut c =
        seckill_common::schema::connect(&server.url(db), Duration::from_secs(5)).expect("connect");
    c.query_first::<i64, _>(sql).expect("query").unwrap_or(0)
}
