//! Specifies a worker's identity at start, with real workers on a private
//! Redis and MySQL: a second worker started under the id of a live one
//! (its heartbeat is refreshed) is refused (exit 2, naming
//! `SECKILL_WORKER_ID`) and leaves that id's processing lists alone; a
//! worker started under the id of one killed with SIGKILL (its heartbeat
//! left behind, no longer refreshed) starts and applies what is queued.

use crate::support::worker as wk;

use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_tests::{create_sale, free_port, RedisServer, TestDb};
use std::process::Stdio;
use std::time::{Duration, Instant};
use wk::{reserve_users, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(60);

fn wait_heartbeat(redis: &RedisServer, id: &str) {
    seckill_tests::wait_until(LONG, "the worker's heartbeat", || {
        redis.con().exists(keys::worker_heartbeat(id)).unwrap()
    });
}

#[test]
fn a_second_worker_under_a_live_id_is_refused_and_leaves_its_lists() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 5, -1000, 3_600_000);
    let _w1 = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_heartbeat(&redis, "w1");

    let started = Instant::now();
    let mut second = seckill_tests::command("seckill-worker")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_WORKER_ID", "w1")
        .env("SECKILL_WORKER_HEARTBEAT_TTL", "3s")
        .env(
            "SECKILL_WORKER_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Refused within half a TTL of its start; 10 s is far beyond that.
    let status = loop {
        if let Some(s) = second.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = second.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = second.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(
        err.contains("SECKILL_WORKER_ID=w1: another worker is live under this id"),
        "{err}"
    );
    // Refused before registering or touching a list: the live one goes on.
    let members: Vec<String> = redis.con().smembers(keys::WORKERS).unwrap();
    assert_eq!(members, ["w1"]);
    reserve_users(&redis, sale, "u", 2);
    wait_orders(&db, sale, 2, LONG);
    wk::wait_drained(&redis, sale, LONG);
    let queued: usize = redis.con().llen(SaleKeys::new(sale).queue()).unwrap();
    assert_eq!(queued, 0);
}

#[test]
fn a_worker_under_the_id_of_a_killed_one_starts_and_applies_the_queue() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 5, -1000, 3_600_000);
    {
        let _w1 = WorkerProc::start(&redis, &db, "w1", &Opts::default());
        wait_heartbeat(&redis, "w1");
    } // SIGKILL: its heartbeat stays until its TTL runs out.
    let left: bool = redis.con().exists(keys::worker_heartbeat("w1")).unwrap();
    assert!(left, "the killed worker's heartbeat");
    let _w1 = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    reserve_users(&redis, sale, "u", 3);
    wait_orders(&db, sale, 3, LONG);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        3
    );
}
