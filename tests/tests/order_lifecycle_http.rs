//! Specifies the order lifecycle over real HTTP: buyers with tokens buy
//! through the gateway, the payment service pays with signed
//! `POST /v1/payments`, buyers cancel with `DELETE .../purchases/me`, a
//! short payment window passes for the rest; real workers apply it all in
//! MySQL; the reconciler checks the books. Also: refused payments (bad
//! signature, old timestamp, malformed body) change nothing, odd ones (a
//! wrong amount, an unknown reservation) become their recorded outcome,
//! the same payment 10 times is one; and the worker's status write after
//! its commit never overwrites a lifecycle status.

use crate::support::gateway as gateway_support;
use crate::support::lifecycle_http as lifecycle;
use crate::support::worker as support;

use gateway_support::{buy, get, Gateway};
use lifecycle::{gateway, me, now_s, pay, payment_body, post_payment, signed, PRICE};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::{self, sign};
use seckill_tests::{wait_until, RedisServer, TempDir, TestDb};
use std::collections::HashMap;
use std::time::Duration;
use support::{reserve_users, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);
/// Buys one unit for each of `users` over HTTP: 202 each; their reservation ids.
fn buy_all(port: u16, sale: u64, users: &[String]) -> HashMap<String, String> {
    users
        .iter()
        .map(|u| {
            let r = buy(port, sale, u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            (
                u.clone(),
                r.json()["reservation_id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn statuses(redis: &RedisServer, sale: u64) -> HashMap<String, String> {
    redis.con().hgetall(SaleKeys::new(sale).status()).unwrap()
}

fn order_counts(db: &TestDb, sale: u64) -> Vec<(String, i64)> {
    db.conn()
        .exec(
            "SELECT status, COUNT(*) FROM orders WHERE sale_id = ? GROUP BY status ORDER BY status",
            (sale,),
        )
        .unwrap()
}

fn pairs(v: &[(&str, i64)]) -> Vec<(String, i64)> {
    v.iter().map(|(a, b)| (a.to_string(), *b)).collect()
}

fn users(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

/// Waits until every one of `rids` has the Redis status `pending_payment`.
fn wait_pending(redis: &RedisServer, sale: u64, rids: &HashMap<String, String>) {
    wait_until(LONG, "every new order pending_payment in Redis", || {
        let st = statuses(redis, sale);
        rids.values()
            .all(|r| st.get(r).map(String::as_str) == Some("pending_payment"))
    });
}

#[test]
fn paid_cancelled_and_expired_units_are_sold_again_and_the_books_balance() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    // 6 s, not the issue's 2 s: on a loaded 2-core CI machine, 200
    // purchases, their orders and 150 signed payments and cancellations
    // over HTTP took longer than 2 s, and a payer then met its deadline (a
    // late payment, not a test of the books).
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 200, "6s");
    let g = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());

    let first = users("b", 200);
    let rids = buy_all(g.port, sale, &first);
    wait_orders(&db, sale, 200, LONG);
    wait_pending(&redis, sale, &rids);
    let shown = me(g.port, "GET", sale, Some(&first[0])).json();
    assert_eq!(shown["status"], "pending_payment");
    assert!(shown["pay_by"].as_str().unwrap().ends_with('Z'), "{shown}");

    // 100 pay, 50 cancel, 50 let the window pass: the last buyers pay
    // (their deadlines are the latest), cancellations alongside.
    let port = g.port;
    let cancellers: Vec<String> = first[50..100].to_vec();
    let cancels = std::thread::spawn(move || {
        for u in &cancellers {
            let r = me(port, "DELETE", sale, Some(u));
            assert_eq!(r.status, 202, "{r:?}");
            assert_eq!(r.json()["cancellation"], "queued");
        }
    });
    for u in first[100..].iter().rev() {
        pay(g.port, &rids[u], &format!("pay-{u}"), PRICE);
    }
    cancels.join().unwrap();
    wait_until(LONG, "100 paid, 50 cancelled, 50 expired", || {
        order_counts(&db, sale) == pairs(&[("cancelled", 50), ("expired", 50), ("paid", 100)])
    });
    let k = SaleKeys::new(sale);
    wait_until(LONG, "100 units back in Redis", || {
        redis.con().get::<_, i64>(k.stock()).unwrap() == 100
    });
    wait_until(LONG, "every Redis status final", || {
        let mut n: HashMap<String, usize> = HashMap::new();
        for s in statuses(&redis, sale).into_values() {
            *n.entry(s).or_default() += 1;
        }
        n == HashMap::from([
            ("paid".to_string(), 100),
            ("cancelled".to_string(), 50),
            ("expired".to_string(), 50),
        ])
    });
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        100
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'"
        )),
        100
    );
    let released: i64 = redis.con().hlen(k.released()).unwrap();
    assert_eq!(released, 100);
    assert_eq!(
        me(g.port, "GET", sale, Some(&first[150])).json()["status"],
        "paid"
    );
    assert_eq!(
        me(g.port, "GET", sale, Some(&first[70])).json()["status"],
        "cancelled"
    );
    assert_eq!(
        me(g.port, "GET", sale, Some(&first[10])).json()["status"],
        "expired"
    );
    // A cancellation of an order no longer pending changes nothing.
    let r = me(g.port, "DELETE", sale, Some(&first[150]));
    assert_eq!(
        (r.status, r.error()),
        (409, "not_cancellable".to_string()),
        "{r:?}"
    );
    assert_eq!(r.json()["status"], "paid");
    assert_eq!(me(g.port, "DELETE", sale, Some(&first[70])).status, 202);
    assert_eq!(me(g.port, "DELETE", sale, Some(&first[10])).status, 409);

    // Sold again to 100 new buyers, who pay.
    let second = users("n", 100);
    let rids2 = buy_all(g.port, sale, &second);
    assert_eq!(buy(g.port, sale, "late-comer").status, 410);
    wait_orders(&db, sale, 300, LONG);
    wait_pending(&redis, sale, &rids2);
    for u in &second {
        pay(g.port, &rids2[u], &format!("pay-{u}"), PRICE);
    }
    wait_until(LONG, "200 paid", || {
        order_counts(&db, sale) == pairs(&[("cancelled", 50), ("expired", 50), ("paid", 200)])
    });
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    assert_eq!(redis.con().get::<_, i64>(k.stock()).unwrap(), 0);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM payments WHERE outcome = 'paid'"),
        200
    );
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 0, "0 findings: {out}");
}

/// Cancellations of `sale`: no token (401), no purchase (404), then
/// `pending`'s pending order, twice (202 each, one cancellation): one
/// order cancelled beside the paid one, its unit back in Redis.
fn cancellations_answer_as_documented(
    redis: &RedisServer,
    db: &TestDb,
    port: u16,
    sale: u64,
    pending: &str,
) {
    assert_eq!(me(port, "DELETE", sale, None).status, 401);
    assert_eq!(
        me(port, "DELETE", sale, Some("nobody")).error(),
        "purchase_not_found"
    );
    assert_eq!(me(port, "DELETE", sale, Some(pending)).status, 202);
    wait_until(LONG, "the cancellation in Redis", || {
        me(port, "GET", sale, Some(pending)).json()["status"] == "cancelled"
    });
    assert_eq!(me(port, "DELETE", sale, Some(pending)).status, 202);
    assert_eq!(
        order_counts(db, sale),
        pairs(&[("cancelled", 1), ("paid", 1)])
    );
    assert_eq!(
        redis
            .con()
            .get::<_, i64>(SaleKeys::new(sale).stock())
            .unwrap(),
        2
    );
}

#[test]
fn refused_payments_change_nothing_and_odd_ones_are_recorded() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 3, "1h");
    let g = gateway(&redis);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let buyers = users("u", 2);
    let rids = buy_all(g.port, sale, &buyers);
    wait_orders(&db, sale, 2, LONG);
    wait_pending(&redis, sale, &rids);
    let (a, b) = (&rids[&buyers[0]], &rids[&buyers[1]]);

    // Refused at the gateway: nothing queued.
    let body = payment_body(a, "pay-a", PRICE);
    let wrong = format!(
        "t={},v1={}",
        now_s(),
        sign(b"another secret, not ours", now_s(), body.as_bytes())
    );
    let cases = [
        (
            post_payment(g.port, &body, Some(&wrong)),
            401,
            "bad_signature",
        ),
        (post_payment(g.port, &body, None), 401, "bad_signature"),
        (
            post_payment(g.port, &body, Some("t=1,v1=zz")),
            401,
            "bad_signature",
        ),
        (
            post_payment(g.port, &body, Some(&signed(&body, now_s() - 400))),
            401,
            "signature_expired",
        ),
        (
            post_payment(
                g.port,
                &body,
                Some(&signed(&body.replace(a.as_str(), b.as_str()), now_s())),
            ),
            401,
            "bad_signature",
        ),
    ];
    for (r, status, code) in cases {
        assert_eq!((r.status, r.error()), (status, code.to_string()), "{r:?}");
    }
    for bad in [
        "{\"reservation_id\":".to_string(),
        r#"{"reservation_id":"x","payment_id":"p","amount_cents":1}"#.to_string(),
        format!(r#"{{"reservation_id":"{a}","payment_id":"p","amount_cents":1,"extra":1}}"#),
    ] {
        let r = post_payment(g.port, &bad, Some(&signed(&bad, now_s())));
        assert_eq!(
            (r.status, r.error()),
            (400, "invalid_request".to_string()),
            "{bad}: {r:?}"
        );
    }
    let queued: i64 = redis.con().llen(payment::QUEUE).unwrap();
    assert_eq!(queued, 0);

    // Accepted and recorded: the same payment 10 times, a wrong amount,
    // an unknown reservation.
    for _ in 0..10 {
        pay(g.port, a, "pay-a", PRICE);
    }
    pay(g.port, b, "pay-b", 1000);
    pay(
        g.port,
        "0123456789abcdef0123456789abcdef",
        "pay-unknown",
        PRICE,
    );
    wait_until(LONG, "3 payments recorded", || {
        let q: i64 = redis.con().llen(payment::QUEUE).unwrap();
        q == 0 && db.count("SELECT COUNT(*) FROM payments") == 3
    });
    wait_until(LONG, "the paid status in Redis", || {
        me(g.port, "GET", sale, Some(&buyers[0])).json()["status"] == "paid"
    });
    let outcomes: Vec<(String, String)> = db
        .conn()
        .query("SELECT payment_id, outcome FROM payments ORDER BY payment_id")
        .unwrap();
    assert_eq!(
        outcomes,
        [
            ("pay-a", "paid"),
            ("pay-b", "payment_amount_mismatch"),
            ("pay-unknown", "unknown_reservation")
        ]
        .map(|(x, y)| (x.to_string(), y.to_string()))
    );
    assert_eq!(
        order_counts(&db, sale),
        pairs(&[("paid", 1), ("pending_payment", 1)])
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale}"
        )),
        2
    );
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        1
    );
    assert_eq!(
        me(g.port, "GET", sale, Some(&buyers[1])).json()["status"],
        "pending_payment"
    );

    cancellations_answer_as_documented(&redis, &db, g.port, sale, &buyers[1]);
    let dlq: i64 = redis.con().llen(payment::DEAD_LETTERS).unwrap();
    assert_eq!(dlq, 0);

    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "the mismatch is open: {out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let mut kinds: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    // The unknown reservation's money is a finding of its own (sale 0).
    assert_eq!(
        kinds,
        ["payment_amount_mismatch", "payment_unknown_reservation"]
    );
}

#[test]
fn a_payment_without_a_configured_secret_is_503() {
    let redis = RedisServer::start();
    let g = Gateway::start(&redis, &[]);
    let body = payment_body("0123456789abcdef0123456789abcdef", "p", 1);
    let r = post_payment(g.port, &body, Some(&signed(&body, now_s())));
    assert_eq!(
        (r.status, r.error()),
        (503, "payments_not_configured".to_string())
    );
    assert_eq!(get(g.port, "/v1/payments").status, 405);
}

#[test]
fn the_workers_status_write_never_overwrites_a_lifecycle_status() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 3, "1h");
    reserve_users(&redis, sale, "s", 3);
    let k = SaleKeys::new(sale);
    let st = statuses(&redis, sale);
    let mut rids: Vec<&String> = st.keys().collect();
    rids.sort();
    // As if the lifecycle had written these before the batch was settled
    // (a sweep that expired the order first, a payment applied first).
    let _: () = redis.con().hset(k.status(), rids[0], "expired").unwrap();
    let _: () = redis.con().hset(k.status(), rids[1], "paid").unwrap();
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 3, LONG);
    wait_until(LONG, "the batch settled", || {
        let n: i64 = redis.con().llen(k.processing("w1")).unwrap();
        let q: i64 = redis.con().llen(k.queue()).unwrap();
        n == 0
            && q == 0
            && statuses(&redis, sale).get(rids[2]).map(String::as_str) == Some("pending_payment")
    });
    let after = statuses(&redis, sale);
    assert_eq!(after[rids[0]], "expired");
    assert_eq!(after[rids[1]], "paid");
    let pay_by: HashMap<String, u64> = redis.con().hgetall(k.pay_by()).unwrap();
    assert_eq!(pay_by.len(), 1, "{pay_by:?}");
    let mysql_pay_by = db.count(&format!(
        "SELECT CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED) FROM orders WHERE reservation_id = '{}'",
        rids[2]
    ));
    assert_eq!(pay_by[rids[2]] as i64, mysql_pay_by);
}
