//! Specifies the worker's fence and its one-order-per-buyer rule on real
//! Redis and MariaDB with real `seckill-worker` processes: a message is
//! applied only while Redis holds its flow record byte for byte (a message
//! pushed by hand, or one whose reservation was released while a paused
//! worker held it, is dead-lettered and never becomes an order), and a second
//! reservation of a buyer who already holds an order from another one is
//! dead-lettered as `on_hold`, not confirmed.

use crate::support::worker as support;

use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::message::OrderMessage;
use seckill_common::release::{release, ReleaseOutcome};
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::collections::HashMap;
use std::time::Duration;
use support::{dead_letters, reserve_users, wait_drained, wait_orders, Opts, WorkerProc};

const LONG: Duration = Duration::from_secs(120);
const NO_FLOW: &str = "no matching flow record: the reservation was released or never made";

fn reserve_one(redis: &RedisServer, sale: u64, user: &str) -> String {
    match reserve(&mut redis.con(), sale, user).unwrap() {
        ReserveOutcome::Reserved(rid) => rid,
        other => panic!("{other:?}"),
    }
}

fn message(sale: u64, rid: &str, user: &str) -> String {
    OrderMessage {
        v: 1,
        reservation_id: rid.into(),
        sale_id: sale,
        user_id: user.into(),
        reserved_at_ms: seckill_common::now_ms(),
        quantity: 1,
    }
    .to_json()
}

fn available(db: &TestDb, sale: u64) -> i64 {
    db.count(&format!(
        "SELECT available_stock FROM sales WHERE id = {sale}"
    ))
}

fn statuses(redis: &RedisServer, sale: u64) -> HashMap<String, String> {
    redis.con().hgetall(SaleKeys::new(sale).status()).unwrap()
}

fn workers(redis: &RedisServer) -> Vec<String> {
    redis.con().smembers(keys::WORKERS).unwrap()
}

#[test]
fn hand_pushed_messages_without_their_flow_record_never_take_a_buyers_unit() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    // Exactly as many units as real buyers: any forged order would leave a
    // real buyer without stock in MySQL.
    let sale = create_sale(&db, &redis, 4, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    reserve_users(&redis, sale, "u", 2);
    // A made-up reservation: valid JSON, no flow record.
    let made_up = "0000000000000000000000000000f00d";
    let forged = message(sale, made_up, "mallory");
    let _: () = con.lpush(k.queue(), &forged).unwrap();
    // A real reservation id with another buyer: differs from its flow record.
    let real = reserve_one(&redis, sale, "u-2");
    let copy = message(sale, &real, "mallory");
    let _: () = con.lpush(k.queue(), &copy).unwrap();
    reserve_users(&redis, sale, "v", 1);

    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(LONG, "two dead letters", || {
        dead_letters(&redis, sale).len() == 2
    });
    wait_orders(&db, sale, 4, LONG);
    wait_drained(&redis, sale, LONG);

    let users: Vec<String> = db
        .conn()
        .exec(
            "SELECT user_id FROM orders WHERE sale_id = ? ORDER BY user_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(users, ["u-0", "u-1", "u-2", "v-0"]);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 4);
    assert_eq!(available(&db, sale), 0);

    let d = dead_letters(&redis, sale);
    assert_eq!(d[0].message, forged);
    assert_eq!(d[1].message, copy);
    for (d, rid) in d.iter().zip([made_up, real.as_str()]) {
        assert_eq!(d.reason, NO_FLOW);
        assert_eq!(d.reservation_id.as_deref(), Some(rid));
        assert_eq!((d.attempts, d.worker.as_str()), (0, "w1"));
    }
    // The made-up reservation gets no status; the real ones are confirmed.
    let st = statuses(&redis, sale);
    assert_eq!(st.len(), 4);
    assert!(!st.contains_key(made_up));
    assert!(st.values().all(|s| s == "confirmed"), "{st:?}");
    assert_eq!(w.metric("seckill_worker_fenced_total"), 2);
    assert_eq!(w.metric("seckill_worker_dead_lettered_total"), 2);
    assert_eq!(w.metric("seckill_worker_orders_applied_total"), 4);
}

#[test]
fn a_reservation_released_while_queued_never_becomes_an_order_even_from_a_late_copy() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 3, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    let a = reserve_one(&redis, sale, "alice");
    let b = reserve_one(&redis, sale, "bob");
    let late = con.hget::<_, _, String>(k.flow(), &b).unwrap();
    assert_eq!(
        release(&mut con, sale, &b, &workers(&redis)).unwrap(),
        ReleaseOutcome::Released { stock_after: 2 }
    );
    // The paused worker's in-memory copy, arriving after the release.
    let _: () = con.lpush(k.queue(), &late).unwrap();
    // The released unit is sold again.
    let c = reserve_one(&redis, sale, "carol");

    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, 2, LONG);
    seckill_tests::wait_until(LONG, "one dead letter", || {
        dead_letters(&redis, sale).len() == 1
    });
    wait_drained(&redis, sale, LONG);

    let rids: Vec<String> = db
        .conn()
        .exec(
            "SELECT reservation_id FROM orders WHERE sale_id = ? ORDER BY user_id",
            (sale,),
        )
        .unwrap();
    assert_eq!(rids, [a.clone(), c.clone()]);
    assert_eq!(available(&db, sale), 1);
    let d = dead_letters(&redis, sale);
    assert_eq!(
        (d[0].reason.as_str(), d[0].message.as_str()),
        (NO_FLOW, late.as_str())
    );
    let st = statuses(&redis, sale);
    assert_eq!(st.get(&b).map(String::as_str), Some("failed"));
    assert_eq!(st.get(&a).map(String::as_str), Some("confirmed"));
    assert_eq!(st.get(&c).map(String::as_str), Some("confirmed"));
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(stock, 1);
    assert_eq!(w.metric("seckill_worker_fenced_total"), 1);
}

#[test]
fn a_paused_worker_resuming_with_a_released_reservation_in_hand_does_not_apply_it() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 3, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    reserve_users(&redis, sale, "u", 3);
    let opts = Opts {
        batch: 3,
        crash_at: Some("stop_after_move"),
        ..Opts::default()
    };
    let w = WorkerProc::start(&redis, &db, "w1", &opts);
    seckill_tests::wait_until(LONG, "w1 to stop itself", || {
        seckill_tests::is_stopped(w.pid())
    });
    let held: Vec<String> = con.lrange(k.processing("w1"), 0, -1).unwrap();
    assert_eq!(held.len(), 3);

    // What another worker's reclaim does once w1's heartbeat has expired:
    // its processing list goes back to the queue.
    let mut moved = 0;
    while let Some(m) = con
        .lpop::<_, Option<String>>(k.processing("w1"), None)
        .unwrap()
    {
        let _: () = con.rpush(k.queue(), m).unwrap();
        moved += 1;
    }
    assert_eq!(moved, 3);
    // The operator releases one of them (it is queued now, so allowed).
    let victim = OrderMessage::parse(held[1].as_bytes()).unwrap();
    assert_eq!(
        release(&mut con, sale, &victim.reservation_id, &workers(&redis)).unwrap(),
        ReleaseOutcome::Released { stock_after: 1 }
    );
    let queued: usize = con.llen(k.queue()).unwrap();
    assert_eq!(queued, 2);

    // w1 resumes with all three in memory.
    w.signal("-CONT");
    seckill_tests::wait_until(LONG, "one dead letter", || {
        dead_letters(&redis, sale).len() == 1
    });
    wait_orders(&db, sale, 2, LONG);
    wait_drained(&redis, sale, LONG);
    seckill_tests::wait_until(LONG, "the queued copies to be seen as done", || {
        w.metric("seckill_worker_messages_already_done_total") == 2
    });
    let d = dead_letters(&redis, sale);
    assert_eq!(d[0].reason, NO_FLOW);
    assert_eq!(d[0].message, held[1]);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE reservation_id = '{}'",
            victim.reservation_id
        )),
        0
    );
    assert_eq!(available(&db, sale), 1);
    let st = statuses(&redis, sale);
    assert_eq!(
        st.get(&victim.reservation_id).map(String::as_str),
        Some("failed")
    );

    // The released unit goes to someone else: exactly three orders, stock 0.
    reserve_one(&redis, sale, "late");
    wait_orders(&db, sale, 3, LONG);
    wait_drained(&redis, sale, LONG);
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 3);
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 3);
    assert_eq!(available(&db, sale), 0);
    assert_eq!(w.metric("seckill_worker_orders_applied_total"), 3);
    assert_eq!(w.metric("seckill_worker_fenced_total"), 1);
}

#[test]
fn a_second_reservation_of_a_buyer_with_an_order_is_dead_lettered_on_hold() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let mut con = redis.con();
    // Alice's first reservation is released, and she reserves again; but an
    // order of the first one reached MySQL anyway (the window the fence
    // cannot close: a release between its read and the commit).
    let first = reserve_one(&redis, sale, "alice");
    assert!(matches!(
        release(&mut con, sale, &first, &workers(&redis)).unwrap(),
        ReleaseOutcome::Released { .. }
    ));
    let second = reserve_one(&redis, sale, "alice");
    let mut c = db.conn();
    c.exec_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status) \
         VALUES (?, ?, 'alice', 1, 'confirmed')",
        (&first, sale),
    )
    .unwrap();
    let order_id: u64 = c
        .exec_first("SELECT id FROM orders WHERE reservation_id = ?", (&first,))
        .unwrap()
        .unwrap();
    reserve_users(&redis, sale, "u", 2);
    // Two flow records of one buyer in one batch (written by hand): the
    // first becomes her order, the second is refused.
    let (t1, t2) = (
        "000000000000000000000000000000a1",
        "000000000000000000000000000000a2",
    );
    for rid in [t1, t2] {
        let m = message(sale, rid, "twin");
        let _: () = con.hset(k.flow(), rid, &m).unwrap();
        let _: () = con.hset(k.status(), rid, "queued").unwrap();
        let _: () = con.lpush(k.queue(), &m).unwrap();
    }

    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    seckill_tests::wait_until(LONG, "two dead letters", || {
        dead_letters(&redis, sale).len() == 2
    });
    wait_orders(&db, sale, 4, LONG);
    wait_drained(&redis, sale, LONG);

    assert_eq!(
        db.count("SELECT COUNT(*) FROM orders WHERE user_id = 'alice'"),
        1
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM orders WHERE user_id = 'twin'"),
        1
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM orders"), 4);
    // Three orders by the worker (u-0, u-1, twin's first): three units.
    assert_eq!(db.count("SELECT COUNT(*) FROM stock_ledger"), 3);
    assert_eq!(available(&db, sale), 7);
    let twin_order: u64 = c
        .exec_first("SELECT id FROM orders WHERE reservation_id = ?", (t1,))
        .unwrap()
        .unwrap();

    let d = dead_letters(&redis, sale);
    let reason_of = |rid: &str| {
        d.iter()
            .find(|d| d.reservation_id.as_deref() == Some(rid))
            .map(|d| d.reason.clone())
    };
    assert_eq!(
        reason_of(&second),
        Some(format!(
            "user already holds order {order_id} from reservation {first}"
        ))
    );
    assert_eq!(
        reason_of(t2),
        Some(format!(
            "user already holds order {twin_order} from reservation {t1}"
        ))
    );
    let st = statuses(&redis, sale);
    assert_eq!(st.get(&second).map(String::as_str), Some("on_hold"));
    assert_eq!(st.get(t2).map(String::as_str), Some("on_hold"));
    assert_eq!(st.get(t1).map(String::as_str), Some("confirmed"));
    assert_eq!(
        st.values().filter(|s| *s == "confirmed").count(),
        3,
        "{st:?}"
    );
    assert_eq!(w.metric("seckill_worker_orders_applied_total"), 3);
    assert_eq!(w.metric("seckill_worker_messages_already_done_total"), 0);
    assert_eq!(w.metric("seckill_worker_fenced_total"), 0);
}
