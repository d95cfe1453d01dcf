//! Specifies that the answer to a purchase of a split sale (`sale create
//! --shards 3`) whose units are pulled to its buyer's home bucket
//! (`gateway/src/purchase/home.rs`) tells the truth across pull rounds: a
//! buyer answered 202 holds exactly the reservation named, one flow
//! record; a buyer answered anything else (503 `unavailable` included)
//! holds none. In each of 40 sales a buyer homed in an empty bucket 0
//! buys while a rival moves the units pulled there back out, as other
//! purchases would take them, in the first `PULL_ROUNDS − 1` rounds: the
//! purchase is made in the last round. For one unit (`reach_stock`) and
//! for three (`reach_units`).

use crate::support::gateway::{Client, Gateway};
use redis::Commands;
use seckill_common::buckets::home_bucket;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::transfer::{transfer, PULL_ROUNDS};
use seckill_tests::{RedisServer, TempDir, TestDb};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

const BUCKETS: u32 = 3;

/// Sales of each test.
const SALES: usize = 40;

/// A buyer of `sale` whose home bucket is 0.
fn homed_in_bucket_0(sale: u64) -> String {
    (0..)
        .map(|i| format!("s{sale}u{i}"))
        .find(|u| home_bucket(u, BUCKETS) == 0)
        .unwrap_or_default()
}

/// The reservation ids of `user`'s flow records in every bucket of `sale`.
fn flows_of(redis: &RedisServer, sale: u64, user: &str) -> Vec<String> {
    let mut con = redis.con();
    let mut out = Vec::new();
    for b in 0..BUCKETS {
        let all: Vec<(String, String)> = con.hgetall(SaleKeys::bucket(sale, b).flow()).unwrap();
        for (rid, f) in all {
            if OrderMessage::parse(f.as_bytes()).unwrap().user_id == user {
                out.push(rid);
            }
        }
    }
    out
}

/// Moves every unit that reaches bucket 0 of `sale` to bucket 1, the first
/// `PULL_ROUNDS − 1` times it finds some, or until `done`.
fn rival(redis: &RedisServer, sale: u64, done: &AtomicBool) {
    let mut con = redis.con();
    let mut taken = 0;
    while taken < PULL_ROUNDS - 1 && !done.load(Ordering::Relaxed) {
        if transfer(&mut con, SaleKeys::bucket(sale, 0), 1, 1000).unwrap() > 0 {
            taken += 1;
        }
    }
}

/// Runs [`SALES`] sales of 30 units over 3 buckets made by `sale create`
/// with `extra`, bucket 0's units moved out first; in each, one buyer
/// homed in bucket 0 asks `quantity` units (with a key when more than one)
/// while [`rival`] runs. Returns every answer that does not match the
/// buyer's flow records, and the count of 503s.
fn pulled_against_a_rival(extra: &[&str], quantity: u32) -> (Vec<String>, usize) {
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let (mut bad, mut unavailable) = (Vec::new(), 0);
    for _ in 0..SALES {
        let sale = create(&redis, &db, &review, extra);
        assert_eq!(
            transfer(&mut redis.con(), SaleKeys::bucket(sale, 0), 2, 1000).unwrap(),
            10
        );
        let user = homed_in_bucket_0(sale);
        let mut c = Client::connect(g.port);
        let done = AtomicBool::new(false);
        let r = std::thread::scope(|s| {
            s.spawn(|| rival(&redis, sale, &done));
            let r = match quantity {
                1 => c.buy(sale, &user),
                q => c.buy_units(sale, &user, q, "k1"),
            };
            done.store(true, Ordering::Relaxed);
            r
        });
        let j: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
        let rid = j["reservation_id"].as_str().map(str::to_string);
        let held = flows_of(&redis, sale, &user);
        let truthful = match r.status {
            202 => rid.is_some_and(|rid| held == [rid]),
            503 => held.is_empty(),
            _ => panic!("sale {sale} {user}: {} {}", r.status, r.body),
        };
        unavailable += usize::from(r.status == 503);
        if !truthful {
            bad.push(format!(
                "sale {sale} {user}: {} {} holds {held:?}",
                r.status, r.body
            ));
        }
    }
    (bad, unavailable)
}

fn create(redis: &RedisServer, db: &TestDb, review: &Path, extra: &[&str]) -> u64 {
    let mut args = vec!["--shards", "3"];
    args.extend(extra);
    seckill_tests::sale_created(redis, db, review, "PULL", 30, &args).0
}

#[test]
fn a_503_for_units_pulled_home_never_leaves_a_reservation_and_a_202_holds_one() {
    let (bad, unavailable) =
        pulled_against_a_rival(&["--max-per-buyer", "3", "--max-per-purchase", "3"], 3);
    assert!(
        bad.is_empty(),
        "{} untrue answers ({unavailable} × 503):\n{}",
        bad.len(),
        bad.join("\n")
    );
    eprintln!("{unavailable} × 503 of {SALES}, each holding nothing");
}

#[test]
fn a_503_for_one_unit_pulled_home_never_leaves_a_reservation_and_a_202_holds_one() {
    let (bad, unavailable) = pulled_against_a_rival(&[], 1);
    assert!(
        bad.is_empty(),
        "{} untrue answers ({unavailable} × 503):\n{}",
        bad.len(),
        bad.join("\n")
    );
    eprintln!("{unavailable} × 503 of {SALES}, each holding nothing");
}
