//! Specifies the reservation script on a real, private Redis: exact counts
//! under concurrency, one purchase per user, and the sale window.

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{reserve, ReserveError, ReserveOutcome};
use seckill_common::sale::{load_into_redis, Sale};
use seckill_tests::{sale_snapshot, RedisServer};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;

fn sale(id: u64, stock: u64, starts_in_ms: i64, len_ms: u64) -> Sale {
    seckill_tests::test_sale(id, stock, starts_in_ms, len_ms)
}

#[test]
fn stock_100_and_1000_users_on_50_threads_reserve_exactly_100() {
    let redis = RedisServer::start();
    let id = 7;
    assert!(load_into_redis(&mut redis.con(), &sale(id, 100, -1000, 600_000), 0).unwrap());
    let k = SaleKeys::new(id);

    // A poller that records the lowest stock it ever sees while buyers run.
    let done = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicI64::new(i64::MAX));
    let poller = {
        let (done, lowest, mut con, key) = (done.clone(), lowest.clone(), redis.con(), k.stock());
        thread::spawn(move || {
            let mut polls = 0u64;
            while !done.load(Ordering::SeqCst) {
                let v: i64 = con.get(&key).unwrap();
                lowest.fetch_min(v, Ordering::SeqCst);
                polls += 1;
            }
            polls
        })
    };

    let handles: Vec<_> = (0..50)
        .map(|t| {
            let mut con = redis.con();
            thread::spawn(move || {
                (0..20)
                    .map(|i| reserve(&mut con, id, &format!("user-{t}-{i}")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let outcomes: Vec<ReserveOutcome> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    done.store(true, Ordering::SeqCst);
    let polls = poller.join().unwrap();

    let ids: Vec<&String> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::Reserved(r) => Some(r),
            _ => None,
        })
        .collect();
    let sold_out = outcomes
        .iter()
        .filter(|o| **o == ReserveOutcome::SoldOut)
        .count();
    assert_eq!(outcomes.len(), 1000);
    assert_eq!(ids.len(), 100);
    assert_eq!(sold_out, 900);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        100,
        "a reservation id repeated"
    );

    let mut con = redis.con();
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(stock, 0);
    assert!(polls > 0);
    assert!(lowest.load(Ordering::SeqCst) >= 0, "stock seen below zero");
    let flows: usize = con.hlen(k.flow()).unwrap();
    let queued: usize = con.llen(k.queue()).unwrap();
    let buyers: usize = con.hlen(k.buyers()).unwrap();
    assert_eq!((flows, queued, buyers), (100, 100, 100));

    // Each queued message is the flow record of one reserved id.
    let msgs: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let mut seen = HashSet::new();
    for m in &msgs {
        let parsed = seckill_common::message::OrderMessage::parse(m.as_bytes()).unwrap();
        assert_eq!(parsed.sale_id, id);
        let flow: String = con.hget(k.flow(), &parsed.reservation_id).unwrap();
        assert_eq!(&flow, m);
        let status: String = con.hget(k.status(), &parsed.reservation_id).unwrap();
        assert_eq!(status, "queued");
        seen.insert(parsed.reservation_id);
    }
    assert_eq!(seen.len(), 100);
}

#[test]
fn one_user_50_times_at_once_reserves_exactly_once() {
    let redis = RedisServer::start();
    let id = 8;
    load_into_redis(&mut redis.con(), &sale(id, 10, -1000, 600_000), 0).unwrap();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let mut con = redis.con();
            thread::spawn(move || reserve(&mut con, id, "alice").unwrap())
        })
        .collect();
    let outcomes: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let reserved: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::Reserved(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    let again: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            ReserveOutcome::AlreadyPurchased(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reserved.len(), 1);
    assert_eq!(again.len(), 49);
    assert!(again.iter().all(|r| *r == reserved[0]));
    let stock: i64 = redis.con().get(SaleKeys::new(id).stock()).unwrap();
    assert_eq!(stock, 9);
}

#[test]
fn window_and_unknown_sale_are_refused_without_any_change() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(1, 5, 60_000, 60_000), 0).unwrap(); // opens in 60 s
    load_into_redis(&mut con, &sale(2, 5, -120_000, 60_000), 0).unwrap(); // ended 60 s ago
    let before: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&i| sale_snapshot(&mut con, i))
        .collect();

    assert_eq!(
        reserve(&mut con, 1, "bob").unwrap(),
        ReserveOutcome::NotStarted
    );
    assert_eq!(reserve(&mut con, 2, "bob").unwrap(), ReserveOutcome::Ended);
    assert_eq!(
        reserve(&mut con, 3, "bob").unwrap(),
        ReserveOutcome::UnknownSale
    );
    assert!(matches!(
        reserve(&mut con, 1, "bad user"),
        Err(ReserveError::InvalidUser)
    ));
    assert!(matches!(
        reserve(&mut con, 1, ""),
        Err(ReserveError::InvalidUser)
    ));

    let after: Vec<_> = [1, 2, 3]
        .iter()
        .map(|&i| sale_snapshot(&mut con, i))
        .collect();
    assert_eq!(before, after);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("seckill:{sale:3}:*")
        .query(&mut con)
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn script_refuses_a_bad_user_id_even_when_called_directly() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(4, 5, -1000, 60_000), 0).unwrap();
    let before = sale_snapshot(&mut con, 4);
    let rid = seckill_common::ids::new_reservation_id();
    let r: redis::RedisResult<redis::Value> =
        seckill_common::reservation::prepare(4, "a\"b", &rid).invoke(&mut con);
    let e = r.unwrap_err();
    assert!(seckill_common::is_error_reply(&e), "{e}");
    assert!(e.to_string().contains("invalid user id"), "{e}");
    assert_eq!(before, sale_snapshot(&mut con, 4));
}

#[test]
fn script_is_reloaded_after_script_flush() {
    let redis = RedisServer::start();
    let mut con = redis.con();
    load_into_redis(&mut con, &sale(5, 5, -1000, 60_000), 0).unwrap();
    assert!(matches!(
        reserve(&mut con, 5, "u1").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut con).unwrap();
    assert!(matches!(
        reserve(&mut con, 5, "u2").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    let stock: i64 = con.get(SaleKeys::new(5).stock()).unwrap();
    assert_eq!(stock, 3);
}

/// The batch form of the script (the group commit's one call per bucket):
/// buyers taken in order as if one after the other. Stock 3, a batch of
/// six: a, b, a again, an invalid id, c, d. a, b and c reserve (sequences
/// 1, 2, 3), a's second turn is `already_purchased` with a's own id and the
/// stock then left (1), the invalid id is its own error, d finds it sold
/// out. Redis then holds exactly three buyers, flow records, statuses and
/// queued messages, in the buyers' order, and stock 0; a second batch of
/// one (b again) matches what the single call answers.
#[test]
fn a_batch_of_buyers_is_taken_in_order_as_if_one_after_the_other() {
    use seckill_common::reservation::{parse_batch, write_calls, ReserveKeys};
    let redis = RedisServer::start();
    let id = 9;
    assert!(load_into_redis(&mut redis.con(), &sale(id, 3, -1000, 600_000), 0).unwrap());
    let mut con = redis.con();
    seckill_common::reservation::reserve_script()
        .prepare_invoke()
        .load(&mut con)
        .unwrap();
    let keys = ReserveKeys::new(id);
    let rid = |n: u8| format!("{:032x}", u128::from(n) + 0xabc0);
    let buyers = [
        ("a".to_string(), rid(1)),
        ("b".to_string(), rid(2)),
        ("a".to_string(), rid(3)),
        ("bad id!".to_string(), rid(4)),
        ("c".to_string(), rid(5)),
        ("d".to_string(), rid(6)),
    ];
    let pairs: Vec<(&str, &str)> = buyers
        .iter()
        .map(|(u, r)| (u.as_str(), r.as_str()))
        .collect();
    let mut packed = Vec::new();
    write_calls(&mut packed, &keys, &pairs);
    let reply = redis::ConnectionLike::req_packed_command(&mut con, &packed).unwrap();
    let got: Vec<String> = parse_batch(&reply, 6)
        .into_iter()
        .map(|r| match r {
            Ok(r) => format!("{:?} seq {} stock {:?}", r.outcome, r.seq, r.stock),
            Err(e) => format!("error {e}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            format!("Reserved(\"{}\") seq 1 stock None", rid(1)),
            format!("Reserved(\"{}\") seq 2 stock None", rid(2)),
            format!("AlreadyPurchased(\"{}\") seq 2 stock Some(1)", rid(1)),
            "error reservation refused by Redis: ERR invalid user id".to_string(),
            format!("Reserved(\"{}\") seq 3 stock None", rid(5)),
            "SoldOut seq 3 stock None".to_string(),
        ]
    );
    let k = SaleKeys::new(id);
    let stock: i64 = con.get(k.stock()).unwrap();
    assert_eq!(stock, 0);
    let mut owners: Vec<(String, String)> = con.hgetall(k.buyers()).unwrap();
    owners.sort();
    assert_eq!(
        owners,
        [
            ("a".to_string(), rid(1)),
            ("b".to_string(), rid(2)),
            ("c".to_string(), rid(5))
        ]
    );
    let flows: Vec<(String, String)> = con.hgetall(k.flow()).unwrap();
    assert_eq!(flows.len(), 3);
    let statuses: Vec<(String, String)> = con.hgetall(k.status()).unwrap();
    assert_eq!(statuses.len(), 3);
    assert!(statuses.iter().all(|(_, s)| s == "queued"), "{statuses:?}");
    // LPUSH order: the oldest message at the tail, where the worker takes.
    let queue: Vec<String> = con.lrange(k.queue(), 0, -1).unwrap();
    let queued: Vec<String> = queue
        .iter()
        .rev()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_str(m).unwrap();
            format!(
                "{}:{}",
                v["user_id"].as_str().unwrap(),
                v["reservation_id"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        queued,
        [
            format!("a:{}", rid(1)),
            format!("b:{}", rid(2)),
            format!("c:{}", rid(5))
        ]
    );
    for (rid, msg) in &flows {
        assert!(
            queue.contains(msg),
            "flow record {rid} is the queued message"
        );
    }
    // One buyer in the batch form: the single call's answer, byte for byte.
    let mut one = Vec::new();
    write_calls(&mut one, &keys, &[("b", rid(7).as_str())]);
    let single = seckill_common::reservation::call(&keys, "b", &rid(7)).get_packed_command();
    assert_eq!(one, single);
    let reply = redis::ConnectionLike::req_packed_command(&mut con, &one).unwrap();
    assert_eq!(
        reply,
        redis::Value::BulkString(format!("already_purchased 3 {} 0", rid(2)).into_bytes())
    );
}

/// Every key a purchase of sale `id` touches, as `(stock, buyers, flow
/// records, statuses, queued messages)`.
fn purchase_state(con: &mut redis::Connection, id: u64) -> (i64, usize, usize, usize, usize) {
    let k = SaleKeys::new(id);
    (
        con.get(k.stock()).unwrap(),
        con.hlen(k.buyers()).unwrap(),
        con.hlen(k.flow()).unwrap(),
        con.hlen(k.status()).unwrap(),
        con.llen(k.queue()).unwrap(),
    )
}

/// A batch call larger than the script takes (its writes pass every
/// buyer to one command; Lua's `unpack` stops at 8,000 values) is refused
/// before any write, whole. Unguarded, 4,101 buyers in one call take 4,101
/// units (`DECRBY`) and then failed on `too many results to unpack`,
/// leaving stock 5,899 of 10,000 with no buyer, flow record, status or
/// message: units taken that no order, release or finding accounts for.
/// The most the script takes, [`MAX_BUYERS_PER_CALL`], all reserve.
#[test]
fn a_batch_larger_than_the_script_takes_is_refused_and_changes_nothing() {
    use seckill_common::reservation::{parse_batch, write_calls, ReserveKeys, MAX_BUYERS_PER_CALL};
    let redis = RedisServer::start();
    let id = 11;
    assert!(load_into_redis(&mut redis.con(), &sale(id, 10_000, -1000, 600_000), 0).unwrap());
    let mut con = redis.con();
    seckill_common::reservation::reserve_script()
        .prepare_invoke()
        .load(&mut con)
        .unwrap();
    let keys = ReserveKeys::new(id);
    let buyers: Vec<(String, String)> = (0..4_101u32)
        .map(|i| {
            (
                format!("{:0>64}", i),
                format!("{:032x}", 0xb000_0000u64 + u64::from(i)),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = buyers
        .iter()
        .map(|(u, r)| (u.as_str(), r.as_str()))
        .collect();
    for n in [4_101, MAX_BUYERS_PER_CALL + 1] {
        let mut packed = Vec::new();
        write_calls(&mut packed, &keys, &pairs[..n]);
        let reply = redis::ConnectionLike::req_packed_command(&mut con, &packed);
        assert_eq!(
            purchase_state(&mut con, id),
            (10_000, 0, 0, 0, 0),
            "{n} buyers: {reply:?}"
        );
        let e = match reply {
            Ok(redis::Value::ServerError(e)) => e.to_string(),
            Err(e) => e.to_string(),
            Ok(v) => panic!("{n} buyers: {v:?}"),
        };
        assert!(e.contains("too many buyers"), "{n}: {e}");
    }
    let n = MAX_BUYERS_PER_CALL;
    let mut packed = Vec::new();
    write_calls(&mut packed, &keys, &pairs[..n]);
    let reply = redis::ConnectionLike::req_packed_command(&mut con, &packed).unwrap();
    let reserved = parse_batch(&reply, n)
        .into_iter()
        .filter(|r| matches!(r, Ok(r) if matches!(r.outcome, ReserveOutcome::Reserved(_))))
        .count();
    assert_eq!(reserved, n);
    assert_eq!(
        purchase_state(&mut con, id),
        (10_000 - n as i64, n, n, n, n)
    );
}

/// A call whose arguments are not the first buyer's three then whole
/// pairs is refused with an error naming the arguments, and changes
/// nothing. Unguarded, `u1 r1 SALE u2` (the second buyer's reservation id
/// missing) would reserve u1 and drop u2 without a word, and `u1 r1` (no
/// sale id) answer an empty string.
#[test]
fn a_call_whose_arguments_are_not_whole_buyers_is_refused_and_changes_nothing() {
    let redis = RedisServer::start();
    let id = 12;
    assert!(load_into_redis(&mut redis.con(), &sale(id, 5, -1000, 600_000), 0).unwrap());
    let mut con = redis.con();
    let k = SaleKeys::new(id);
    let rid = |n: u8| format!("{:032x}", u128::from(n) + 0xc0de);
    let sale_id = id.to_string();
    let (r1, r2) = (rid(1), rid(2));
    let cases: Vec<Vec<&str>> = vec![
        vec!["u1", &r1, &sale_id, "u2"],
        vec!["u1", &r1, &sale_id, "u2", &r2, "u3"],
        vec!["u1", &r1],
        vec!["u1"],
        vec![],
    ];
    for args in &cases {
        let r: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg(seckill_common::reservation::RESERVE_LUA)
            .arg(6)
            .arg(k.meta())
            .arg(k.stock())
            .arg(k.buyers())
            .arg(k.flow())
            .arg(k.status())
            .arg(k.queue())
            .arg(&args[..])
            .query(&mut con);
        match r {
            Err(e) => assert!(
                e.to_string().contains("wrong number of arguments"),
                "{args:?}: {e}"
            ),
            Ok(v) => panic!("{args:?}: {v:?}"),
        }
        assert_eq!(purchase_state(&mut con, id), (5, 0, 0, 0, 0), "{args:?}");
    }
}

/// A private Redis holding sale `id` (`stock` units, open for ten
/// minutes) with the reservation script loaded, and a connection to it.
fn scripted_sale(id: u64, stock: u64) -> (RedisServer, redis::Connection) {
    let redis = RedisServer::start();
    assert!(load_into_redis(&mut redis.con(), &sale(id, stock, -1000, 600_000), 0).unwrap());
    let mut con = redis.con();
    seckill_common::reservation::reserve_script()
        .prepare_invoke()
        .load(&mut con)
        .unwrap();
    (redis, con)
}

/// One call of the script in sale `id` for `user` with reservation id
/// `rid`: its outcome and the sale's sequence.
fn send(con: &mut redis::Connection, id: u64, user: &str, rid: &str) -> (ReserveOutcome, u64) {
    use seckill_common::reservation::{call, parse, ReserveKeys};
    let reply: redis::Value = call(&ReserveKeys::new(id), user, rid).query(con).unwrap();
    let r = parse(&reply).unwrap();
    (r.outcome, r.seq)
}

/// Reservation id number `n`, 32 hex digits.
fn rid(n: u32) -> String {
    format!("{n:032x}")
}

/// A call sent again with the same reservation id after that reservation
/// was released (the group commit's retry of a call whose reply was lost,
/// with an expiry, a cancellation or a rollback in between) takes nothing:
/// it is answered `released` with the id. Before, it found no buyer mark
/// (removed by the release) and took a second unit under the same id, a
/// unit no order could account for (the worker's insert of that id is a
/// duplicate). A fresh id of the same buyer still buys.
#[test]
fn a_reservation_id_released_since_takes_nothing_when_sent_again() {
    use seckill_common::order::Release;
    use seckill_common::release::{release, release_order, OrderRelease, ReleaseOutcome};
    let id = 12;
    let (_redis, mut con) = scripted_sale(id, 5);
    let (expired, rolled_back) = (rid(0xe1), rid(0xe2));
    assert_eq!(
        send(&mut con, id, "a", &expired),
        (ReserveOutcome::Reserved(expired.clone()), 1)
    );
    assert_eq!(
        send(&mut con, id, "b", &rolled_back),
        (ReserveOutcome::Reserved(rolled_back.clone()), 2)
    );
    assert_eq!(
        release_order(&mut con, SaleKeys::new(id), &expired, Release::Expire, true).unwrap(),
        OrderRelease::Released { stock_after: 4 }
    );
    assert_eq!(
        release(&mut con, id, &rolled_back, &[]).unwrap(),
        ReleaseOutcome::Released { stock_after: 5 }
    );
    let before = purchase_state(&mut con, id);
    assert_eq!(before, (5, 0, 0, 2, 0));
    assert_eq!(
        send(&mut con, id, "a", &expired),
        (ReserveOutcome::Released(expired.clone()), 2)
    );
    assert_eq!(
        send(&mut con, id, "b", &rolled_back),
        (ReserveOutcome::Released(rolled_back.clone()), 2)
    );
    assert_eq!(purchase_state(&mut con, id), before);
    let fresh = rid(0xe3);
    assert_eq!(
        send(&mut con, id, "a", &fresh),
        (ReserveOutcome::Reserved(fresh.clone()), 3)
    );
    assert_eq!(purchase_state(&mut con, id), (4, 1, 1, 3, 1));
}

/// A re-send of a released reservation id when no unit is left is
/// answered `released` too (not `sold_out`: a split sale's gateway pulls a
/// unit from another bucket on `sold_out` and buys it under a fresh id,
/// `gateway_broken_link::a_*_split_sale_purchase_rolled_back_*`), in a
/// batch as alone, and takes nothing.
#[test]
fn a_released_reservation_id_sent_again_with_no_stock_left_is_released_not_sold_out() {
    use seckill_common::release::{release, ReleaseOutcome};
    use seckill_common::reservation::{parse_batch, write_calls, ReserveKeys};
    let id = 13;
    let (_redis, mut con) = scripted_sale(id, 1);
    let (first, other, fresh) = (rid(0xf1), rid(0xf2), rid(0xf3));
    assert_eq!(
        send(&mut con, id, "a", &first).0,
        ReserveOutcome::Reserved(first.clone())
    );
    assert_eq!(
        release(&mut con, id, &first, &[]).unwrap(),
        ReleaseOutcome::Released { stock_after: 1 }
    );
    assert_eq!(
        send(&mut con, id, "b", &other).0,
        ReserveOutcome::Reserved(other.clone())
    );
    let before = purchase_state(&mut con, id);
    assert_eq!(before.0, 0, "sold out");
    assert_eq!(
        send(&mut con, id, "a", &first).0,
        ReserveOutcome::Released(first.clone())
    );
    // In a batch: the released id, then a fresh buyer (sold out).
    let mut packed = Vec::new();
    write_calls(
        &mut packed,
        &ReserveKeys::new(id),
        &[("a", first.as_str()), ("c", fresh.as_str())],
    );
    let reply = redis::ConnectionLike::req_packed_command(&mut con, &packed).unwrap();
    let got: Vec<ReserveOutcome> = parse_batch(&reply, 2)
        .into_iter()
        .map(|r| r.unwrap().outcome)
        .collect();
    assert_eq!(
        got,
        [
            ReserveOutcome::Released(first.clone()),
            ReserveOutcome::SoldOut
        ]
    );
    assert_eq!(purchase_state(&mut con, id), before);
}

/// A sale that keeps a released buyer's mark (no `rebuy_after_release`):
/// the re-send of the cancelled reservation's id is answered `released`,
/// not the buyer's own `already_purchased` (which the gateway turns into
/// 202 `queued` for an order its status route calls `cancelled`), and
/// takes nothing. The buyer's new attempt (a fresh id)
/// is still `already_purchased` with the old id, the mark being kept.
#[test]
fn a_cancelled_reservation_whose_mark_is_kept_is_released_when_sent_again() {
    use seckill_common::order::Release;
    use seckill_common::release::{release_order, OrderRelease};
    let id = 14;
    let (_redis, mut con) = scripted_sale(id, 3);
    let (first, fresh) = (rid(0xc1), rid(0xc2));
    assert_eq!(
        send(&mut con, id, "a", &first).0,
        ReserveOutcome::Reserved(first.clone())
    );
    assert_eq!(
        release_order(&mut con, SaleKeys::new(id), &first, Release::Cancel, false).unwrap(),
        OrderRelease::Released { stock_after: 3 }
    );
    let before = purchase_state(&mut con, id);
    assert_eq!(before, (3, 1, 0, 1, 0));
    assert_eq!(
        send(&mut con, id, "a", &first).0,
        ReserveOutcome::Released(first.clone())
    );
    assert_eq!(
        send(&mut con, id, "a", &fresh).0,
        ReserveOutcome::AlreadyPurchased(first.clone())
    );
    assert_eq!(purchase_state(&mut con, id), before);
}

/// A dead-lettered reservation (the worker's `settle`: status `failed`,
/// flow record and buyer's mark kept, no release) sent again with its id
/// is answered as once the sale has had a release: `released` (the gateway:
/// 409 with the id), not the buyer's own `already_purchased` (which
/// `reservation::own` makes `reserved`, 202 `queued`, for a purchase the
/// status route calls `failed`). Before, the answer depended on whether
/// any other buyer of the bucket had had a release: 202 with none, 409
/// after one.
#[test]
fn a_dead_lettered_reservation_sent_again_is_released_whether_or_not_the_sale_had_a_release() {
    use seckill_common::order::Release;
    use seckill_common::release::{release_order, OrderRelease};
    let id = 15;
    let (_redis, mut con) = scripted_sale(id, 3);
    let (dead, other) = (rid(0xd1), rid(0xd2));
    assert_eq!(
        send(&mut con, id, "a", &dead).0,
        ReserveOutcome::Reserved(dead.clone())
    );
    // What the worker writes for a dead letter (worker/src/queue.rs settle).
    let _: () = con
        .hset(SaleKeys::new(id).status(), &dead, "on_hold")
        .unwrap();
    let before = purchase_state(&mut con, id);
    let no_release = send(&mut con, id, "a", &dead).0;
    assert_eq!(purchase_state(&mut con, id), before);
    // Another buyer's cancellation: the bucket has had a release.
    assert_eq!(
        send(&mut con, id, "b", &other).0,
        ReserveOutcome::Reserved(other.clone())
    );
    assert_eq!(
        release_order(&mut con, SaleKeys::new(id), &other, Release::Cancel, false).unwrap(),
        OrderRelease::Released { stock_after: 2 }
    );
    let after = purchase_state(&mut con, id);
    let with_release = send(&mut con, id, "a", &dead).0;
    assert_eq!(purchase_state(&mut con, id), after);
    assert_eq!(with_release, ReserveOutcome::Released(dead.clone()));
    assert_eq!(no_release, with_release, "the same re-send, another answer");
}
