//! The order in which docs/OPERATIONS.md ("A MySQL failover") turns on
//! semi-synchronous replication, on a private MariaDB pair
//! (`seckill_tests::mariadb`): the primary first, with no semi-synchronous
//! replica attached, holds its first commit for the whole
//! `rpl_semi_sync_master_timeout` and then goes asynchronous (counted in
//! `Rpl_semi_sync_master_no_tx`); the replica first, then the primary,
//! acknowledges the first commit (`Rpl_semi_sync_master_yes_tx`).

use mysql::prelude::Queryable;
use seckill_tests::mariadb::MariaDb;
use std::time::{Duration, Instant};

/// A global status variable of `server` ("" when absent).
fn status_text(server: &MariaDb, name: &str) -> String {
    server
        .conn()
        .exec_first::<String, _, _>(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?",
            (name,),
        )
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// [`status_text`] as a number (0 when absent).
fn status(server: &MariaDb, name: &str) -> i64 {
    status_text(server, name).parse().unwrap_or(0)
}

/// One commit on `primary`; how long it took.
fn one_commit(primary: &MariaDb, db: &str) -> Duration {
    let started = Instant::now();
    primary.exec(&format!("INSERT INTO `{db}`.t VALUES (NULL)"));
    started.elapsed()
}

#[test]
fn semi_sync_turned_on_replica_first_never_holds_a_commit() {
    let (primary, replica) = MariaDb::primary_and_replica();
    let db = "semi_sync_order";
    primary.exec(&format!(
        "CREATE DATABASE {db}; CREATE TABLE {db}.t (id INT AUTO_INCREMENT PRIMARY KEY)"
    ));

    // The wrong order: the primary first, its replica not semi-synchronous.
    primary.exec(
        "SET GLOBAL rpl_semi_sync_master_timeout = 2000, \
         rpl_semi_sync_master_wait_point = AFTER_SYNC, rpl_semi_sync_master_enabled = ON",
    );
    assert_eq!(status(&primary, "RPL_SEMI_SYNC_MASTER_CLIENTS"), 0);
    let held = one_commit(&primary, db);
    println!(
        "primary first: the first commit took {} ms; no_tx {}, status after: {}",
        held.as_millis(),
        status(&primary, "RPL_SEMI_SYNC_MASTER_NO_TX"),
        status_text(&primary, "RPL_SEMI_SYNC_MASTER_STATUS")
    );
    assert_eq!(status(&primary, "RPL_SEMI_SYNC_MASTER_NO_TX"), 1);
    assert_eq!(status(&primary, "RPL_SEMI_SYNC_MASTER_YES_TX"), 0);
    primary.exec("SET GLOBAL rpl_semi_sync_master_enabled = OFF");

    // The runbook's order: the replica, its I/O thread restarted, then the
    // primary; the replica is counted before the first commit.
    replica.exec(
        "SET GLOBAL rpl_semi_sync_slave_enabled = ON; \
         STOP SLAVE IO_THREAD; START SLAVE IO_THREAD",
    );
    primary.exec("SET GLOBAL rpl_semi_sync_master_enabled = ON");
    seckill_tests::wait_until(
        Duration::from_secs(30),
        "the replica counted as a semi-synchronous client",
        || status(&primary, "RPL_SEMI_SYNC_MASTER_CLIENTS") == 1,
    );
    let took = one_commit(&primary, db);
    println!(
        "replica first: the first commit took {} ms; yes_tx {}, no_tx {}",
        took.as_millis(),
        status(&primary, "RPL_SEMI_SYNC_MASTER_YES_TX"),
        status(&primary, "RPL_SEMI_SYNC_MASTER_NO_TX")
    );
    assert_eq!(status(&primary, "RPL_SEMI_SYNC_MASTER_YES_TX"), 1);
    assert_eq!(status(&primary, "RPL_SEMI_SYNC_MASTER_NO_TX"), 1, "no new");
    let rows = "SELECT COUNT(*) FROM semi_sync_order.t";
    seckill_tests::wait_until(Duration::from_secs(30), "both rows on the replica", || {
        replica.conn().query_first::<i64, _>(rows).ok().flatten() == Some(2)
    });
}
