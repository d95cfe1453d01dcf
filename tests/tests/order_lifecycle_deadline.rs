//! Specifies the payment deadline at its edge: every order's signed
//! payment is sent through the gateway at its `pay_by` plus −5…+5 ms, with
//! the expiry sweep every 1 ms and at its default (200 ms), one and two
//! workers. The moment the gateway received the payment decides: received
//! at or before `pay_by` → the order is `paid`; after → it expires and the
//! payment is a `late_payment` finding; never both; each expired unit comes
//! back once, in MySQL and in Redis; and a poller finds `available + paid +
//! pending = total` (MySQL) and `stock + flow records = total` (Redis) at
//! every moment. Also: the receipt scripts' rules on a real Redis, and a
//! payment that meets its buyer's cancellation is its own finding, not a
//! late one.

use crate::support::lifecycle_http as lifecycle;
use crate::support::worker as support;

use lifecycle::{gateway, now_s, payment_body, post_payment, signed, PRICE};
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::payment::{self, CancelMessage, PaymentMessage};
use seckill_common::receipt::{self, Closing};
use seckill_tests::{wait_until, RedisServer, TempDir, TestDb};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::{pay, reserve_users, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);
/// Orders per trial.
const ORDERS: usize = 200;
/// The sale's payment window: long enough for 200 orders to exist before
/// the first deadline on a loaded machine, short enough for the suite.
const WINDOW: &str = "2s";
/// Threads that send the payments, so that payments of close deadlines go
/// out at their own moment rather than one after another.
const SENDERS: usize = 8;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What one trial came to: payments received at or before their deadline
/// and after it.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    in_time: usize,
    late: usize,
}

/// Checks both books' invariants of `sale` until `stop`; returns the
/// number of checks and every violation seen.
fn poller(
    redis: &RedisServer,
    db: &TestDb,
    sale: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    let mut c = db.conn();
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    std::thread::spawn(move || {
        let mut checks = 0;
        let mut bad = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            // One statement: one consistent snapshot.
            let row: Option<(i64, i64, i64, i64)> = c
                .exec_first(
                    "SELECT s.available_stock, s.total_stock,
                        (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'paid'),
                        (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'pending_payment')
                     FROM sales s WHERE s.id = ?",
                    (sale,),
                )
                .unwrap();
            let (avail, total, paid, pending) = row.unwrap();
            if avail + paid + pending != total {
                bad.push(format!(
                    "mysql: available {avail} + paid {paid} + pending {pending} != {total}"
                ));
            }
            let (stock, flow): (Option<i64>, i64) = redis::pipe()
                .atomic()
                .get(k.stock())
                .hlen(k.flow())
                .query(&mut con)
                .unwrap();
            let stock = stock.unwrap_or(-1);
            if stock + flow != total {
                bad.push(format!("redis: stock {stock} + flow {flow} != {total}"));
            }
            checks += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        (checks, bad)
    })
}

/// One trial on a new sale: 200 reservations spread over ~400 ms, each
/// order's payment sent at its deadline plus (i mod 11) − 5 ms; waits
/// until every order is final and asserts the rule.
fn trial(redis: &RedisServer, db: &TestDb, file: &Path, port: u16, label: &str) -> Tally {
    let sale = seckill_tests::create_windowed_sale(redis, db, file, ORDERS as u64, WINDOW);
    let stop = Arc::new(AtomicBool::new(false));
    let poll = poller(redis, db, sale, stop.clone());
    for chunk in 0..ORDERS / 10 {
        reserve_users(redis, sale, &format!("{label}-{chunk}"), 10);
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_orders(db, sale, ORDERS as i64, LONG);
    let deadlines: Vec<(String, i64)> = db
        .conn()
        .exec(
            "SELECT reservation_id, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED)
             FROM orders WHERE sale_id = ? ORDER BY pay_by, reservation_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(deadlines.len(), ORDERS);
    let early = deadlines
        .iter()
        .filter(|(_, at)| *at - 5 < now_ms())
        .count();
    let mut jobs: Vec<Vec<(i64, String)>> = vec![Vec::new(); SENDERS];
    for (i, (rid, at)) in deadlines.iter().enumerate() {
        jobs[i % SENDERS].push((at + (i % 11) as i64 - 5, rid.clone()));
    }
    let senders: Vec<_> = jobs
        .into_iter()
        .map(|mine| {
            std::thread::spawn(move || {
                for (at, rid) in mine {
                    let wait = at - now_ms();
                    if wait > 0 {
                        std::thread::sleep(Duration::from_millis(wait as u64));
                    }
                    let body = payment_body(&rid, &format!("pay-{rid}"), PRICE);
                    let r = post_payment(port, &body, Some(&signed(&body, now_s())));
                    assert_eq!(r.status, 202, "{r:?}");
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    wait_until(
        LONG,
        "every order paid or expired, every payment applied",
        || {
            db.count(&format!(
                "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}
             AND (status = 'paid' OR (status = 'expired' AND redis_released_at IS NOT NULL))"
            )) == ORDERS as i64
                && db.count(&format!(
                    "SELECT COUNT(*) FROM payments WHERE sale_id = {sale}"
                )) == ORDERS as i64
        },
    );
    let k = SaleKeys::new(sale);
    wait_until(LONG, "every Redis status final", || {
        let st: HashMap<String, String> = redis.con().hgetall(k.status()).unwrap();
        st.len() == ORDERS && st.values().all(|s| s == "paid" || s == "expired")
    });
    // A last look at the books once everything settled.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::SeqCst);
    let (checks, bad) = poll.join().unwrap();

    let rows: Vec<(String, String, String, i64, i64)> = db
        .conn()
        .exec(
            "SELECT o.reservation_id, o.status, p.outcome,
                    CAST(UNIX_TIMESTAMP(p.received_at) * 1000 AS SIGNED),
                    CAST(UNIX_TIMESTAMP(o.pay_by) * 1000 AS SIGNED)
             FROM orders o JOIN payments p ON p.reservation_id = o.reservation_id
             WHERE o.sale_id = ?",
            (sale,),
        )
        .unwrap();
    assert_eq!(rows.len(), ORDERS, "one payment per order");
    let mut t = Tally::default();
    let mut wrong = Vec::new();
    for (rid, status, outcome, received, pay_by) in &rows {
        let in_time = received <= pay_by;
        let want = if in_time {
            t.in_time += 1;
            ("paid", "paid")
        } else {
            t.late += 1;
            ("expired", "late_payment")
        };
        if (status.as_str(), outcome.as_str()) != want {
            wrong.push(format!(
                "{rid}: received {} ms from pay_by, order {status}, payment {outcome}",
                received - pay_by
            ));
        }
    }
    let expired = t.late as i64;
    let released = db.count(&format!(
        "SELECT COUNT(*) FROM stock_ledger WHERE sale_id = {sale} AND reason = 'release'"
    ));
    let available = db.count(&format!(
        "SELECT available_stock FROM sales WHERE id = {sale}"
    ));
    let stock: i64 = redis.con().get(k.stock()).unwrap();
    let back: i64 = redis.con().hlen(k.released()).unwrap();
    let mut st: HashMap<String, usize> = HashMap::new();
    for s in redis
        .con()
        .hgetall::<_, HashMap<String, String>>(k.status())
        .unwrap()
        .into_values()
    {
        *st.entry(s).or_default() += 1;
    }
    eprintln!(
        "{label}: {} in time, {} late ({early} deadlines already near when read), \
         {} decided against their receipt time, {checks} book checks",
        t.in_time,
        t.late,
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{label}: {} payments decided against their receipt time: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    assert_eq!(
        (released, available, stock, back),
        (expired, expired, expired, expired),
        "{label}: each expired unit back exactly once (ledger, MySQL, Redis stock, released)"
    );
    assert_eq!(st.get("paid").copied().unwrap_or(0), t.in_time, "{label}");
    assert_eq!(st.get("expired").copied().unwrap_or(0), t.late, "{label}");
    assert!(checks > 0);
    assert!(
        bad.is_empty(),
        "{label}: books broken: {:?}",
        &bad[..bad.len().min(10)]
    );
    t
}

/// Runs `trials` trials with `workers` workers sweeping every `every`,
/// then checks that the reconciler holds one `late_payment` finding per
/// late payment and nothing else.
fn scenario(workers: usize, every: &'static str, trials: usize) {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let g = gateway(&redis);
    let opts = Opts {
        expiry_every: every,
        ..Opts::default()
    };
    let _w: Vec<WorkerProc> = (0..workers)
        .map(|i| WorkerProc::start(&redis, &db, &format!("w{i}"), &opts))
        .collect();
    let total = Mutex::new(Tally::default());
    for n in 0..trials {
        let t = trial(
            &redis,
            &db,
            &file,
            g.port,
            &format!("w{workers}-{every}-{n}"),
        );
        let mut s = total.lock().unwrap();
        s.in_time += t.in_time;
        s.late += t.late;
    }
    let total = *total.lock().unwrap();
    // Both sides of the deadline were tried.
    assert!(total.in_time > 0 && total.late > 0, "{total:?}");
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, if total.late > 0 { 1 } else { 0 }, "{out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for f in v.as_array().unwrap() {
        *kinds
            .entry(f["kind"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let want: HashMap<String, usize> = if total.late > 0 {
        HashMap::from([("late_payment".to_string(), total.late)])
    } else {
        HashMap::new()
    };
    assert_eq!(kinds, want, "{out}");
}

#[test]
fn a_payment_received_by_its_deadline_pays_with_one_worker_sweeping_every_ms() {
    scenario(1, "1ms", 3);
}

#[test]
fn a_payment_received_by_its_deadline_pays_with_two_workers_sweeping_every_ms() {
    scenario(2, "1ms", 3);
}

#[test]
fn a_payment_received_by_its_deadline_pays_with_one_worker_sweeping_at_the_default() {
    scenario(1, "200ms", 2);
}

#[test]
fn a_payment_received_by_its_deadline_pays_with_two_workers_sweeping_at_the_default() {
    scenario(2, "200ms", 2);
}

fn redis_now_ms(con: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    s * 1000 + us / 1000
}

fn receipt_fields(con: &mut redis::Connection, rid: &str) -> Vec<String> {
    let mut f: Vec<String> = con.hkeys(receipt::key(rid)).unwrap();
    f.sort();
    f
}

#[test]
fn a_receipt_is_kept_until_mysql_has_it_and_a_payment_after_the_closing_is_late() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    let rid = "0123456789abcdef0123456789abcdef";
    let m = |pid: &str, amount: u64| PaymentMessage {
        v: 1,
        reservation_id: rid.into(),
        payment_id: pid.into(),
        amount_cents: amount,
        received_ms: 1,
    };
    // Received: queued with Redis's time (not the caller's), recorded for
    // at most a week.
    let a = receipt::receive(&mut con, &m("a", PRICE)).unwrap();
    let now = redis_now_ms(&mut con);
    assert!(a.received_ms <= now && a.received_ms + 1_000 > now, "{a:?}");
    let ttl: i64 = con.pttl(receipt::key(rid)).unwrap();
    assert!(ttl > 0 && ttl as u64 <= receipt::RECEIPT_TTL_MS, "{ttl}");
    // A replay of the same payment queues the very same message: its
    // first receipt time stands.
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(receipt::receive(&mut con, &m("a", PRICE)).unwrap(), a);
    // Another payment id is a receipt of its own; the same id with another
    // amount is queued with its own time and leaves the first receipt.
    let b = receipt::receive(&mut con, &m("b", 1000)).unwrap();
    let odd = receipt::receive(&mut con, &m("a", 5)).unwrap();
    assert_eq!(odd.amount_cents, 5);
    let queued: i64 = con.llen(payment::QUEUE).unwrap();
    assert_eq!(queued, 4);
    assert_eq!(receipt_fields(&mut con, rid), ["p:a", "p:b"]);
    // Not past `pay_by` by Redis's clock: the closing refuses.
    assert_eq!(
        receipt::close(&mut con, rid, now + 60_000).unwrap(),
        Closing::Open
    );
    assert_eq!(receipt_fields(&mut con, rid), ["p:a", "p:b"]);
    // Forgetting the odd delivery leaves a's receipt; b's own goes.
    receipt::forget(&mut con, &odd).unwrap();
    receipt::forget(&mut con, &b).unwrap();
    assert_eq!(receipt_fields(&mut con, rid), ["p:a"]);
    // Past `pay_by`: closed, with the receipts left.
    let pay_by = a.received_ms;
    assert_eq!(
        receipt::close(&mut con, rid, pay_by).unwrap(),
        Closing::Closed(vec![a.clone()])
    );
    let closed: u64 = con.hget(receipt::key(rid), "closed").unwrap();
    assert!(closed > pay_by);
    // A payment after the closing is past it, and no receipt: even when
    // Redis's clock says otherwise (a failover to a master whose clock is
    // behind, here a closing 60 s ahead of the clock).
    let late = receipt::receive(&mut con, &m("c", PRICE)).unwrap();
    assert!(late.received_ms > closed);
    let ahead = redis_now_ms(&mut con) + 60_000;
    let _: () = con.hset(receipt::key(rid), "closed", ahead).unwrap();
    let behind = receipt::receive(&mut con, &m("d", PRICE)).unwrap();
    assert_eq!(behind.received_ms, ahead + 1);
    assert_eq!(receipt_fields(&mut con, rid), ["closed", "p:a"]);
    // Closing again returns the same; once a is forgotten the mark stays
    // an hour, not a week.
    assert_eq!(
        receipt::close(&mut con, rid, pay_by).unwrap(),
        Closing::Closed(vec![a.clone()])
    );
    receipt::forget(&mut con, &a).unwrap();
    assert_eq!(receipt_fields(&mut con, rid), ["closed"]);
    let ttl: i64 = con.pttl(receipt::key(rid)).unwrap();
    assert!(ttl > 0 && ttl as u64 <= receipt::CLOSED_TTL_MS, "{ttl}");
}

#[test]
fn a_payment_that_meets_its_buyers_cancellation_is_its_own_finding_not_a_late_one() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let sale = seckill_tests::create_windowed_sale(&redis, &db, &file, 2, "1h");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    reserve_users(&redis, sale, "c", 1);
    wait_orders(&db, sale, 1, LONG);
    let rid: String = db
        .conn()
        .exec_first(
            "SELECT reservation_id FROM orders WHERE sale_id = ?",
            (sale,),
        )
        .unwrap()
        .unwrap();
    payment::enqueue_cancel(
        &mut redis.con(),
        &CancelMessage::new(sale, "c-0", &rid, seckill_common::now_ms()),
    )
    .unwrap();
    wait_until(LONG, "the order cancelled", || {
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled'"
        )) == 1
    });
    // Paid an hour before its deadline, after the buyer cancelled.
    pay(&redis, &rid, "pay-after-cancel", PRICE);
    wait_until(LONG, "the payment applied", || {
        db.count("SELECT COUNT(*) FROM payments") == 1
    });
    let row: Option<(String, String)> = db
        .conn()
        .exec_first(
            "SELECT p.outcome, o.status FROM payments p
             JOIN orders o ON o.reservation_id = p.reservation_id",
            (),
        )
        .unwrap();
    assert_eq!(
        row,
        Some((
            "payment_after_cancellation".to_string(),
            "cancelled".to_string()
        ))
    );
    let (code, out) = seckill_tests::reconciler(&redis, &db, &file, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, json) = seckill_tests::reconciler(&redis, &db, &file, &["findings", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("findings json");
    let kinds: Vec<(String, String)> = v
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
    assert_eq!(
        kinds,
        [(
            "payment_after_cancellation".to_string(),
            "pay-after-cancel".to_string()
        )]
    );
    // The receipt went once MySQL had the payment.
    let left: i64 = redis.con().exists(receipt::key(&rid)).unwrap();
    assert_eq!(left, 0);
}
