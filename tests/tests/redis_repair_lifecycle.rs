//! Specifies `sale repair` on a sale with a payment window (the repair
//! rebuilds each order's lifecycle state): of 10 orders, 3 expired (their units back
//! on sale), 1 paid, 6 pending; Redis then loses the sale's flow records,
//! buyer marks, statuses and released records, and a buyer whose order
//! expired reserves again (the sale does not allow it: its mark was lost);
//! the reconciler's watch pauses the sale and the repair rebuilds it from
//! MySQL: that reservation released as a duplicate, stock 3 (the released
//! units count back in), the released orders' flow records in `released` with their
//! status, `paid` and `pending_payment` kept, every buyer marked (the sale
//! does not let a released buyer buy again). Three new buyers then buy the
//! 3 units and the sale is sold out. A repair that wrote every order
//! `confirmed` would leave stock 0, not 3.

use crate::support::worker as worker_support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::lifecycle::{self, Payment};
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::{create_windowed_sale, RedisServer, TempDir, TestDb};
use std::collections::HashMap;
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(30);

fn status_count(db: &TestDb, sale: u64, status: &str) -> i64 {
    db.count(&format!(
        "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = '{status}'"
    ))
}

#[test]
fn a_repair_keeps_released_paid_and_pending_orders_as_mysql_has_them() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_windowed_sale(&redis, &db, &review, 10, "1h");
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    for i in 0..10 {
        let r = reserve(&mut con, sale, &format!("u{i}")).unwrap();
        assert!(matches!(r, ReserveOutcome::Reserved(_)), "{r:?}");
    }
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 10, LONG);
    seckill_tests::wait_until(LONG, "10 pending orders", || {
        status_count(&db, sale, "pending_payment") == 10
    });
    // Three deadlines passed: the worker's sweep expires them and puts
    // their units back in Redis.
    let mut m = db.conn();
    m.query_drop(format!(
        "UPDATE orders SET pay_by = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND
         WHERE sale_id = {sale} AND user_id IN ('u0', 'u1', 'u2')"
    ))
    .unwrap();
    seckill_tests::wait_until(LONG, "3 units back in Redis", || {
        con.get::<_, i64>(k.stock()).unwrap() == 3
    });
    let paid_rid: String = m
        .query_first(format!(
            "SELECT reservation_id FROM orders WHERE sale_id = {sale} AND user_id = 'u3'"
        ))
        .unwrap()
        .unwrap();
    let paid = lifecycle::pay(
        &mut m,
        &Payment {
            payment_id: "pay-u3".into(),
            reservation_id: paid_rid.clone(),
            amount_cents: 1999,
            received_ms: seckill_common::now_ms(),
        },
    )
    .unwrap();
    assert_eq!(
        paid,
        lifecycle::Paid::Applied(lifecycle::PaymentOutcome::Paid)
    );
    assert_eq!(status_count(&db, sale, "expired"), 3);

    // Redis loses everything of the sale but its meta and stock, with no
    // worker watching: u0, whose order expired, reserves again (its mark
    // was lost; the sale does not let a released buyer buy again).
    drop(w);
    for key in [k.flow(), k.buyers(), k.status(), k.released(), k.pay_by()] {
        con.del::<_, ()>(key).unwrap();
    }
    let slipped = match reserve(&mut con, sale, "u0").unwrap() {
        ReserveOutcome::Reserved(rid) => rid,
        other => panic!("{other:?}"),
    };
    // The reconciler's own watch finds the loss and pauses the sale.
    let (code, out) = seckill_tests::reconciler(&redis, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    assert!(con.hexists::<_, _, bool>(k.meta(), "paused").unwrap());
    let (code, out) = seckill_tests::reconciler(
        &redis,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");

    assert_eq!(con.get::<_, i64>(k.stock()).unwrap(), 3, "{out}");
    let statuses: HashMap<String, String> = con.hgetall(k.status()).unwrap();
    let mut by_word: HashMap<&str, usize> = HashMap::new();
    for s in statuses.values() {
        *by_word.entry(s.as_str()).or_default() += 1;
    }
    assert_eq!(
        by_word,
        HashMap::from([
            ("expired", 3),
            ("paid", 1),
            ("pending_payment", 6),
            ("failed", 1)
        ])
    );
    assert_eq!(
        statuses[&slipped], "failed",
        "u0's second reservation released"
    );
    assert!(out.contains("1 duplicate reservations released"), "{out}");
    assert_eq!(statuses[&paid_rid], "paid");
    let released: Vec<String> = con.hkeys(k.released()).unwrap();
    let flows: Vec<String> = con.hkeys(k.flow()).unwrap();
    assert_eq!((released.len(), flows.len()), (3, 7));
    assert_eq!(con.hlen::<_, usize>(k.buyers()).unwrap(), 10);
    assert_eq!(con.hlen::<_, usize>(k.pay_by()).unwrap(), 6);

    // The released units sell again, once each; a released buyer may not.
    let r = reserve(&mut con, sale, "u0").unwrap();
    assert!(matches!(r, ReserveOutcome::AlreadyPurchased(_)), "{r:?}");
    let mut sold = 0;
    for i in 0..5 {
        match reserve(&mut con, sale, &format!("v{i}")).unwrap() {
            ReserveOutcome::Reserved(_) => sold += 1,
            ReserveOutcome::SoldOut => {}
            other => panic!("v{i}: {other:?}"),
        }
    }
    assert_eq!(sold, 3);
    assert_eq!(con.get::<_, i64>(k.stock()).unwrap(), 0);
}
