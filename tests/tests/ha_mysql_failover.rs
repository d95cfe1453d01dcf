//! The MySQL primary failing while a sale drains into it, with
//! asynchronous replication: a primary and a GTID replica started by the
//! test (`seckill_tests::mariadb`), a real worker whose `SECKILL_MYSQL_URL`
//! names both (`mysql_writable.rs`: it writes to the one with
//! `read_only = 0`). The replica stops receiving (`STOP SLAVE IO_THREAD`)
//! while 50 orders are written, the primary is killed with SIGKILL: the
//! worker takes nothing while no server is writable, follows the promoted
//! replica without a restart and drains the queue; the 50 orders the
//! replica never received are 50 `flow_without_order` findings, and
//! `resolve --reorder` (the runbook's fix) makes each exactly one order.
//! With semi-synchronous replication (`AFTER_SYNC`), a primary killed in
//! the middle of a 2,000-order drain loses nothing: every commit a worker
//! was told of is on the replica, the worker repeats the batch the kill
//! cut short on the promoted replica, and the next run finds nothing.

use crate::support::mysql_pair::{count, Worker};
use crate::support::worker as worker_support;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::mariadb::MariaDb;
use seckill_tests::{create_sale, RedisServer, TempDir};
use std::time::{Duration, Instant};
use worker_support::reserve_users;

fn wait_count(server: &MariaDb, db: &str, sql: &str, n: i64, within: Duration) {
    seckill_tests::wait_until(within, &format!("{sql} = {n}"), || {
        count(server, db, sql) == n
    });
}

#[test]
fn the_worker_follows_the_promoted_replica_and_lost_orders_are_found_and_reordered() {
    let (mut primary, replica) = MariaDb::primary_and_replica();
    replica.exec("SET GLOBAL read_only = 1");
    let db = primary.test_db();
    let name = db.name.clone();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let sale = create_sale(&db, &redis, 300, -1000, 3_600_000);
    let orders = format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}");
    let both = format!(
        "mysql://root@127.0.0.1:{},127.0.0.1:{}/{name}",
        primary.port, replica.port
    );
    let log = dir.path().join("worker.log");
    let _w = Worker::start(&redis, &both, "2s", &log);

    reserve_users(&redis, sale, "a", 100);
    wait_count(&primary, &name, &orders, 100, Duration::from_secs(30));
    wait_count(&replica, &name, &orders, 100, Duration::from_secs(30));

    // Asynchronous replication's window: 50 orders the replica never gets.
    replica.exec("STOP SLAVE IO_THREAD");
    reserve_users(&redis, sale, "b", 50);
    wait_count(&primary, &name, &orders, 150, Duration::from_secs(30));
    primary.kill();

    // No writable server: the worker takes nothing and says why.
    reserve_users(&redis, sale, "c", 50);
    std::thread::sleep(Duration::from_secs(2));
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    let queued: usize = con.llen(k.queue()).expect("llen");
    let in_flight = worker_support::processing_total(&mut con, sale);
    assert_eq!(queued + in_flight, 50, "nothing applied while no primary");
    assert_eq!(count(&replica, &name, &orders), 100);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let said = text
        .lines()
        .find(|l| l.contains("no writable server in SECKILL_MYSQL_URL"));
    assert!(said.is_some(), "{text}");
    println!("worker: {}", said.unwrap_or_default());

    // The reconciler with no writable primary: records nothing, says so
    // and that the replica answers, and its metrics file pages; the
    // read-only commands read the replica.
    let down_review = dir.path().join("down.sqlite3");
    let metrics = dir.path().join("reconciler.prom");
    let down = |args: &[&str]| {
        seckill_tests::command("seckill-reconciler")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", &both)
            .env("SECKILL_MYSQL_REPLICA_URL", replica.url(&name))
            .env("SECKILL_MYSQL_TIMEOUT", "2s")
            .env("SECKILL_REVIEW_DB", &down_review)
            .env("SECKILL_RECONCILER_METRICS_FILE", &metrics)
            .args(args)
            .output()
            .expect("run seckill-reconciler")
    };
    let out = down(&["run"]);
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("no writable MySQL primary answered, so nothing was recorded")
            && said.contains("(SECKILL_MYSQL_REPLICA_URL) answers"),
        "{said}"
    );
    let prom = std::fs::read_to_string(&metrics).unwrap_or_default();
    assert!(
        prom.lines()
            .any(|l| l == "seckill_reconciler_mysql_primary_up 0.0"),
        "{prom}"
    );
    let out = down(&["sale", "show", &sale.to_string()]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the primary is down"),
        "warned"
    );

    // The runbook's promotion; the worker follows without a restart.
    let promoted = Instant::now();
    replica.exec("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0");
    wait_count(&replica, &name, &orders, 150, Duration::from_secs(30));
    println!(
        "promoted replica: the worker's 50 queued orders applied within {} ms",
        promoted.elapsed().as_millis()
    );

    // The 50 lost orders: 50 findings; the fix reorders each.
    let review = dir.path().join("review.sqlite3");
    let reconciler = |args: &[&str]| {
        let out = seckill_tests::command("seckill-reconciler")
            .env("SECKILL_REDIS_URL", redis.url())
            .env("SECKILL_MYSQL_URL", &both)
            .env("SECKILL_REVIEW_DB", &review)
            .env("SECKILL_RECONCILE_GRACE", "0s")
            .args(args)
            .output()
            .expect("run seckill-reconciler");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, out) = reconciler(&["run"]);
    assert_eq!(code, 1, "{out}");
    println!("{out}");
    let (_, listed) = reconciler(&["findings", "--json"]);
    let start = listed.find('[').unwrap_or(0);
    let findings: Vec<serde_json::Value> =
        serde_json::from_str(&listed[start..]).expect("findings JSON");
    let lost: Vec<&serde_json::Value> = findings
        .iter()
        .filter(|f| f["kind"] == "flow_without_order")
        .collect();
    assert_eq!(lost.len(), 50, "{listed}");
    assert_eq!(findings.len(), 50, "{listed}");
    for f in &lost {
        let id = f["id"].to_string();
        let (code, out) = reconciler(&["resolve", &id, "--reorder", "--by", "tester"]);
        assert_eq!(code, 0, "{out}");
    }
    wait_count(&replica, &name, &orders, 200, Duration::from_secs(30));
    let (code, out) = reconciler(&["run"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        count(
            &replica,
            &name,
            &format!(
                "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = {sale} \
                 GROUP BY user_id HAVING COUNT(*) > 1) t"
            )
        ),
        0,
        "no order twice"
    );
    let flow: usize = con.hlen(k.flow()).expect("hlen");
    assert_eq!(flow, 200, "every reservation exactly one order");
}

/// `SHOW SLAVE STATUS`'s `col` on `server`.
fn slave_status(server: &MariaDb, col: &str) -> String {
    use mysql::prelude::Queryable;
    let row: Option<mysql::Row> = server
        .conn()
        .query_first("SHOW SLAVE STATUS")
        .expect("status");
    row.and_then(|r| r.get_opt::<String, _>(col).and_then(Result::ok))
        .unwrap_or_default()
}

/// The runbook's promotion: stop receiving, let the SQL thread apply
/// everything already received (the relay log), then make it writable.
fn promote(replica: &MariaDb) {
    replica.exec("STOP SLAVE IO_THREAD");
    seckill_tests::wait_until(
        Duration::from_secs(60),
        "the replica to apply its relay log",
        || {
            slave_status(replica, "Master_Log_File")
                == slave_status(replica, "Relay_Master_Log_File")
                && slave_status(replica, "Read_Master_Log_Pos")
                    == slave_status(replica, "Exec_Master_Log_Pos")
        },
    );
    replica.exec("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0");
}

#[test]
fn with_semi_synchronous_replication_a_primary_killed_mid_drain_loses_no_order() {
    let (mut primary, replica) = MariaDb::primary_and_replica();
    // AFTER_SYNC: a commit is acknowledged to the worker only once the
    // replica has received it; the timeout keeps it from falling back to
    // asynchronous while the test runs.
    primary.exec(
        "SET GLOBAL rpl_semi_sync_master_enabled = ON, \
         rpl_semi_sync_master_wait_point = AFTER_SYNC, \
         rpl_semi_sync_master_timeout = 600000",
    );
    replica.exec(
        "SET GLOBAL rpl_semi_sync_slave_enabled = ON, read_only = 1; \
         STOP SLAVE IO_THREAD; START SLAVE IO_THREAD",
    );
    seckill_tests::wait_until(
        Duration::from_secs(30),
        "the replica to be a semi-synchronous client",
        || {
            count(
                &primary,
                "mysql",
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'Rpl_semi_sync_master_clients'",
            ) == 1
        },
    );
    let db = primary.test_db();
    let name = db.name.clone();
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let total = 2_000;
    let sale = create_sale(&db, &redis, total, -1000, 3_600_000);
    let orders = format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}");
    let both = format!(
        "mysql://root@127.0.0.1:{},127.0.0.1:{}/{name}",
        primary.port, replica.port
    );
    // The whole backlog queued first, then the worker: the kill lands
    // while it drains.
    reserve_users(&redis, sale, "a", total as usize);
    let log = dir.path().join("worker.log");
    let _w = Worker::start(&redis, &both, "2s", &log);
    seckill_tests::wait_until(Duration::from_secs(60), "the drain to be under way", || {
        count(&primary, &name, &orders) >= 300
    });
    let before_kill = count(&primary, &name, &orders);
    primary.kill();
    println!("semi-sync: primary killed with {before_kill} of {total} orders written");
    assert!(
        before_kill < total as i64,
        "killed mid-drain ({before_kill})"
    );

    let promoted = Instant::now();
    promote(&replica);
    wait_count(
        &replica,
        &name,
        &orders,
        total as i64,
        Duration::from_secs(120),
    );
    println!(
        "semi-sync: every order on the promoted replica {} ms after the promotion began",
        promoted.elapsed().as_millis()
    );
    worker_support::wait_drained(&redis, sale, Duration::from_secs(30));

    let review = dir.path().join("review.sqlite3");
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", &both)
        .env("SECKILL_REVIEW_DB", &review)
        .env("SECKILL_RECONCILE_GRACE", "0s")
        .arg("run")
        .output()
        .expect("run seckill-reconciler");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "no finding: {said}");
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    let flow: usize = con.hlen(k.flow()).expect("hlen");
    assert_eq!(flow, total as usize);
    assert_eq!(
        count(
            &replica,
            &name,
            &format!(
                "SELECT COUNT(DISTINCT reservation_id) - COUNT(*) + \
                 (SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}) FROM orders \
                 WHERE sale_id = {sale}"
            )
        ),
        total as i64,
        "one order and one ledger row per reservation"
    );
    assert_eq!(
        count(
            &replica,
            &name,
            &format!("SELECT available_stock FROM sales WHERE id = {sale}")
        ),
        0
    );
}
