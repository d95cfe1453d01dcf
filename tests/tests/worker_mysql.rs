//! Specifies the worker under MySQL trouble: its connections killed again
//! and again mid-run (as when the server goes away), and eight workers
//! contending for one hot sale's row. Every order exactly once, nothing
//! dead-lettered.

use crate::support::worker as support;

use mysql::prelude::Queryable;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::{Duration, Instant};
use support::{assert_exactly_once, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(180);

fn metric_sum(workers: &[WorkerProc], name: &str, label: &str) -> u64 {
    workers
        .iter()
        .map(|w| {
            let page = w.metrics();
            page.lines()
                .filter(|l| l.starts_with(name) && l.contains(label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn mysql_connections_killed_mid_run_still_every_order_exactly_once_nothing_dead_lettered() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 3000, -1000, 600_000);
    reserve_users(&redis, sale, "u", 3000);
    let opts = Opts {
        batch: 4,
        ..Opts::default()
    };
    let workers: Vec<WorkerProc> = (1..=2)
        .map(|i| WorkerProc::start(&redis, &db, &format!("w{i}"), &opts))
        .collect();
    wait_orders(&db, sale, 1, LONG);

    // Kill every connection to this test's database but the killer's own,
    // every 20 ms, until a worker has counted a connection retry while
    // orders were still being written: the workers lose MySQL
    // mid-transaction, mid-commit and while idle. The bound only ends a
    // hung test.
    let mut killer = db.conn();
    let mut kills = 0;
    let until = Instant::now() + LONG;
    let orders_at_retry = loop {
        let ids: Vec<u64> = killer
            .exec(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()",
                (&db.name,),
            )
            .unwrap();
        for id in ids {
            // The connection may be gone already.
            if killer.query_drop(format!("KILL CONNECTION {id}")).is_ok() {
                kills += 1;
            }
        }
        if metric_sum(&workers, "seckill_worker_retries_total", "connection") > 0 {
            break db.count(&format!(
                "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
            ));
        }
        assert!(
            Instant::now() < until,
            "no connection retry after {kills} kills"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(killer);
    assert!(kills > 0, "no worker connection was killed");
    assert!(
        orders_at_retry < 3000,
        "the retry came after every order was written: nothing was interrupted"
    );

    wait_orders(&db, sale, 3000, LONG);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 3000);
    assert_eq!(
        metric_sum(&workers, "seckill_worker_dead_lettered_total", ""),
        0
    );
}

#[test]
fn eight_workers_on_one_hot_sale_lose_and_double_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 2000, -1000, 600_000);
    reserve_users(&redis, sale, "u", 2000);
    let opts = Opts {
        batch: 16,
        ..Opts::default()
    };
    let workers: Vec<WorkerProc> = (1..=8)
        .map(|i| WorkerProc::start(&redis, &db, &format!("w{i}"), &opts))
        .collect();
    wait_orders(&db, sale, 2000, LONG);
    wait_drained(&redis, sale, LONG);
    assert_exactly_once(&db, &redis, sale, 2000);
    assert_eq!(
        metric_sum(&workers, "seckill_worker_orders_applied_total", ""),
        2000
    );
    assert_eq!(
        metric_sum(&workers, "seckill_worker_dead_lettered_total", ""),
        0
    );
}
