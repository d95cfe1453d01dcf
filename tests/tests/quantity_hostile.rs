//! Attacks purchases of several units through the real gateway on a
//! private Redis: the same `Idempotency-Key` sent from many connections at
//! once (with the same and with different quantities), one buyer's
//! interleaved purchases under distinct keys against the limit per buyer,
//! and malformed `Idempotency-Key` headers, each checked against Redis's
//! exact state afterwards (one reservation per key, units ≤ limit, bad
//! input a 4xx with nothing changed).

use crate::support::gateway::{format_request, open_units_sale, raw, snapshot, Gateway, Resp};
use redis::Commands;
use seckill_common::allowance::Held;
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_tests::RedisServer;
use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::thread;

/// A purchase of `q` units by `user` with the raw header lines `headers`
/// (each without its CRLF), on a new connection.
fn purchase(port: u16, sale: u64, user: &str, q: u32, headers: &[&str]) -> Option<Resp> {
    let body = format!(r#"{{"user_id":"{user}","quantity":{q}}}"#);
    let mut req = format_request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        true,
    );
    for h in headers {
        req = req.replacen("\r\n", &format!("\r\n{h}\r\n"), 1);
    }
    raw(port, req.as_bytes())
}

/// `(units in flow records, flow records, queued messages, stock)` of `sale`.
fn state(redis: &RedisServer, sale: u64) -> (u32, usize, usize, i64) {
    let mut con = redis.con();
    let k = SaleKeys::new(sale);
    let flows: HashMap<String, String> = con.hgetall(k.flow()).unwrap();
    let units = flows
        .values()
        .map(|f| OrderMessage::parse(f.as_bytes()).unwrap().quantity)
        .sum();
    let queued: usize = con.llen(k.queue()).unwrap();
    let stock: i64 = con.get(k.stock()).unwrap();
    (units, flows.len(), queued, stock)
}

/// `n` threads released together, each sending one purchase of
/// `quantity(i)` units by `user` under key `key(i)`; their answers.
fn at_once(
    port: u16,
    sale: u64,
    user: &'static str,
    n: u32,
    key: fn(u32) -> String,
    quantity: fn(u32) -> u32,
) -> Vec<(u32, String, u16, String)> {
    let gate = Arc::new(Barrier::new(n as usize));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let gate = gate.clone();
            thread::spawn(move || {
                let (k, q) = (key(i), quantity(i));
                let h = format!("Idempotency-Key: {k}");
                gate.wait();
                let r = purchase(port, sale, user, q, &[&h]).expect("an answer");
                let rid = r.json()["reservation_id"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                (q, k, r.status, rid)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// 48 connections send the same key with 2 units at once: every answer
/// is 202 with the one keyed reservation id, and Redis holds exactly one
/// reservation of 2 units (stock 20 → 18, one queued message).
#[test]
fn one_key_from_many_connections_at_once_is_one_reservation() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_units_sale(&redis, 1, 20, 6, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let rid = keyed_reservation_id(1, "alice", "same-key");
    let answers = at_once(g.port, 1, "alice", 48, |_| "same-key".into(), |_| 2);
    for (_, _, status, got) in &answers {
        assert_eq!((*status, got.as_str()), (202, rid.as_str()));
    }
    assert_eq!(state(&redis, 1), (2, 1, 1, 18));
    let held: String = redis
        .con()
        .hget(SaleKeys::new(1).buyers(), "alice")
        .unwrap();
    assert_eq!(held, format!("{rid}:2"));
}

/// 45 connections send one key with quantities 1, 2 and 3 at once:
/// exactly one reservation is made; the answers of its quantity are 202
/// with its id, every other answer is 422 `idempotency_key_reused`, and
/// the stock went down by that quantity only.
#[test]
fn one_key_with_racing_quantities_reserves_once() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_units_sale(&redis, 2, 20, 6, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let rid = keyed_reservation_id(2, "bob", "racing");
    let answers = at_once(g.port, 2, "bob", 45, |_| "racing".into(), |i| 1 + i % 3);
    let (units, flows, queued, stock) = state(&redis, 2);
    assert_eq!((flows, queued, stock), (1, 1, 20 - i64::from(units)));
    for (q, _, status, got) in &answers {
        if *q == units {
            assert_eq!((*status, got.as_str()), (202, rid.as_str()), "{q}");
        } else {
            assert_eq!(*status, 422, "{q}");
        }
    }
}

/// One buyer (at most 5 units, 3 per purchase) sends 40 purchases under
/// 40 distinct keys at once: the units answered 202 never pass 5, equal
/// the buyer's Redis list and the flow records, and stock + units = 50.
#[test]
fn interleaved_keys_of_one_buyer_stay_within_the_limit() {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    open_units_sale(&redis, 3, 50, 5, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let answers = at_once(g.port, 3, "carol", 40, |i| format!("k{i}"), |i| 1 + i % 3);
    let mut won = 0;
    for (q, k, status, got) in &answers {
        match status {
            202 => {
                assert_eq!(got, &keyed_reservation_id(3, "carol", k));
                won += q;
            }
            409 => {}
            other => panic!("{k}: {other}"),
        }
    }
    assert!((3..=5).contains(&won), "{won}");
    let (units, flows, _, stock) = state(&redis, 3);
    assert_eq!((units, stock), (won, 50 - i64::from(won)));
    let held: String = redis
        .con()
        .hget(SaleKeys::new(3).buyers(), "carol")
        .unwrap();
    let held = Held::parse(&held).unwrap();
    assert_eq!((held.units(), flows), (u64::from(won), flows));
}

/// Malformed `Idempotency-Key` headers are a 400 and change nothing: an
/// empty value, 65 characters, a space inside, non-ASCII bytes, two
/// headers (even with equal values), a forbidden character. The longest
/// key (64 characters) and a key with surrounding spaces are served.
#[test]
fn every_malformed_key_header_is_a_400_and_changes_nothing() {
    let redis = RedisServer::start();
    open_units_sale(&redis, 4, 10, 4, 3);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let before = snapshot(&redis, 4);
    let long = format!("Idempotency-Key: {}", "a".repeat(65));
    let cases: Vec<Vec<String>> = vec![
        vec!["Idempotency-Key:".into()],
        vec!["Idempotency-Key: ".into()],
        vec![long],
        vec!["Idempotency-Key: a b".into()],
        vec!["Idempotency-Key: k\u{e9}y".into()],
        vec!["Idempotency-Key: a/b".into()],
        vec!["Idempotency-Key: a".into(), "Idempotency-Key: a".into()],
        vec!["Idempotency-Key: a".into(), "idempotency-key: b".into()],
    ];
    for headers in &cases {
        let hs: Vec<&str> = headers.iter().map(String::as_str).collect();
        let r = purchase(g.port, 4, "dave", 2, &hs).expect("an answer");
        assert_eq!(r.status, 400, "{headers:?}: {}", r.body);
        assert_eq!(snapshot(&redis, 4), before, "{headers:?}");
    }
    let max = "b".repeat(64);
    let h = format!("Idempotency-Key: {max}");
    let r = purchase(g.port, 4, "dave", 2, &[&h]).expect("an answer");
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        r.json()["reservation_id"],
        keyed_reservation_id(4, "dave", &max)
    );
    let r = purchase(g.port, 4, "dave", 1, &["Idempotency-Key:   k2   "]).expect("an answer");
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        r.json()["reservation_id"],
        keyed_reservation_id(4, "dave", "k2")
    );
    assert_eq!(state(&redis, 4), (3, 2, 2, 7));
}

/// `DELETE .../purchases/me` of a buyer holding two reservations of a
/// sale of several units per buyer (2 units pending payment, then 1 paid,
/// as the worker marks them): the pending one is queued for cancellation
/// under its own reservation id, one cancel message naming it; once it
/// is cancelled, the buyer's next DELETE names the paid one as not
/// cancellable. The buyer's mark (`RID:2,RID:1`) is never answered as a
/// reservation id.
#[test]
fn a_buyer_of_several_reservations_cancels_the_pending_one() {
    use crate::support::lifecycle_http::{gateway, me};
    let redis = RedisServer::start();
    open_units_sale(&redis, 5, 10, 4, 3);
    let g = gateway(&redis);
    let first = purchase(g.port, 5, "erin", 2, &["Idempotency-Key: a"]).expect("an answer");
    let second = purchase(g.port, 5, "erin", 1, &["Idempotency-Key: b"]).expect("an answer");
    assert_eq!((first.status, second.status), (202, 202));
    let (pending, paid) = (
        keyed_reservation_id(5, "erin", "a"),
        keyed_reservation_id(5, "erin", "b"),
    );
    let k = SaleKeys::new(5);
    let _: () = redis
        .con()
        .hset_multiple(
            k.status(),
            &[(&pending, "pending_payment"), (&paid, "paid")],
        )
        .unwrap();
    let r = me(g.port, "DELETE", 5, Some("erin"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (202, Some(pending.as_str())),
        "{}",
        r.body
    );
    assert_eq!(r.json()["cancellation"], "queued");
    let queued: Vec<String> = redis
        .con()
        .lrange(seckill_common::payment::QUEUE, 0, -1)
        .unwrap();
    assert_eq!(queued.len(), 1, "{queued:?}");
    let m: serde_json::Value = serde_json::from_str(&queued[0]).unwrap();
    assert_eq!(
        (m["reservation_id"].as_str(), m["user_id"].as_str()),
        (Some(pending.as_str()), Some("erin"))
    );
    let _: () = redis.con().hset(k.status(), &pending, "cancelled").unwrap();
    let r = me(g.port, "DELETE", 5, Some("erin"));
    assert_eq!(
        (r.status, r.json()["reservation_id"].as_str()),
        (409, Some(paid.as_str())),
        "{}",
        r.body
    );
    assert_eq!(r.json()["status"], "paid");
}

/// A buyer's user id may be any token, 32 hex digits included, the shape
/// of a reservation id. In a sale of several units per buyer, where an
/// order's live key is its reservation id, a buyer named like another
/// buyer's reservation cancels only their own order: with the victim's
/// 2-unit order and the look-alike buyer's 1-unit order both pending,
/// the look-alike's cancellation (as the gateway queues it) cancels the
/// look-alike's order and leaves the victim's pending.
#[test]
fn a_buyer_named_like_another_reservation_cancels_only_their_own() {
    use crate::support::quantity::{self, reserve, Terms};
    use crate::support::worker::{wait_orders, Opts, WorkerProc};
    use mysql::prelude::Queryable;
    use seckill_common::payment::{enqueue_cancel, CancelMessage, KIND_CANCEL};
    use seckill_tests::{TempDir, TestDb};
    use std::time::Duration;
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms {
        window: Some("1h"),
        ..Terms::of(10)
    };
    let sale = quantity::create(&redis, &db, &file, &terms);
    let victim = reserve(&redis, sale, "victim", "k", 2);
    let own = reserve(&redis, sale, &victim, "k", 1);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, Duration::from_secs(120));
    let m = CancelMessage {
        v: 1,
        kind: KIND_CANCEL.into(),
        sale_id: sale,
        user_id: victim.clone(),
        reservation_id: own.clone(),
        received_ms: seckill_common::now_ms(),
    };
    enqueue_cancel(&mut redis.con(), &m).unwrap();
    let cancelled = || {
        quantity::num(
            &db,
            &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND status = 'cancelled'"),
        )
    };
    seckill_tests::wait_until(Duration::from_secs(120), "one cancellation", || {
        cancelled() == 1
    });
    let statuses: Vec<(String, String)> = db
        .conn()
        .exec(
            "SELECT user_id, status FROM orders WHERE sale_id = ? ORDER BY user_id = 'victim'",
            (sale,),
        )
        .unwrap();
    assert_eq!(
        statuses,
        [
            (victim.clone(), "cancelled".to_string()),
            ("victim".to_string(), "pending_payment".to_string())
        ]
    );
}

/// The reconciler run three times while 8 connections keep buying 1-3
/// units each under fresh keys (gateway and worker running, a sale of
/// 1,000,000 units, at most 4 per buyer): no run reports anything, and once
/// the purchases stop and the worker caught up, MySQL's books equal the
/// units answered 202.
#[test]
fn the_reconciler_finds_nothing_on_a_sale_under_continuous_purchase() {
    use crate::support::quantity::{self, books, Terms};
    use crate::support::worker::{wait_orders, Opts, WorkerProc};
    use seckill_tests::{TempDir, TestDb};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let review = TempDir::new();
    let file = review.path().join("review.sqlite3");
    let terms = Terms::of(1_000_000);
    let sale = quantity::create(&redis, &db, &file, &terms);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (units, reservations) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let port = g.port;
    let buyers: Vec<_> = (0..8u32)
        .map(|t| {
            let (stop, units, reservations) = (stop.clone(), units.clone(), reservations.clone());
            thread::spawn(move || {
                let mut i = 0u32;
                while !stop.load(Ordering::Acquire) {
                    let q = 1 + (i + t) % 3;
                    let user = format!("t{t}u{i}");
                    let r = purchase(port, sale, &user, q, &["Idempotency-Key: once"])
                        .expect("an answer");
                    assert_eq!(r.status, 202, "{}", r.body);
                    units.fetch_add(q, Ordering::AcqRel);
                    thread::sleep(Duration::from_millis(2));
                    reservations.fetch_add(1, Ordering::AcqRel);
                    i += 1;
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(quantity::findings(&redis, &db, &file));
    }
    stop.store(true, Ordering::Release);
    for b in buyers {
        b.join().unwrap();
    }
    let (units, reservations) = (
        units.load(Ordering::Acquire),
        reservations.load(Ordering::Acquire),
    );
    assert!(units > 0 && units < 1_000_000, "{units}");
    wait_orders(&db, sale, i64::from(reservations), Duration::from_secs(120));
    seen.push(quantity::findings(&redis, &db, &file));
    assert!(seen.iter().all(Vec::is_empty), "{seen:?}");
    let u = i64::from(units);
    assert_eq!(
        books(&db, sale),
        (i64::from(reservations), u, u, 1_000_000 - u)
    );
}

/// Copies the files of directory `from` into `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// What the data-loss tests start from: a private Redis and database, a
/// sale of 60 units (4 per buyer, 3 per purchase) made by `sale create`
/// with its review file, and a worker applying it.
struct LossWorld {
    redis: RedisServer,
    db: seckill_tests::TestDb,
    review: seckill_tests::TempDir,
    sale: u64,
    _worker: crate::support::worker::WorkerProc,
}

impl LossWorld {
    fn start() -> LossWorld {
        use crate::support::quantity::{self, Terms};
        use crate::support::worker::{Opts, WorkerProc};
        let redis = RedisServer::start();
        let db = seckill_tests::TestDb::create();
        let review = seckill_tests::TempDir::new();
        let sale = quantity::create(&redis, &db, &Self::file_in(&review), &Terms::of(60));
        let _worker = WorkerProc::start(&redis, &db, "w1", &Opts::default());
        LossWorld {
            redis,
            db,
            review,
            sale,
            _worker,
        }
    }

    fn file_in(review: &seckill_tests::TempDir) -> std::path::PathBuf {
        review.path().join("review.sqlite3")
    }

    /// The review file.
    fn file(&self) -> std::path::PathBuf {
        Self::file_in(&self.review)
    }

    /// A copy of Redis's append-only files as they are, to restart from
    /// ([`LossWorld::restart_from`]).
    fn snapshot(&self) -> seckill_tests::TempDir {
        let snapshot = seckill_tests::TempDir::new();
        copy_dir(&self.redis.dir().join("appendonlydir"), snapshot.path());
        snapshot
    }

    /// Waits until the workers' watch has seen the sale's sequence at `seq`
    /// units, then stops Redis and restarts it from `snapshot`: every write
    /// since the snapshot is lost, and MySQL's mark says so.
    fn lose_since(&mut self, snapshot: &seckill_tests::TempDir, seq: i64) {
        let (db, sale) = (&self.db, self.sale);
        let long = std::time::Duration::from_secs(60);
        seckill_tests::wait_until(long, &format!("seq_high {seq}"), || {
            db.count(&format!(
                "SELECT COALESCE(MAX(seq_high), 0) FROM sale_redis_state WHERE sale_id = {sale}"
            )) == seq
        });
        self.redis.stop();
        let aof = self.redis.dir().join("appendonlydir");
        std::fs::remove_dir_all(&aof).unwrap();
        copy_dir(snapshot.path(), &aof);
        self.redis.restart();
    }
}

/// A purchase of `q` units by `user` under `key` until it is not 503
/// `unavailable` (the gateway reconnecting): its answer.
fn buy_keyed(port: u16, sale: u64, user: &str, q: u32, key: &str) -> Resp {
    let h = format!("Idempotency-Key: {key}");
    loop {
        let r = purchase(port, sale, user, q, &[&h]).expect("an answer");
        if (r.status, r.error().as_str()) != (503, "unavailable") {
            return r;
        }
        thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Redis killed and restarted from an append-only file missing the last
/// 30 of 50 units sold (10 buyers' 2-unit purchases and 10 buyers' second
/// purchase of 1), all of them orders in MySQL already. The lost keys retried
/// until the sale pauses, `sale repair`, then every key retried is 202
/// with its first reservation id, the sale sells on to exactly 60 units,
/// no reservation has two orders, no buyer holds more than 4 units in
/// MySQL or Redis, and the books agree in units.
#[test]
fn a_redis_that_lost_units_repairs_to_exact_books_in_units() {
    use crate::support::quantity::{self, books};
    use crate::support::worker::wait_orders;
    use std::time::{Duration, Instant};
    let mut w = LossWorld::start();
    let sale = w.sale;
    let g = Gateway::start(&w.redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let long = Duration::from_secs(60);
    let first: Vec<(String, u32, &str)> = (0..10).map(|i| (format!("b{i}"), 2, "a")).collect();
    let lost: Vec<(String, u32, &str)> = (10..20)
        .map(|i| (format!("b{i}"), 2, "a"))
        .chain((0..10).map(|i| (format!("b{i}"), 1, "b")))
        .collect();
    for (u, q, k) in &first {
        assert_eq!(buy_keyed(g.port, sale, u, *q, k).status, 202);
    }
    wait_orders(&w.db, sale, 10, long);
    let snapshot = w.snapshot();
    for (u, q, k) in &lost {
        assert_eq!(buy_keyed(g.port, sale, u, *q, k).status, 202);
    }
    wait_orders(&w.db, sale, 30, long);
    // The workers' watch sees the sequence at 50 units.
    w.lose_since(&snapshot, 50);
    let (redis, db, file) = (&w.redis, &w.db, w.file());
    let restarted = Instant::now();
    let mut paused = false;
    'retry: while restarted.elapsed() < Duration::from_secs(20) {
        for (u, q, k) in &lost {
            let r = buy_keyed(g.port, sale, u, *q, k);
            match (r.status, r.error().as_str()) {
                (503, "sale_paused") => {
                    paused = true;
                    break 'retry;
                }
                (202, _) => {
                    assert_eq!(r.json()["reservation_id"], keyed_reservation_id(sale, u, k))
                }
                other => panic!("{u} {k}: {other:?} {}", r.body),
            }
        }
    }
    assert!(paused, "the sale was never paused");
    let (code, out) = seckill_tests::reconciler(redis, db, &file, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (code, out) = seckill_tests::reconciler(
        redis,
        db,
        &file,
        &["sale", "repair", &sale.to_string(), "--by", "hostile"],
    );
    assert_eq!(code, 0, "{out}");
    for (u, q, k) in first.iter().chain(&lost) {
        let r = buy_keyed(g.port, sale, u, *q, k);
        assert_eq!(
            (r.status, r.json()["reservation_id"].as_str()),
            (202, Some(keyed_reservation_id(sale, u, k).as_str())),
            "{u} {k}: {}",
            r.body
        );
    }
    for i in 0..5 {
        let r = buy_keyed(g.port, sale, &format!("c{i}"), 2, "z");
        assert_eq!(r.status, 202, "c{i}: {}", r.body);
    }
    let r = buy_keyed(g.port, sale, "late", 1, "z");
    assert_eq!((r.status, r.error()), (410, "sold_out".into()));
    wait_orders(db, sale, 35, long);
    assert_eq!(books(db, sale), (35, 60, 60, 0));
    assert_eq!(
        quantity::num(
            db,
            &format!(
                "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = {sale} \
                 GROUP BY user_id HAVING SUM(quantity) > 4) t"
            )
        ),
        0
    );
    assert_eq!(quantity::redis_stock(redis, sale), 0);
    let lists: HashMap<String, String> = redis.con().hgetall(SaleKeys::new(sale).buyers()).unwrap();
    let units: u64 = lists
        .values()
        .map(|l| Held::parse(l).unwrap().units())
        .sum();
    assert_eq!((lists.len(), units), (25, 60));
    let kinds: Vec<String> = quantity::findings(redis, db, &file)
        .into_iter()
        .map(|f| f.0)
        .filter(|k| k != "redis_data_loss")
        .collect();
    assert_eq!(kinds, Vec::<String>::new());
}

/// A Redis data loss masked by new purchases: buyer b0 (at most 4 units)
/// holds 2 + 2 units as MySQL orders; Redis restarts from an append-only
/// file without the second purchase (b0's list says 2 units), and b0
/// buys 2 more under a new key before anything else happens. The units
/// taken refill the sequence to the workers' mark (4), so the data-loss
/// watch sees nothing. The worker sums b0's units in MySQL (4) under the
/// sale lock and dead-letters the message (`buyer over limit in MySQL`,
/// status `on_hold`) instead of making a third order: b0 holds exactly 4
/// units in MySQL. The reconciler reports the loss (`redis_data_loss`,
/// which pauses the sale), and `sale repair` gives back the 2 units Redis
/// took for the message (a duplicate over b0's limit) and settles its dead
/// letter.
#[test]
fn a_masked_redis_loss_never_takes_a_buyer_over_the_limit_in_mysql() {
    use crate::support::quantity;
    use crate::support::worker::wait_orders;
    use seckill_common::reservation::ReserveOutcome;
    use seckill_common::reserve_units::reserve_units;
    use std::time::Duration;
    let mut w = LossWorld::start();
    let sale = w.sale;
    let long = Duration::from_secs(60);
    let buy = |redis: &RedisServer, key: &str| {
        let rid = keyed_reservation_id(sale, "b0", key);
        reserve_units(&mut redis.con(), sale, "b0", &rid, 2)
            .unwrap()
            .outcome
    };
    assert!(matches!(buy(&w.redis, "a"), ReserveOutcome::Reserved(_)));
    wait_orders(&w.db, sale, 1, long);
    let snapshot = w.snapshot();
    assert!(matches!(buy(&w.redis, "b"), ReserveOutcome::Reserved(_)));
    wait_orders(&w.db, sale, 2, long);
    w.lose_since(&snapshot, 4);
    let (redis, db, file) = (&w.redis, &w.db, w.file());
    let k = SaleKeys::new(sale);
    // A restart the data-loss stamps cannot tell (an append-only file
    // rewritten after the watch's last check carries the local stamp
    // too): the purchase is not held, and the worker's sum in MySQL is
    // what keeps b0 within the limit.
    let stamp: Option<String> = redis
        .con()
        .hget(k.meta(), seckill_common::data_loss::STAMP_FIELD)
        .unwrap();
    if let Some(s) = stamp {
        let _: () = redis
            .con()
            .hset(k.meta(), seckill_common::data_loss::LOCAL_STAMP_FIELD, s)
            .unwrap();
    }
    assert!(matches!(buy(redis, "c"), ReserveOutcome::Reserved(_)));
    seckill_tests::wait_until(long, "the message taken or the sale paused", || {
        let queued: usize = redis.con().llen(k.queue()).unwrap();
        let dead: usize = redis.con().llen(k.dead_letter()).unwrap();
        let paused = db.count(&format!(
            "SELECT COUNT(*) FROM sale_redis_state WHERE sale_id = {sale} AND paused_reason IS NOT NULL"
        ));
        paused == 1
            || (queued == 0
                && (dead == 1
                    || quantity::num(
                        db,
                        &format!("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
                    ) == 3))
    });
    let held = quantity::num(
        db,
        &format!(
            "SELECT COALESCE(SUM(quantity), 0) FROM orders WHERE sale_id = {sale} \
             AND user_id = 'b0' AND status NOT IN ('expired', 'cancelled')"
        ),
    );
    assert_eq!(held, 4, "b0's units in MySQL");
    let rid_c = keyed_reservation_id(sale, "b0", "c");
    let dead: Vec<String> = redis.con().lrange(k.dead_letter(), 0, -1).unwrap();
    let dead: Vec<(String, Option<String>)> = dead
        .iter()
        .map(|d| {
            let d = seckill_common::dead_letter::DeadLetter::parse(d.as_bytes()).unwrap();
            (d.reason, d.reservation_id)
        })
        .collect();
    assert_eq!(
        dead,
        [(
            "buyer over limit in MySQL: the buyer's orders hold 4 unit(s), this message \
             takes 2 more, max_per_buyer 4"
                .to_string(),
            Some(rid_c.clone())
        )]
    );
    let status: Option<String> = redis.con().hget(k.status(), &rid_c).unwrap();
    assert_eq!(status.as_deref(), Some("on_hold"));
    // The reconciler sees the loss (MySQL holds b's order, Redis lost its
    // flow record) and pauses the sale; the repair gives back the 2 units
    // Redis took for c, a duplicate over b0's limit, and settles its dead
    // letter: Redis's books hold b0's 4 units in MySQL and 56 on sale.
    let kinds = quantity::findings(redis, db, &file);
    assert_eq!(
        kinds,
        [(
            "redis_data_loss".to_string(),
            "sale".to_string(),
            "critical".to_string()
        )]
    );
    let (code, out) = seckill_tests::reconciler(
        redis,
        db,
        &file,
        &["sale", "repair", &sale.to_string(), "--by", "hostile"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("1 duplicate reservations released ({rid_c})")),
        "{out}"
    );
    let (stock, list, dead, archived): (i64, Option<String>, usize, usize) = (
        quantity::redis_stock(redis, sale),
        redis.con().hget(k.buyers(), "b0").unwrap(),
        redis.con().llen(k.dead_letter()).unwrap(),
        redis.con().llen(k.dead_letter_archive()).unwrap(),
    );
    let a_b = format!(
        "{}:2,{}:2",
        keyed_reservation_id(sale, "b0", "a"),
        keyed_reservation_id(sale, "b0", "b")
    );
    assert_eq!((stock, list, dead, archived), (56, Some(a_b), 0, 1));
    let open: Vec<String> = quantity::findings(redis, db, &file)
        .into_iter()
        .map(|f| f.0)
        .filter(|k| k != "redis_data_loss")
        .collect();
    assert_eq!(open, Vec::<String>::new());
}
