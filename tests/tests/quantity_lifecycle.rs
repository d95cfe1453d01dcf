//! Specifies the order lifecycle of orders of several units: the payment
//! due is the price times the quantity (another amount is a mismatch, the
//! order stays pending and expires), a cancellation and an expiry give
//! back all N units exactly once in MySQL (ledger +N, `available_stock`)
//! and in Redis (stock + N, `releases` + N), and the buyer's allowance is
//! freed (`--rebuy-after-release`) or kept, as the sale says; the
//! operator's rollback takes the reservation's entry out too.

use crate::support::quantity::{self, books, held, meta, num, redis_stock, reserve, Terms, PRICE};
use crate::support::worker::{pay, wait_orders, Opts, WorkerProc};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::{enqueue_cancel, CancelMessage, KIND_CANCEL};
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

fn cancel(redis: &RedisServer, sale: u64, user: &str, rid: &str) {
    let m = CancelMessage {
        v: 1,
        kind: KIND_CANCEL.into(),
        sale_id: sale,
        user_id: user.into(),
        reservation_id: rid.into(),
        received_ms: seckill_common::now_ms(),
    };
    enqueue_cancel(&mut redis.con(), &m).unwrap();
}

fn status(db: &TestDb, rid: &str) -> String {
    db.conn()
        .exec_first("SELECT status FROM orders WHERE reservation_id = ?", (rid,))
        .unwrap()
        .unwrap_or_default()
}

/// Waits until every released order of `sale` has its Redis step done and
/// `n` orders are released.
fn wait_released(db: &TestDb, sale: u64, n: i64) {
    seckill_tests::wait_until(LONG, &format!("{n} releases done in Redis"), || {
        num(db, &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status IN ('expired', 'cancelled') AND redis_released_at IS NOT NULL")) == n
    });
}

/// Moves the deadline of the orders of `rids` into the past: the worker's
/// sweep expires them.
fn expire_now(db: &TestDb, rids: &[&String]) {
    for rid in rids {
        db.conn()
            .exec_drop(
                "UPDATE orders SET pay_by = UTC_TIMESTAMP(3) - INTERVAL 1 SECOND
                 WHERE reservation_id = ?",
                (rid,),
            )
            .unwrap();
    }
}

/// The release ledger rows of `sale`: `(rows, units)`.
fn releases_in_ledger(db: &TestDb, sale: u64) -> (i64, i64) {
    (
        num(db, &format!("SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'")),
        num(db, &format!("SELECT COALESCE(SUM(delta), 0) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'")),
    )
}

#[test]
fn three_unit_orders_paid_cancelled_and_expired_keep_the_allowance() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms {
        window: Some("1h"),
        ..Terms::of(30)
    };
    let sale = quantity::create(&redis, &db, &file, &terms);
    let rp = reserve(&redis, sale, "p", "k", 3);
    let rw = reserve(&redis, sale, "w", "k", 3);
    let rc = reserve(&redis, sale, "c", "k1", 3);
    let rc2 = reserve(&redis, sale, "c", "k2", 1);
    let re = reserve(&redis, sale, "e", "k", 3);
    assert_eq!(redis_stock(&redis, sale), 17);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 5, LONG);
    pay(&redis, &rp, "pay-p", PRICE * 3);
    pay(&redis, &rw, "pay-w", PRICE);
    pay(&redis, &rc2, "pay-c2", PRICE);
    cancel(&redis, sale, "c", &rc);
    seckill_tests::wait_until(LONG, "three payments applied", || {
        num(&db, "SELECT COUNT(*) FROM payments") == 3
    });
    // w's (paid the price of one unit) and e's deadlines pass.
    expire_now(&db, &[&rw, &re]);
    wait_released(&db, sale, 3);
    let outcomes: Vec<(String, String)> = db
        .conn()
        .query("SELECT payment_id, outcome FROM payments ORDER BY payment_id")
        .unwrap();
    assert_eq!(
        outcomes,
        [
            ("pay-c2".into(), "paid".into()),
            ("pay-p".into(), "paid".into()),
            ("pay-w".into(), "payment_amount_mismatch".into())
        ]
    );
    let st: Vec<String> = [&rp, &rw, &rc, &rc2, &re]
        .iter()
        .map(|r| status(&db, r))
        .collect();
    assert_eq!(st, ["paid", "expired", "cancelled", "paid", "expired"]);
    // MySQL: 4 units held (p 3, c 1), three releases of 3 units each.
    assert_eq!(books(&db, sale), (2, 4, 4, 26));
    assert_eq!(releases_in_ledger(&db, sale), (3, 9));
    // Redis: the same units back, counted in `releases` in units.
    assert_eq!(redis_stock(&redis, sale), 26);
    assert_eq!(meta(&redis, sale, "releases"), 9);
    let k = SaleKeys::new(sale);
    let (flows, moved): (i64, i64) = (
        redis.con().hlen(k.flow()).unwrap(),
        redis.con().hlen(k.released()).unwrap(),
    );
    assert_eq!((flows, moved), (2, 3));
    // `sale show` counts the released units, not the released orders.
    let (code, show) =
        seckill_tests::reconciler(&redis, &db, &file, &["sale", "show", &sale.to_string()]);
    assert_eq!(code, 0, "{show}");
    assert!(
        show.contains("\nreleased units    -            9\n"),
        "{show}"
    );
    // Without --rebuy-after-release the released units keep counting.
    assert_eq!(held(&redis, sale, "c"), Some(format!("{rc}:3,{rc2}:1")));
    let c_list = held(&redis, sale, "c").unwrap_or_default();
    let c_held = seckill_common::allowance::Held::parse(&c_list).unwrap();
    assert_eq!(c_held.units(), 4);
    assert_eq!(held(&redis, sale, "w"), Some(format!("{rw}:3")));
    assert_eq!(held(&redis, sale, "e"), Some(format!("{re}:3")));
    let kinds: Vec<String> = quantity::findings(&redis, &db, &file)
        .into_iter()
        .map(|f| f.0)
        .collect();
    assert_eq!(kinds, ["payment_amount_mismatch"]);
}

#[test]
fn with_rebuy_released_units_free_the_allowance() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms {
        window: Some("1h"),
        rebuy: true,
        ..Terms::of(20)
    };
    let sale = quantity::create(&redis, &db, &file, &terms);
    // The operator's rollback of a queued reservation of 2 units.
    let rb = reserve(&redis, sale, "b", "k", 2);
    let rb2 = reserve(&redis, sale, "b", "k2", 1);
    let out = seckill_common::release::release(&mut redis.con(), sale, &rb, &[]).unwrap();
    assert_eq!(
        out,
        seckill_common::release::ReleaseOutcome::Released { stock_after: 19 }
    );
    assert_eq!(held(&redis, sale, "b"), Some(format!("{rb2}:1")));
    assert_eq!(meta(&redis, sale, "releases"), 2);
    let q: i64 = redis.con().llen(SaleKeys::new(sale).queue()).unwrap();
    assert_eq!(q, 1, "the rolled back message left the queue");
    let ra = reserve(&redis, sale, "a", "k1", 3);
    let ra2 = reserve(&redis, sale, "a", "k2", 1);
    assert_eq!(redis_stock(&redis, sale), 15);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    cancel(&redis, sale, "a", &ra);
    seckill_tests::wait_until(LONG, "the 3-unit order cancelled", || {
        status(&db, &ra) == "cancelled"
    });
    seckill_tests::wait_until(LONG, "its entry out of a's list", || {
        held(&redis, sale, "a") == Some(format!("{ra2}:1"))
    });
    // The other two expire; the buyers' fields go with their last entry.
    expire_now(&db, &[&ra2, &rb2]);
    wait_released(&db, sale, 3);
    assert_eq!(
        (held(&redis, sale, "a"), held(&redis, sale, "b")),
        (None, None)
    );
    assert_eq!(
        [&ra, &ra2, &rb2].map(|r| status(&db, r)),
        ["cancelled", "expired", "expired"]
    );
    assert_eq!(books(&db, sale), (0, 0, 0, 20));
    assert_eq!(releases_in_ledger(&db, sale), (3, 5));
    assert_eq!(redis_stock(&redis, sale), 20);
    assert_eq!(meta(&redis, sale, "releases"), 7);
    assert_eq!(quantity::findings(&redis, &db, &file), []);
}
