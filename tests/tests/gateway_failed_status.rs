//! Specifies the `on_hold` purchase status over HTTP as the real pipeline
//! writes it (README "HTTP API"): two buyers
//! reserve the last two units in Redis through the gateway, MySQL holds only
//! one, the real worker orders the first and dead-letters the second
//! ("stock exhausted in MySQL"), and each buyer's
//! `GET /v1/sales/{id}/purchases/me` (with their token) answers exactly
//! `{"reservation_id", "status"}`: `queued` before the worker ran, then
//! `confirmed` and `on_hold` (not final: an operator decides it).

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{buy, raw, Gateway, Resp};
use mysql::prelude::Queryable;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Duration;
use worker_support::{dead_letters, wait_drained, Opts, WorkerProc};

/// `GET /v1/sales/{sale}/purchases/me` with `user`'s token.
fn my_status(port: u16, sale: u64, user: &str) -> Resp {
    let rq = format!(
        "GET /v1/sales/{sale}/purchases/me HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Authorization: Bearer {}\r\n\r\n",
        seckill_tests::auth::token_for(user)
    );
    raw(port, rq.as_bytes()).expect("an answer")
}

fn reservation(port: u16, sale: u64, user: &str) -> String {
    let r = buy(port, sale, user);
    assert_eq!(r.status, 202, "{user}: {r:?}");
    r.json()["reservation_id"].as_str().unwrap().to_string()
}

#[test]
fn a_purchase_the_worker_dead_lettered_reads_failed_on_purchases_me() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 2, -1000, 600_000);
    // Someone took a unit in MySQL behind Redis's back: only 1 remains.
    db.conn()
        .exec_drop("UPDATE sales SET available_stock = 1 WHERE id = ?", (sale,))
        .unwrap();
    let g = Gateway::start(&redis, &[]);
    let alice = reservation(g.port, sale, "alice");
    let bob = reservation(g.port, sale, "bob");
    for (user, rid) in [("alice", &alice), ("bob", &bob)] {
        let s = my_status(g.port, sale, user);
        assert_eq!(
            (s.status, s.json()),
            (
                200,
                serde_json::json!({"reservation_id": rid, "status": "queued", "quantity": 1})
            ),
            "{user} before the worker"
        );
    }

    // Both messages are queued: the worker takes them as one batch, in order.
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(Duration::from_secs(20), "the dead letter", || {
        dead_letters(&redis, sale).len() == 1
    });
    wait_drained(&redis, sale, Duration::from_secs(20));
    let d = dead_letters(&redis, sale);
    assert_eq!(
        (d[0].reason.as_str(), d[0].reservation_id.as_deref()),
        ("stock exhausted in MySQL", Some(bob.as_str()))
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 1);

    let s = my_status(g.port, sale, "alice");
    assert_eq!(
        (s.status, s.json()),
        (
            200,
            serde_json::json!({"reservation_id": alice, "status": "confirmed", "quantity": 1})
        )
    );
    let s = my_status(g.port, sale, "bob");
    assert_eq!(
        (s.status, s.json()),
        (
            200,
            serde_json::json!({"reservation_id": bob, "status": "on_hold", "quantity": 1})
        )
    );
    assert_eq!(s.header("Content-Type"), Some("application/json"));
}
