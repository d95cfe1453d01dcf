//! Specifies the race of a payment with its deadline: 200
//! pending orders, each paid within ±5 ms of its `pay_by`, the expiry
//! sweep running every 1 ms. Each order ends `paid` or `expired`, never
//! both; every expired unit is released exactly once (MySQL and Redis);
//! every payment that lost the race is a `late_payment` finding; and
//! `available_stock + paid + pending = total` in every MySQL snapshot a
//! poller takes meanwhile.

use crate::support::worker as support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::{enqueue, PaymentMessage};
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{reserve_users, wait_orders, Opts, WorkerProc};

const UNITS: u64 = 200;
const LONG: Duration = Duration::from_secs(120);

/// `(available_stock, paid, pending)` of `sale` in one statement (one
/// consistent snapshot).
fn books(c: &mut mysql::Conn, sale: u64) -> (i64, i64, i64) {
    let row: Option<(i64, i64, i64)> = c
        .exec_first(
            "SELECT s.available_stock,
                    CAST(COALESCE(SUM(o.status = 'paid'), 0) AS SIGNED),
                    CAST(COALESCE(SUM(o.status = 'pending_payment'), 0) AS SIGNED)
             FROM sales s LEFT JOIN orders o ON o.sale_id = s.id
             WHERE s.id = ? GROUP BY s.id",
            (sale,),
        )
        .expect("read the books");
    row.expect("the sale row")
}

#[test]
fn payments_racing_their_deadline_end_paid_or_expired_never_both() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, UNITS, "3s");
    let opts = Opts {
        expiry_every: "1ms",
        ..Opts::default()
    };
    let _w = WorkerProc::start(&redis, &db, "w1", &opts);
    reserve_users(&redis, sale, "r", UNITS as usize);
    wait_orders(&db, sale, UNITS as i64, LONG);

    // The poller: the books balance in every snapshot until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let stop = stop.clone();
        let mut c = db.conn();
        std::thread::spawn(move || {
            let mut snapshots = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let (available, paid, pending) = books(&mut c, sale);
                assert_eq!(
                    available + paid + pending,
                    UNITS as i64,
                    "available {available} + paid {paid} + pending {pending}"
                );
                snapshots += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            snapshots
        })
    };

    // Each order's payment at its deadline + (i mod 11) - 5 ms, received
    // then (the receipt script's time), in deadline order.
    let mut c = db.conn();
    c.query_drop("SET time_zone = '+00:00'")
        .expect("UTC session");
    let mut due: Vec<(String, i64)> = c
        .exec(
            "SELECT reservation_id, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED)
             FROM orders WHERE sale_id = ? AND status = 'pending_payment' ORDER BY id",
            (sale,),
        )
        .expect("read the deadlines");
    assert_eq!(due.len(), UNITS as usize);
    for (i, (_, at)) in due.iter_mut().enumerate() {
        *at += (i % 11) as i64 - 5;
    }
    due.sort_by_key(|(_, at)| *at);
    let mut con = redis.con();
    for (i, (rid, at)) in due.iter().enumerate() {
        let wait = *at - seckill_common::now_ms() as i64;
        if wait > 0 {
            std::thread::sleep(Duration::from_millis(wait as u64));
        }
        enqueue(
            &mut con,
            &PaymentMessage {
                v: 1,
                reservation_id: rid.clone(),
                payment_id: format!("race-{i}"),
                amount_cents: 1999,
                received_ms: seckill_common::now_ms(),
            },
        )
        .expect("queue the payment");
    }
    seckill_tests::wait_until(LONG, "every payment applied and no order pending", || {
        let queued: i64 = con.llen(seckill_common::payment::QUEUE).unwrap_or(-1);
        let applied = db.count(&format!(
            "SELECT COUNT(*) FROM payments WHERE sale_id = {sale}"
        ));
        let (_, _, pending) = books(&mut c, sale);
        queued == 0 && applied == UNITS as i64 && pending == 0
    });
    stop.store(true, Ordering::SeqCst);
    let snapshots = poller.join().expect("the books balanced in every snapshot");

    let paid = db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'paid'"
    ));
    let expired = db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'expired'"
    ));
    eprintln!("{paid} paid, {expired} expired; the books balanced in {snapshots} snapshots");
    assert_eq!(paid + expired, UNITS as i64, "each order paid or expired");
    // Paid orders were paid by exactly their one payment; every other
    // payment lost the race.
    let outcomes: Vec<(String, i64)> = c
        .exec(
            "SELECT outcome, COUNT(*) FROM payments WHERE sale_id = ? GROUP BY outcome ORDER BY outcome",
            (sale,),
        )
        .expect("payment outcomes");
    let mut want = vec![
        ("late_payment".to_string(), expired),
        ("paid".to_string(), paid),
    ];
    want.retain(|(_, n)| *n > 0);
    assert_eq!(outcomes, want);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'paid'
               AND payment_id IS NOT NULL"
        )),
        paid
    );
    // Every expired unit released once: MySQL ledger and stock, Redis.
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'"
        )),
        expired
    );
    assert_eq!(books(&mut c, sale), (expired, paid, 0));
    let k = SaleKeys::new(sale);
    // Redis follows MySQL's decision (the sweep's Redis step): wait for it.
    seckill_tests::wait_until(LONG, "every expired unit's Redis step", || {
        let r: i64 = con.hlen(k.released()).unwrap_or(-1);
        r == expired
    });
    let stock: i64 = con.get(k.stock()).expect("Redis stock");
    let released: i64 = con.hlen(k.released()).expect("released hash");
    let flows: i64 = con.hlen(k.flow()).expect("flow records");
    let releases: Option<i64> = con.hget(k.meta(), "releases").expect("meta");
    assert_eq!(
        (stock, released, flows, releases.unwrap_or(0)),
        (expired, expired, paid, expired),
        "Redis: stock, released, flow records, releases"
    );
    // The reconciler: exactly one late_payment finding per lost race.
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, if expired > 0 { 1 } else { 0 }, "{out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let kinds: Vec<&str> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(kinds, vec!["late_payment"; expired as usize]);
}
