//! Specifies the payments' way from the payment queue to MySQL with a real
//! worker: the same payment delivered 10 times is one `paid` and no ledger
//! change; a wrong amount leaves the order pending; a payment after the
//! order expired leaves it expired; both become reconciler findings; an
//! unknown reservation is recorded and changes nothing. (The same over
//! the gateway's signed `POST /v1/payments`: `order_lifecycle_http.rs`.)

use crate::support::worker as support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::PaymentMessage;
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::time::Duration;
use support::{pay, reserve_users, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);

fn rids(db: &TestDb, sale: u64) -> Vec<String> {
    db.conn()
        .exec(
            "SELECT reservation_id FROM orders WHERE sale_id = ? ORDER BY user_id",
            (sale,),
        )
        .unwrap()
}

#[test]
fn payments_apply_once_and_odd_ones_become_findings() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 3, "1h");
    let late_sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 1, "1ms");
    reserve_users(&redis, sale, "u", 3);
    reserve_users(&redis, late_sale, "l", 1);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    seckill_tests::wait_until(LONG, "the late sale's order expired in Redis", || {
        redis
            .con()
            .get::<_, i64>(SaleKeys::new(late_sale).stock())
            .unwrap()
            == 1
    });
    let r = rids(&db, sale);
    let late = rids(&db, late_sale);
    for _ in 0..10 {
        pay(&redis, &r[0], "pay-0", 1999);
    }
    pay(&redis, &r[1], "pay-1", 1000);
    pay(&redis, &late[0], "pay-late", 1999);
    pay(
        &redis,
        "0123456789abcdef0123456789abcdef",
        "pay-unknown",
        1999,
    );
    seckill_tests::wait_until(LONG, "the payment queue to drain", || {
        let q: i64 = redis.con().llen(seckill_common::payment::QUEUE).unwrap();
        q == 0 && db.count("SELECT COUNT(*) FROM payments") == 4
    });
    let outcomes: Vec<(String, String)> = db
        .conn()
        .query("SELECT payment_id, outcome FROM payments ORDER BY payment_id")
        .unwrap();
    assert_eq!(
        outcomes,
        [
            ("pay-0", "paid"),
            ("pay-1", "payment_amount_mismatch"),
            ("pay-late", "late_payment"),
            ("pay-unknown", "unknown_reservation"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let statuses: Vec<(String, String)> = db
        .conn()
        .exec(
            "SELECT user_id, status FROM orders WHERE sale_id = ? ORDER BY user_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        statuses,
        [
            ("u-0", "paid"),
            ("u-1", "pending_payment"),
            ("u-2", "pending_payment")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"
        )),
        3
    );
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {late_sale} AND status = 'expired'"
        )),
        1
    );
    let dlq: i64 = redis
        .con()
        .llen(seckill_common::payment::DEAD_LETTERS)
        .unwrap();
    assert_eq!(dlq, 0);

    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "open findings: {out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let mut kinds: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["subject"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("late_payment", "pay-late"),
            ("payment_amount_mismatch", "pay-1"),
            ("payment_unknown_reservation", "pay-unknown"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );

    // `sale show` tells the lifecycle: the window, the orders by status,
    // the units released back in Redis.
    let show = |id: u64| {
        let (code, out) =
            seckill_tests::reconciler(&redis, &db, &file, &["sale", "show", &id.to_string()]);
        assert_eq!(code, 0, "{out}");
        out
    };
    let out = show(sale);
    for line in [
        "payment window    1h",
        "orders by status  paid 1, pending_payment 2",
        "released units    -            0",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }
    let out = show(late_sale);
    for line in [
        "payment window    1ms",
        "orders by status  expired 1",
        "released units    -            1",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} not in:\n{out}");
    }
}

/// The payment queue's dead letters (a message the workers cannot apply)
/// are `dead_letter` findings of sale 0, one per entry, which only
/// `--dismiss` closes; a dismissed one stays closed while its entry stays.
#[test]
fn payments_the_workers_give_up_on_are_dead_letter_findings_of_sale_0() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let _sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 1, "1h");
    let rid = "0123456789abcdef0123456789abcdef";
    // Received in 1970 (pushed as is: the gateway's script writes Redis's
    // clock): refused at parse, dead-lettered at once.
    let _: () = redis
        .con()
        .lpush(
            seckill_common::payment::QUEUE,
            PaymentMessage {
                v: 1,
                reservation_id: rid.into(),
                payment_id: "pay-1970".into(),
                amount_cents: 1999,
                received_ms: 1_000,
            }
            .to_json(),
        )
        .unwrap();
    let _: () = redis
        .con()
        .lpush(seckill_common::payment::QUEUE, "not json")
        .unwrap();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(LONG, "two payment dead letters", || {
        redis
            .con()
            .llen::<_, i64>(seckill_common::payment::DEAD_LETTERS)
            .unwrap()
            == 2
    });

    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "open findings: {out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let mut found: Vec<(String, i64, String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["sale_id"].as_i64().unwrap(),
                f["subject"].as_str().unwrap().to_string(),
                f["evidence"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    found.sort();
    assert_eq!(found.len(), 2, "{found:?}");
    // Sorted: `payment-entry:` before `payment:`.
    assert_eq!((&found[0].0, found[0].1), (&"dead_letter".to_string(), 0));
    assert!(found[0].2.starts_with("payment-entry:"), "{found:?}");
    assert!(found[0].3.starts_with("unparsable: "), "{found:?}");
    assert_eq!(
        (&found[1].0, found[1].1, found[1].2.as_str()),
        (&"dead_letter".to_string(), 0, "payment:pay-1970")
    );
    assert!(found[1].3.starts_with("unparsable: "), "{found:?}");

    // Only --dismiss applies: the finding names no reservation.
    let id = v.as_array().unwrap()[0]["id"].as_i64().unwrap().to_string();
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &file,
        &["resolve", &id, "--reorder", "--by", "op"],
    );
    // Exit 1: refused (the reconciler's documented exit codes).
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("names no reservation; only --dismiss applies"),
        "{out}"
    );
    for f in v.as_array().unwrap() {
        let id = f["id"].as_i64().unwrap().to_string();
        let (code, out) = seckill_tests::reconciler(
            &redis,
            &db,
            &file,
            &[
                "resolve",
                &id,
                "--dismiss",
                "--by",
                "op",
                "--note",
                "refunded by hand",
            ],
        );
        assert_eq!(code, 0, "{out}");
    }
    // The entries are still there; the dismissed findings stay closed.
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "{out}");
    let (_, open) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    assert_eq!(open.trim(), "[]");
}

/// A `payment_id` applied before that comes again for another amount or
/// another reservation is not the same payment: the first one stands (its
/// order paid, one `payments` row) and each conflicting delivery is one
/// open `payment_conflict` finding with both payments as evidence, however
/// often it is delivered.
#[test]
fn a_payment_id_reused_with_other_fields_is_a_conflict_finding_and_the_first_stands() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 2, "1h");
    reserve_users(&redis, sale, "u", 2);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, LONG);
    let r = rids(&db, sale);
    let drained = || {
        seckill_tests::wait_until(LONG, "the payment queue to drain", || {
            let mut c = redis.con();
            let q: i64 = c.llen(seckill_common::payment::QUEUE).unwrap();
            let p: i64 = c.llen(seckill_common::payment::processing("w1")).unwrap();
            q == 0 && p == 0
        })
    };
    pay(&redis, &r[0], "pay-a", 1999);
    seckill_tests::wait_until(LONG, "the first payment applied", || {
        db.count("SELECT COUNT(*) FROM payments") == 1
    });
    for _ in 0..3 {
        pay(&redis, &r[0], "pay-a", 1000);
        pay(&redis, &r[1], "pay-a", 1999);
    }
    drained();

    let outcomes: Vec<(String, String, u64, String)> = db
        .conn()
        .query("SELECT payment_id, reservation_id, amount_cents, outcome FROM payments")
        .unwrap();
    assert_eq!(
        outcomes,
        [("pay-a".to_string(), r[0].clone(), 1999, "paid".to_string())]
    );
    let statuses: Vec<(String, String, Option<String>)> = db
        .conn()
        .exec(
            "SELECT reservation_id, status, payment_id FROM orders WHERE sale_id = ?
             ORDER BY user_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        statuses,
        [
            (r[0].clone(), "paid".to_string(), Some("pay-a".to_string())),
            (r[1].clone(), "pending_payment".to_string(), None),
        ]
    );

    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "open findings: {out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let mut found: Vec<(String, i64, String, serde_json::Value)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let mut e = f["evidence"].clone();
            e.as_object_mut().unwrap().remove("received_ms");
            (
                f["kind"].as_str().unwrap().to_string(),
                f["sale_id"].as_i64().unwrap(),
                f["subject"].as_str().unwrap().to_string(),
                e,
            )
        })
        .collect();
    found.sort_by(|a, b| a.2.cmp(&b.2));
    let first =
        serde_json::json!({"reservation_id": r[0], "amount_cents": 1999, "outcome": "paid"});
    let mut want = vec![
        (
            "payment_conflict".to_string(),
            sale as i64,
            format!("pay-a/{}/1000", r[0]),
            serde_json::json!({"payment_id": "pay-a", "reservation_id": r[0],
                               "amount_cents": 1000, "first": first}),
        ),
        (
            "payment_conflict".to_string(),
            sale as i64,
            format!("pay-a/{}/1999", r[1]),
            serde_json::json!({"payment_id": "pay-a", "reservation_id": r[1],
                               "amount_cents": 1999, "first": first}),
        ),
    ];
    want.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(found, want);
}

/// A payment that reached a worker before its order existed (a prompt
/// payer, the order message still queued) was recorded
/// `unknown_reservation` and its order later expired.
/// The state that race leaves — two reservations queued, no order, their
/// payments recorded `unknown_reservation` (one of the price, one not) —
/// is decided again once the orders exist: the first order `paid` (MySQL,
/// the payment's outcome, the buyer's Redis status), the second still
/// pending with a `payment_amount_mismatch`; one finding, that one.
#[test]
fn a_payment_received_before_its_order_existed_pays_it_once_it_does() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 2, "1h");
    reserve_users(&redis, sale, "early", 2);
    let k = SaleKeys::new(sale);
    let rid = |u: &str| -> String { redis.con().hget(k.buyers(), u).unwrap() };
    let (r0, r1) = (rid("early-0"), rid("early-1"));
    db.conn()
        .exec_drop(
            "INSERT INTO payments (payment_id, reservation_id, sale_id, amount_cents, outcome, received_at)
             VALUES ('pay-e0', ?, NULL, 1999, 'unknown_reservation', UTC_TIMESTAMP(3)),
                    ('pay-e1', ?, NULL, 5, 'unknown_reservation', UTC_TIMESTAMP(3))",
            (&r0, &r1),
        )
        .unwrap();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, LONG);
    seckill_tests::wait_until(LONG, "both payments decided again", || {
        db.count("SELECT COUNT(*) FROM payments WHERE outcome = 'unknown_reservation'") == 0
    });
    let outcomes: Vec<(String, String, u64)> = db
        .conn()
        .query("SELECT payment_id, outcome, sale_id FROM payments ORDER BY payment_id")
        .unwrap();
    assert_eq!(
        outcomes,
        [
            ("pay-e0".to_string(), "paid".to_string(), sale),
            (
                "pay-e1".to_string(),
                "payment_amount_mismatch".to_string(),
                sale
            )
        ]
    );
    let statuses: Vec<(String, String)> = db
        .conn()
        .exec(
            "SELECT user_id, status FROM orders WHERE sale_id = ? ORDER BY user_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        statuses,
        [("early-0", "paid"), ("early-1", "pending_payment")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    seckill_tests::wait_until(LONG, "the paid status in Redis", || {
        redis
            .con()
            .hget::<_, _, Option<String>>(k.status(), &r0)
            .unwrap()
            == Some("paid".into())
    });
    let out = seckill_tests::command("seckill-reconciler")
        .env("SECKILL_REDIS_URL", redis.url())
        .env("SECKILL_MYSQL_URL", db.url())
        .env("SECKILL_REVIEW_DB", &file)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (_, listed) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let f: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    let kinds: Vec<&str> = f.iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["payment_amount_mismatch"], "{listed}");
    // The amount paid beside the amount due (price 1999 x 1), and the buyer.
    assert_eq!(f[0]["evidence"]["amount_cents"], 5, "{listed}");
    assert_eq!(f[0]["evidence"]["expected_cents"], 1999, "{listed}");
    assert_eq!(f[0]["user_id"], "early-1", "{listed}");
}
