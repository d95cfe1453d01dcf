//! Specifies `DELETE /v1/sales/{id}/purchases/me` on a sale of several
//! units per buyer, whose buyers hash holds a list `RID:Q,...` rather than
//! one id: the buyer cancels the latest reservation (the one the status
//! read shows), its N units go back on sale, and the answer names that
//! reservation's id, never the list.

use crate::support::lifecycle_http::{gateway, me};
use crate::support::quantity::{self, num, reserve, Terms};
use crate::support::worker::{wait_orders, Opts, WorkerProc};
use seckill_common::keys::SaleKeys;
use seckill_tests::{wait_until, RedisServer, TempDir, TestDb};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_buyer_of_several_units_cancels_the_latest_reservation_over_http() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms {
        stock: 10,
        per_buyer: 4,
        per_purchase: 3,
        window: Some("1h"),
        rebuy: false,
    };
    let sale = quantity::create(&redis, &db, &file, &terms);
    let first = reserve(&redis, sale, "carol", "k1", 3);
    let bob = reserve(&redis, sale, "bob", "k1", 2);
    let carol_latest = reserve(&redis, sale, "carol", "k2", 1);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let g = gateway(&redis);
    wait_orders(&db, sale, 3, LONG);
    let k = SaleKeys::new(sale);
    wait_until(LONG, "the three orders pending_payment in Redis", || {
        let st: std::collections::HashMap<String, String> =
            redis::Commands::hgetall(&mut redis.con(), k.status()).unwrap();
        [&first, &bob, &carol_latest]
            .iter()
            .all(|r| st.get(*r).map(String::as_str) == Some("pending_payment"))
    });

    // A buyer with one reservation (a list of one entry) and one with two.
    for (user, rid) in [("bob", &bob), ("carol", &carol_latest)] {
        let r = me(g.port, "DELETE", sale, Some(user));
        assert_eq!(r.status, 202, "{user}: {r:?}");
        assert_eq!(r.json()["reservation_id"], rid.as_str(), "{user}: {r:?}");
        assert_eq!(r.json()["cancellation"], "queued", "{user}: {r:?}");
    }
    wait_until(LONG, "two orders cancelled", || {
        num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled'"),
        ) == 2
    });
    assert_eq!(
        num(
            &db,
            &format!("SELECT available_stock FROM sales WHERE id = {sale}")
        ),
        10 - 6 + 3
    );
    let shown = me(g.port, "GET", sale, Some("carol")).json();
    assert_eq!(shown["reservation_id"], carol_latest.as_str());
    assert_eq!(shown["status"], "cancelled");
    assert_eq!(shown["quantity"], 1);
    // Carol's first reservation is untouched, and a repeat names the latest.
    assert_eq!(
        num(&db, &format!("SELECT COUNT(*) FROM orders WHERE reservation_id = '{first}' AND status = 'pending_payment'")),
        1
    );
    let again = me(g.port, "DELETE", sale, Some("carol"));
    assert_eq!(again.status, 202, "{again:?}");
    assert_eq!(again.json()["status"], "cancelled");
    assert_eq!(again.json()["reservation_id"], carol_latest.as_str());
}
