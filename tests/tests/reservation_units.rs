//! Specifies the units script (`seckill_common::reserve_units`) on a real,
//! private Redis: a purchase of N units takes all N or nothing, a larger
//! quantity that does not fit never blocks a smaller one, the buyer's
//! allowance counts units, a keyed purchase is made once (replayed with
//! the same quantity, refused with another), a released id takes nothing,
//! and a one-unit sale's script asks for a key on a sale of several units
//! per buyer.

use redis::Commands;
use seckill_common::allowance::{Entry, Held, MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::reservation::{ReserveError, ReserveOutcome};
use seckill_common::reserve_units::reserve_units;
use seckill_common::sale::load_into_redis;
use seckill_tests::{sale_snapshot, RedisServer};

/// A private Redis holding sale `id` (`stock` units, open for ten
/// minutes) with limits `L` per buyer and `Q` per purchase in its meta.
fn units_sale(id: u64, stock: u64, l: u32, q: u32) -> (RedisServer, redis::Connection) {
    let redis = RedisServer::start();
    let mut con = redis.con();
    let sale = seckill_tests::test_sale(id, stock, -1000, 600_000);
    assert!(load_into_redis(&mut con, &sale, 0).unwrap());
    let _: () = con
        .hset_multiple(
            SaleKeys::new(id).meta(),
            &[(MAX_PER_BUYER_FIELD, l), (MAX_PER_PURCHASE_FIELD, q)],
        )
        .unwrap();
    (redis, con)
}

/// Reservation id number `n`, 32 hex digits.
fn rid(n: u32) -> String {
    format!("{n:032x}")
}

/// One purchase of `n` units by `user` under `id`: the outcome.
fn buy(con: &mut redis::Connection, sale: u64, user: &str, id: &str, n: u32) -> ReserveOutcome {
    reserve_units(con, sale, user, id, n).unwrap().outcome
}

fn held(entries: &[(&str, u32)]) -> Held {
    Held(
        entries
            .iter()
            .map(|(r, q)| Entry {
                reservation_id: r.to_string(),
                quantity: *q,
            })
            .collect(),
    )
}

/// `(stock, sum of the flow records' quantities, statuses, queued
/// messages)` of sale `id`.
fn units_state(con: &mut redis::Connection, id: u64) -> (i64, u64, usize, usize) {
    let k = SaleKeys::new(id);
    let flows: Vec<String> = con.hvals(k.flow()).unwrap();
    let units = flows
        .iter()
        .map(|f| u64::from(OrderMessage::parse(f.as_bytes()).unwrap().quantity))
        .sum();
    (
        con.get(k.stock()).unwrap(),
        units,
        con.hlen(k.status()).unwrap(),
        con.llen(k.queue()).unwrap(),
    )
}

#[test]
fn a_purchase_of_three_writes_one_order_message_of_three() {
    let id = 31;
    let (_redis, mut con) = units_sale(id, 10, 4, 3);
    let (a, b) = (rid(0xa1), rid(0xa2));
    assert_eq!(
        buy(&mut con, id, "u1", &a, 3),
        ReserveOutcome::Reserved(a.clone())
    );
    assert_eq!(
        buy(&mut con, id, "u1", &b, 1),
        ReserveOutcome::Reserved(b.clone())
    );
    let k = SaleKeys::new(id);
    let flow: String = con.hget(k.flow(), &a).unwrap();
    let m = OrderMessage::parse(flow.as_bytes()).unwrap();
    let want = OrderMessage {
        v: 1,
        reservation_id: a.clone(),
        sale_id: id,
        user_id: "u1".into(),
        reserved_at_ms: m.reserved_at_ms,
        quantity: 3,
    };
    assert_eq!(flow, want.to_json());
    assert!(flow.ends_with(r#","quantity":3}"#), "{flow}");
    // One unit: the message has no quantity, byte for byte as always.
    let flow_b: String = con.hget(k.flow(), &b).unwrap();
    let mb = OrderMessage::parse(flow_b.as_bytes()).unwrap();
    assert_eq!(mb.quantity, 1);
    assert!(!flow_b.contains("quantity"), "{flow_b}");
    let queued: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    assert_eq!(queued, vec![flow_b, flow]);
    let list: String = con.hget(k.buyers(), "u1").unwrap();
    assert_eq!(Held::parse(&list).unwrap(), held(&[(&a, 3), (&b, 1)]));
    let status: String = con.hget(k.status(), &a).unwrap();
    assert_eq!(status, "queued");
    assert_eq!(units_state(&mut con, id), (6, 4, 2, 2));
    assert_eq!(
        seckill_common::reservation::read_sequence(&mut con, id).unwrap(),
        4
    );
}

/// `DUMP` of every key a purchase reads or writes (any type; `None`:
/// absent).
fn dumps(con: &mut redis::Connection, id: u64) -> Vec<Option<Vec<u8>>> {
    let k = SaleKeys::new(id);
    [
        k.meta(),
        k.stock(),
        k.buyers(),
        k.flow(),
        k.status(),
        k.queue(),
    ]
    .iter()
    .map(|key| redis::cmd("DUMP").arg(key).query(con).unwrap())
    .collect()
}

/// Each key the script writes holding the wrong type in turn, with N = 3:
/// the purchase is refused naming the key and nothing changes; fixed, the
/// same buyer buys once.
#[test]
fn a_purchase_with_any_written_key_of_the_wrong_type_changes_nothing() {
    let id = 32;
    let (redis, mut con) = units_sale(id, 20, 4, 3);
    assert_eq!(
        buy(&mut con, id, "first", &rid(1), 2),
        ReserveOutcome::Reserved(rid(1))
    );
    let k = SaleKeys::new(id);
    let written = [k.stock(), k.buyers(), k.flow(), k.status(), k.queue()];
    for (n, key) in written.iter().enumerate() {
        let kept: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let _: () = con.del(key).unwrap();
        // A hash where a string or list is, a list where a hash is.
        if key == &k.stock() || key == &k.queue() {
            let _: () = con.hset(key, "x", "1").unwrap();
        } else {
            let _: () = con.rpush(key, "x").unwrap();
        }
        let before = dumps(&mut con, id);
        let r = reserve_units(&mut con, id, "buyer", &rid(100 + n as u32), 3);
        assert!(
            matches!(&r, Err(ReserveError::Refused(e)) if e.contains(key.as_str())),
            "{key}: {r:?}"
        );
        assert_eq!(dumps(&mut con, id), before, "{key}: nothing changed");
        let _: () = con.del(key).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(kept.unwrap())
            .query(&mut con)
            .unwrap();
    }
    assert_eq!(units_state(&mut con, id), (18, 2, 1, 1));
    // Fixed: the same buyer buys 3 units once.
    assert_eq!(
        buy(&mut con, id, "buyer", &rid(200), 3),
        ReserveOutcome::Reserved(rid(200))
    );
    assert_eq!(units_state(&mut con, id), (15, 5, 2, 2));
    drop(redis);
}

#[test]
fn a_larger_quantity_that_does_not_fit_never_blocks_a_smaller_one() {
    let id = 33;
    let (_redis, mut con) = units_sale(id, 5, 4, 3);
    assert_eq!(
        buy(&mut con, id, "a", &rid(1), 3),
        ReserveOutcome::Reserved(rid(1))
    );
    let before = sale_snapshot(&mut con, id);
    let r = reserve_units(&mut con, id, "b", &rid(2), 3).unwrap();
    assert_eq!(
        (r.outcome, r.stock),
        (ReserveOutcome::NotEnoughStock(2), Some(2))
    );
    assert_eq!(sale_snapshot(&mut con, id), before, "nothing taken");
    assert_eq!(
        buy(&mut con, id, "c", &rid(3), 2),
        ReserveOutcome::Reserved(rid(3))
    );
    assert_eq!(buy(&mut con, id, "b", &rid(4), 1), ReserveOutcome::SoldOut);
    // The key that did not fit may be sent again: nothing was made of it.
    assert_eq!(buy(&mut con, id, "b", &rid(2), 3), ReserveOutcome::SoldOut);
    assert_eq!(units_state(&mut con, id), (0, 5, 2, 2));
}

#[test]
fn a_buyer_holds_at_most_the_limit_in_units() {
    let id = 34;
    let (_redis, mut con) = units_sale(id, 100, 4, 3);
    assert_eq!(
        buy(&mut con, id, "a", &rid(1), 4),
        ReserveOutcome::AboveMax(3)
    );
    assert_eq!(
        buy(&mut con, id, "a", &rid(1), 3),
        ReserveOutcome::Reserved(rid(1))
    );
    assert_eq!(
        buy(&mut con, id, "a", &rid(2), 2),
        ReserveOutcome::LimitReached(held(&[(&rid(1), 3)]))
    );
    assert_eq!(
        buy(&mut con, id, "a", &rid(3), 1),
        ReserveOutcome::Reserved(rid(3))
    );
    assert_eq!(
        buy(&mut con, id, "a", &rid(4), 1),
        ReserveOutcome::LimitReached(held(&[(&rid(1), 3), (&rid(3), 1)]))
    );
    for n in 0..4 {
        assert_eq!(
            buy(&mut con, id, "b", &rid(10 + n), 1),
            ReserveOutcome::Reserved(rid(10 + n))
        );
    }
    assert!(matches!(
        buy(&mut con, id, "b", &rid(20), 1),
        ReserveOutcome::LimitReached(h) if h.units() == 4 && h.0.len() == 4
    ));
    assert_eq!(
        buy(&mut con, id, "c", &rid(21), 2),
        ReserveOutcome::Reserved(rid(21))
    );
    assert_eq!(
        buy(&mut con, id, "c", &rid(22), 2),
        ReserveOutcome::Reserved(rid(22))
    );
    assert_eq!(units_state(&mut con, id), (88, 12, 8, 8));
}

#[test]
fn a_key_sent_again_is_replayed_with_its_quantity_and_refused_with_another() {
    let id = 35;
    let (_redis, mut con) = units_sale(id, 3, 4, 3);
    let first = rid(0xbb);
    assert_eq!(
        buy(&mut con, id, "a", &first, 2),
        ReserveOutcome::Reserved(first.clone())
    );
    let before = sale_snapshot(&mut con, id);
    assert_eq!(
        buy(&mut con, id, "a", &first, 2),
        ReserveOutcome::Replayed(first.clone())
    );
    assert_eq!(
        buy(&mut con, id, "a", &first, 1),
        ReserveOutcome::KeyReused(first.clone())
    );
    assert_eq!(
        buy(&mut con, id, "a", &first, 3),
        ReserveOutcome::KeyReused(first.clone())
    );
    assert_eq!(sale_snapshot(&mut con, id), before, "nothing taken");
    assert_eq!(
        buy(&mut con, id, "b", &rid(2), 1),
        ReserveOutcome::Reserved(rid(2))
    );
    // Sold out: the repeat is still the same answer.
    assert_eq!(
        buy(&mut con, id, "a", &first, 2),
        ReserveOutcome::Replayed(first.clone())
    );
    assert_eq!(units_state(&mut con, id), (0, 3, 2, 2));
}

#[test]
fn a_released_reservation_id_takes_nothing_when_sent_again() {
    let id = 36;
    let (_redis, mut con) = units_sale(id, 10, 4, 3);
    let k = SaleKeys::new(id);
    for (n, status) in ["expired", "cancelled", "failed"].into_iter().enumerate() {
        let r = rid(0xc0 + n as u32);
        assert_eq!(
            buy(&mut con, id, "a", &r, 1),
            ReserveOutcome::Reserved(r.clone())
        );
        let _: () = con.hset(k.status(), &r, status).unwrap();
        let before = sale_snapshot(&mut con, id);
        for q in [1, 2] {
            assert_eq!(
                buy(&mut con, id, "a", &r, q),
                ReserveOutcome::Released(r.clone())
            );
        }
        assert_eq!(sale_snapshot(&mut con, id), before, "{status}");
    }
    // An id released and moved out of the flow records (a release):
    // still released by its status.
    let _: () = con.hdel(k.flow(), rid(0xc0)).unwrap();
    assert_eq!(
        buy(&mut con, id, "a", &rid(0xc0), 3),
        ReserveOutcome::Released(rid(0xc0))
    );
}

#[test]
fn a_purchase_without_a_key_or_in_a_one_unit_sale_takes_nothing() {
    use seckill_common::reservation::reserve;
    let id = 37;
    let (redis, mut con) = units_sale(id, 10, 4, 3);
    let before = sale_snapshot(&mut con, id);
    assert_eq!(
        reserve(&mut con, id, "a").unwrap(),
        ReserveOutcome::KeyRequired
    );
    assert_eq!(buy(&mut con, id, "a", "", 2), ReserveOutcome::KeyRequired);
    assert_eq!(buy(&mut con, id, "a", "", 5), ReserveOutcome::AboveMax(3));
    assert_eq!(sale_snapshot(&mut con, id), before);
    // A sale of one unit per buyer (no limit in its meta, or 1).
    let one = 38;
    let sale = seckill_tests::test_sale(one, 10, -1000, 600_000);
    assert!(load_into_redis(&mut con, &sale, 0).unwrap());
    let before = sale_snapshot(&mut con, one);
    assert_eq!(
        buy(&mut con, one, "a", &rid(1), 1),
        ReserveOutcome::OnePerBuyer
    );
    assert_eq!(
        buy(&mut con, one, "a", &rid(1), 2),
        ReserveOutcome::OnePerBuyer
    );
    assert_eq!(sale_snapshot(&mut con, one), before);
    let _: () = con
        .hset(SaleKeys::new(one).meta(), MAX_PER_BUYER_FIELD, 1)
        .unwrap();
    assert!(matches!(
        reserve(&mut con, one, "a").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    drop(redis);
}

#[test]
fn window_pause_and_unknown_sale_answer_as_the_one_unit_script() {
    let id = 39;
    let redis = RedisServer::start();
    let mut con = redis.con();
    assert_eq!(
        buy(&mut con, id, "a", &rid(1), 2),
        ReserveOutcome::UnknownSale
    );
    for (sid, starts, len, want) in [
        (40, 60_000, 600_000, ReserveOutcome::NotStarted),
        (41, -120_000, 60_000, ReserveOutcome::Ended),
    ] {
        let sale = seckill_tests::test_sale(sid, 10, starts, len);
        assert!(load_into_redis(&mut con, &sale, 0).unwrap());
        let _: () = con
            .hset(SaleKeys::new(sid).meta(), MAX_PER_BUYER_FIELD, 4)
            .unwrap();
        assert_eq!(buy(&mut con, sid, "a", &rid(1), 2), want);
    }
    let _: () = con
        .hset(SaleKeys::new(40).meta(), "operator_paused", "1")
        .unwrap();
    assert_eq!(
        buy(&mut con, 40, "a", &rid(1), 2),
        ReserveOutcome::Paused("operator".into())
    );
}
