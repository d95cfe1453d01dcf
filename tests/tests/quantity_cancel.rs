//! Specifies a buyer's cancellation over HTTP in a sale of several units
//! per buyer: `DELETE .../purchases/me` cancels the buyer's latest
//! reservation awaiting payment, then the next; a repeat once none awaits
//! payment answers the latest as cancelled. Each cancelled reservation
//! gives its units back, in Redis and in MySQL (real gateway, worker and
//! `sale create --max-per-buyer 4 --max-per-purchase 3 --payment-window`).

use crate::support::lifecycle_http::{buy_units, gateway, me};
use crate::support::quantity::{self, Terms};
use crate::support::worker::{Opts, WorkerProc};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{wait_until, RedisServer, TempDir, TestDb};
use std::time::Duration;

fn status(redis: &RedisServer, sale: u64, rid: &str) -> Option<String> {
    redis
        .con()
        .hget(SaleKeys::new(sale).status(), rid)
        .unwrap_or(None)
}

fn wait_status(redis: &RedisServer, sale: u64, rid: &str, want: &str) {
    wait_until(Duration::from_secs(60), &format!("{rid} {want}"), || {
        status(redis, sale, rid).as_deref() == Some(want)
    });
}

#[test]
fn cancelling_takes_the_latest_unpaid_reservation_then_the_next() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let terms = Terms {
        window: Some("10m"),
        ..Terms::of(10)
    };
    let sale = quantity::create(&redis, &db, &review.path().join("review.sqlite3"), &terms);
    let gw = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "qty-cancel-w1", &Opts::default());
    let first = buy_units(gw.port, sale, "ann", 3, "k-1");
    let second = buy_units(gw.port, sale, "ann", 1, "k-2");
    wait_status(&redis, sale, &first, "pending_payment");
    wait_status(&redis, sale, &second, "pending_payment");
    let stock =
        |redis: &RedisServer| -> i64 { redis.con().get(SaleKeys::new(sale).stock()).unwrap_or(-1) };
    assert_eq!(stock(&redis), 6);

    let r = me(gw.port, "DELETE", sale, Some("ann"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (202, Some(second.as_str())),
        "{r:?}"
    );
    wait_status(&redis, sale, &second, "cancelled");
    let r = me(gw.port, "DELETE", sale, Some("ann"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (202, Some(first.as_str())),
        "{r:?}"
    );
    wait_status(&redis, sale, &first, "cancelled");
    let r = me(gw.port, "DELETE", sale, Some("ann"));
    assert_eq!(
        (
            r.status,
            r.json()["reservation_id"].as_str(),
            r.json()["status"].as_str()
        ),
        (202, Some(second.as_str()), Some("cancelled")),
        "{r:?}"
    );
    assert_eq!(stock(&redis), 10, "both reservations' 4 units back");
    let q = |sql: &str| db.count(&sql.replace("SALE", &sale.to_string()));
    assert_eq!(
        q("SELECT COUNT(*) FROM orders WHERE sale_id = SALE AND status = 'cancelled'"),
        2
    );
    assert_eq!(q("SELECT available_stock FROM sales WHERE id = SALE"), 10);
    assert_eq!(
        q("SELECT SUM(delta) FROM stock_ledger WHERE sale_id = SALE AND reason = 'release'"),
        4
    );
}
