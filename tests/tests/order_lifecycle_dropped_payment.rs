//! Specifies that an operator's drop of a payment dead letter holds with a
//! real worker, gateway-side receipt and reconciler: the dropped payment is
//! recorded in MySQL as `dropped` and its receipt removed, so neither the
//! expiry sweep at `pay_by` nor a redelivery applies it; the order expires;
//! a drop killed at random moments leaves each payment dropped once or not
//! at all, its receipt and its MySQL row agreeing with the audit log, and
//! one killed between its Redis script and MySQL is recorded in MySQL by
//! the next `run`; the dead letter's finding says who dropped it and why.

use crate::support::worker as support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::payment;
use seckill_common::receipt;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::path::Path;
use std::time::Duration;
use support::{pay, reserve_users, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

/// Moves the payment queue's oldest message to the dead letters, as the
/// worker does after its last attempt (its receipt stays, as the worker
/// leaves it).
fn dead_letter_oldest(redis: &RedisServer) -> String {
    let mut con = redis.con();
    let raw: String = con.rpop(payment::QUEUE, None).unwrap();
    let entry = payment::dead_letter_entry(raw.as_bytes(), "max attempts: mysql: gave up");
    let _: () = con.lpush(payment::DEAD_LETTERS, &entry).unwrap();
    entry
}

/// A windowed sale whose one order (buyer `quinn-0`) is pending with no
/// worker running; returns the sale and the order's reservation id.
fn pending_order(redis: &RedisServer, db: &TestDb, review: &Path, window: &str) -> (u64, String) {
    let sale = seckill_tests::create_windowed_sale(redis, db, review, 1, window);
    reserve_users(redis, sale, "quinn", 1);
    let w = WorkerProc::start(redis, db, "w1", &Opts::default());
    wait_orders(db, sale, 1, LONG);
    drop(w);
    let rid: String = db
        .conn()
        .query_first("SELECT reservation_id FROM orders")
        .unwrap()
        .unwrap();
    (sale, rid)
}

fn outcome(db: &TestDb, payment_id: &str) -> Option<String> {
    db.conn()
        .exec_first(
            "SELECT outcome FROM payments WHERE payment_id = ?",
            (payment_id,),
        )
        .unwrap()
}

fn has_receipt(redis: &RedisServer, rid: &str, payment_id: &str) -> bool {
    redis
        .con()
        .hexists(receipt::key(rid), format!("p:{payment_id}"))
        .unwrap()
}

#[test]
fn a_dropped_payment_is_not_applied_at_pay_by() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let (_, rid) = pending_order(&redis, &db, &review, "12s");
    pay(&redis, &rid, "pay-quinn-1", 1999);
    dead_letter_oldest(&redis);
    // A run: the review file, and the dead letter's finding.
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &[
            "dead-letter",
            "drop",
            "payments",
            "payment:pay-quinn-1",
            "--by",
            "oncall",
            "--note",
            "refunded by PSP",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("done: dropped payment:pay-quinn-1 "),
        "{out}"
    );
    // The dead letter's finding says who dropped it and why.
    let c = rusqlite::Connection::open(&review).unwrap();
    let (finding, state, by, note): (i64, String, String, String) = c
        .query_row(
            "SELECT id, state, resolved_by, note FROM findings
             WHERE kind = 'dead_letter' AND subject = 'payment:pay-quinn-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        (state.as_str(), by.as_str(), note.as_str()),
        ("resolved", "oncall", "refunded by PSP")
    );
    let rows: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM actions WHERE finding_id = ?1 AND action = 'drop_payment'
               AND actor = 'oncall' AND result = 'done'",
            [finding],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 1);
    let still_pending = db.count(
        "SELECT COUNT(*) FROM orders WHERE status = 'pending_payment' AND pay_by > UTC_TIMESTAMP(3)",
    );
    assert_eq!(
        still_pending, 1,
        "the drop came after pay_by: a longer window"
    );
    // A worker runs past pay_by: its expiry sweep closes the order.
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    seckill_tests::wait_until(LONG, "the order to leave pending_payment", || {
        db.count("SELECT COUNT(*) FROM orders WHERE status = 'pending_payment'") == 0
    });
    let status: Vec<(String, Option<String>)> = db
        .conn()
        .query("SELECT status, payment_id FROM orders")
        .unwrap();
    assert_eq!(status, vec![("expired".to_string(), None)]);
    assert!(!has_receipt(&redis, &rid, "pay-quinn-1"), "receipt kept");
    assert_eq!(outcome(&db, "pay-quinn-1").as_deref(), Some("dropped"));
    // The payment service delivers it again: one payment, still dropped.
    pay(&redis, &rid, "pay-quinn-1", 1999);
    seckill_tests::wait_until(LONG, "the payment queue to drain", || {
        redis.con().llen::<_, i64>(payment::QUEUE).unwrap() == 0
            && !has_receipt(&redis, &rid, "pay-quinn-1")
    });
    assert_eq!(outcome(&db, "pay-quinn-1").as_deref(), Some("dropped"));
    assert_eq!(db.count("SELECT COUNT(*) FROM payments"), 1);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM orders WHERE status = 'expired' AND payment_id IS NULL"),
        1
    );
}

/// Drops payment dead letter `payment:ID` with `seckill-reconciler`,
/// killed (SIGKILL) after `after`, or finishing first.
fn drop_killed(w: &crate::support::reconciler::World, id: &str, after: Duration) {
    let mut child = seckill_tests::command("seckill-reconciler")
        .args(["dead-letter", "drop", "payments", &format!("payment:{id}")])
        .args(["--by", "oncall", "--note", "refunded by PSP"])
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_REVIEW_DB", w.review_path())
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    let _ = child.kill(); // it may have finished already
    let _ = child.wait();
}

#[test]
fn a_drop_killed_at_random_moments_is_dropped_once_or_not_at_all() {
    let w = crate::support::reconciler::World::new(5);
    let rid = w.reserve(&["quinn"]).remove(0);
    w.run(); // creates the review file
    let mut con = w.redis.con();
    const N: u64 = 16;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    for i in 0..N {
        let id = format!("pay-k{i}");
        seckill_common::payment::enqueue(
            &mut con,
            &payment::PaymentMessage {
                v: 1,
                reservation_id: rid.clone(),
                payment_id: id.clone(),
                amount_cents: 1999,
                received_ms: 0,
            },
        )
        .unwrap();
        dead_letter_oldest(&w.redis);
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        drop_killed(&w, &id, Duration::from_millis((seed >> 33) % 400));
    }
    w.run(); // completes what the kills left
    let left: Vec<String> = con.lrange(payment::DEAD_LETTERS, 0, -1).unwrap();
    let mut dropped = 0;
    for i in 0..N {
        let id = format!("pay-k{i}");
        let in_dlq = left
            .iter()
            .filter(|e| e.contains(&format!("\\\"{id}\\\"")))
            .count();
        let receipt = has_receipt_in(&mut con, &rid, &id);
        let row = w
            .db
            .conn()
            .exec_first::<String, _, _>("SELECT outcome FROM payments WHERE payment_id = ?", (&id,))
            .unwrap();
        match (in_dlq, receipt, row.as_deref()) {
            (1, true, None) => {}
            (0, false, Some("dropped")) => dropped += 1,
            other => panic!("{id}: dead letters, receipt, MySQL: {other:?}"),
        }
    }
    let count = |sql: &str| w.review_count(sql);
    assert_eq!(
        count("SELECT COUNT(*) FROM actions WHERE action = 'drop_payment' AND result = 'done' AND completes IS NOT NULL"),
        dropped
    );
    let settled: i64 = con.hlen(payment::DEAD_LETTERS_SETTLED).unwrap();
    assert_eq!(settled, dropped);
    assert_eq!(
        count("SELECT COUNT(*) FROM actions s WHERE s.result = 'started' AND (SELECT COUNT(*) FROM actions c WHERE c.completes = s.id) <> 1"),
        0
    );
    println!(
        "{N} kills: {dropped} dropped, {} left as dead letters",
        left.len()
    );
}

fn has_receipt_in(con: &mut redis::Connection, rid: &str, payment_id: &str) -> bool {
    con.hexists(receipt::key(rid), format!("p:{payment_id}"))
        .unwrap()
}

#[test]
fn a_drop_killed_between_redis_and_mysql_is_recorded_in_mysql_by_the_next_run() {
    let w = crate::support::reconciler::World::new(5);
    let rid = w.reserve(&["quinn"]).remove(0);
    w.run(); // creates the review file
    let mut con = w.redis.con();
    seckill_common::payment::enqueue(
        &mut con,
        &payment::PaymentMessage {
            v: 1,
            reservation_id: rid.clone(),
            payment_id: "pay-gap".into(),
            amount_cents: 1999,
            received_ms: 0,
        },
    )
    .unwrap();
    let entry = dead_letter_oldest(&w.redis);
    // What a kill right after the script leaves: the started row, the
    // entry gone, the receipt removed, the mark set; nothing in MySQL.
    let at = "2026-12-04T10:00:00.000Z";
    rusqlite::Connection::open(w.review_path())
        .unwrap()
        .execute(
            "INSERT INTO actions (id, at, actor, finding_id, action, detail, result)
             VALUES (201, ?1, 'oncall', NULL, 'drop_payment', 'x', 'started')",
            [at],
        )
        .unwrap();
    let _: i64 = con.lrem(payment::DEAD_LETTERS, 1, &entry).unwrap();
    let _: i64 = con.hdel(receipt::key(&rid), "p:pay-gap").unwrap();
    let record = serde_json::json!({"entry": entry, "action": "drop_payment",
        "action_id": 201, "actor": "oncall", "at": at});
    let _: () = con
        .hset(
            payment::DEAD_LETTERS_SETTLED,
            format!("201@{at}"),
            record.to_string(),
        )
        .unwrap();
    w.run();
    let outcome: Option<String> =
        w.db.conn()
            .exec_first(
                "SELECT outcome FROM payments WHERE payment_id = 'pay-gap'",
                (),
            )
            .unwrap();
    assert_eq!(outcome.as_deref(), Some("dropped"));
    let c = rusqlite::Connection::open(w.review_path()).unwrap();
    let (result, detail): (String, String) = c
        .query_row(
            "SELECT result, detail FROM actions WHERE completes = 201",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(result, "done");
    assert!(detail.contains("recorded in MySQL as dropped"), "{detail}");
    w.run();
    assert_eq!(
        w.review_count("SELECT COUNT(*) FROM actions WHERE completes = 201"),
        1
    );
}
