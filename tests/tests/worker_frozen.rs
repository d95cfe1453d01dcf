//! Specifies that a frozen worker cannot block its sale: a worker stopped
//! with SIGSTOP inside its MySQL transaction (holding `SELECT … FOR UPDATE`
//! on the sale row) loses its session, and with it its locks, on the
//! server's idle-in-transaction limit, so the two other workers commit every
//! order within the heartbeat TTL + 10 s; after SIGCONT its late commit fails
//! and its re-application finds every order done: exactly N orders, N ledger
//! rows, no dead letter.
//!
//! Catching the worker inside its transaction is done with real timing, no
//! test hook: the worker runs alone with a batch of 2,500 (a transaction of
//! about 150 ms) while the test polls `information_schema.innodb_trx`
//! (every 110 ms: InnoDB refreshes that table only when it has not been
//! read for 100 ms) for a transaction of a session on the test's database; it sends SIGSTOP
//! at once, then checks that the very transaction is still open and holds
//! row locks (else it resumes the worker and tries again).

use crate::support::worker as support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::{Duration, Instant};
use support::{
    assert_exactly_once, dead_letters, reserve_users, wait_drained, wait_orders, Opts, WorkerProc,
};

/// Reservations of the sale.
const N: usize = 10_000;
/// The frozen worker's batch: the transaction it is caught in.
const FROZEN_BATCH: usize = 2500;
/// Between two reads of `innodb_trx`: more than InnoDB's 100 ms cache
/// refresh interval (`CACHE_MIN_IDLE_TIME_US` in `trx0i_s.cc`).
const POLL: Duration = Duration::from_millis(110);
/// `SECKILL_WORKER_HEARTBEAT_TTL` of every worker.
const TTL: &str = "6s";
const TTL_S: u64 = 6;
/// How long the worker stays frozen.
const FROZEN_FOR: Duration = Duration::from_secs(60);

/// The open InnoDB transaction of a session on database `db`, as
/// `(trx_id, session id, rows locked)`.
fn open_transaction(admin: &mut mysql::Conn, db: &str) -> Option<(String, u64, u64)> {
    admin
        .exec_first(
            "SELECT CAST(t.trx_id AS CHAR), t.trx_mysql_thread_id, t.trx_rows_locked \
             FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = ? AND p.id <> CONNECTION_ID()",
            (db,),
        )
        .expect("read innodb_trx")
}

/// Stops `w` while it is inside a transaction holding row locks; returns the
/// session id of that transaction.
fn stop_inside_transaction(w: &WorkerProc, db: &TestDb) -> u64 {
    let mut admin = db.conn();
    for attempt in 0..20 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let seen = loop {
            if let Some(t) = open_transaction(&mut admin, &db.name) {
                break t;
            }
            assert!(
                Instant::now() < deadline,
                "no transaction of the worker seen"
            );
            // InnoDB refreshes what innodb_trx shows only when it has not
            // been read for 100 ms: polling faster shows a frozen picture.
            std::thread::sleep(POLL);
        };
        w.signal("-STOP");
        seckill_tests::wait_until(Duration::from_secs(5), "the worker to stop", || {
            seckill_tests::is_stopped(w.pid())
        });
        // Whatever the worker had sent has been executed by now.
        std::thread::sleep(Duration::from_millis(300));
        match open_transaction(&mut admin, &db.name) {
            Some((id, session, locked)) if id == seen.0 && locked > 0 => return session,
            other => {
                eprintln!("attempt {attempt}: stopped outside the transaction ({other:?})");
                w.signal("-CONT");
            }
        }
    }
    panic!("could not stop the worker inside its transaction");
}

#[test]
fn a_worker_frozen_inside_its_transaction_does_not_block_its_sale() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, N as u64, -1000, 600_000);
    reserve_users(&redis, sale, "u", N);
    let frozen = WorkerProc::start(
        &redis,
        &db,
        "w1",
        &Opts {
            batch: FROZEN_BATCH,
            heartbeat_ttl: TTL,
            ..Opts::default()
        },
    );
    let session = stop_inside_transaction(&frozen, &db);
    let stopped_at = Instant::now();
    let before = db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
    ));
    eprintln!("w1 stopped in session {session} with {before} orders committed");

    let opts = Opts {
        heartbeat_ttl: TTL,
        ..Opts::default()
    };
    let w2 = WorkerProc::start(&redis, &db, "w2", &opts);
    let w3 = WorkerProc::start(&redis, &db, "w3", &opts);
    wait_orders(&db, sale, N as i64, Duration::from_secs(TTL_S + 10));
    let all_after = stopped_at.elapsed();
    eprintln!("all {N} orders committed {all_after:?} after the SIGSTOP");
    wait_drained(&redis, sale, Duration::from_secs(10));
    assert_exactly_once(&db, &redis, sale, N as i64);
    assert_eq!(
        w2.metric("seckill_worker_reclaimed_total") + w3.metric("seckill_worker_reclaimed_total"),
        FROZEN_BATCH as u64
    );

    // The rest of the 60 s, then the worker resumes in the middle of the
    // transaction the server has ended.
    std::thread::sleep(FROZEN_FOR.saturating_sub(stopped_at.elapsed()));
    frozen.signal("-CONT");
    seckill_tests::wait_until(Duration::from_secs(30), "w1 to re-apply its batch", || {
        frozen.metric("seckill_worker_messages_already_done_total") == FROZEN_BATCH as u64
    });
    assert_eq!(
        frozen.metric("seckill_worker_orders_applied_total"),
        before as u64
    );
    assert_eq!(
        w2.metric("seckill_worker_orders_applied_total")
            + w3.metric("seckill_worker_orders_applied_total"),
        (N as i64 - before) as u64
    );
    // Its late statement found the session gone: one reconnect, and no
    // failed attempt counted against any message.
    let retries = |w: &WorkerProc, cause: &str| {
        w.metric(&format!(
            "seckill_worker_retries_total{{worker=\"{}\",cause=\"{cause}\"}}",
            w.id
        ))
    };
    eprintln!(
        "retries: w1 connection {}, w2+w3 lock wait {}, w2+w3 connection {}",
        retries(&frozen, "connection"),
        retries(&w2, "deadlock_or_lock_wait") + retries(&w3, "deadlock_or_lock_wait"),
        retries(&w2, "connection") + retries(&w3, "connection")
    );
    assert_eq!(retries(&frozen, "connection"), 1);
    let attempts: usize = redis.con().hlen(SaleKeys::new(sale).attempts()).unwrap();
    assert_eq!(attempts, 0, "failed attempts counted");
    assert_eq!(dead_letters(&redis, sale).len(), 0);
    assert_exactly_once(&db, &redis, sale, N as i64);
}
