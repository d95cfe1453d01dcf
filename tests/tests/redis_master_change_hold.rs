//! The reservation scripts' side of the hold after a Redis master change
//! (docs/reliability.md §4): a bucket whose two data-loss stamps differ
//! (`check_stamp` replicated, `check_stamp_local` not: another master than
//! the watch last checked the bucket on) is answered `paused
//! master_changed` by the one-unit script and by the units script, with
//! nothing written; equal stamps, or none, sell as before. The stamps are
//! set by hand here, as a promoted replica holds them.

use crate::support::gateway as gateway_support;

use gateway_support::{open_sale, open_units_sale, snapshot};
use redis::Commands;
use seckill_common::data_loss::{LOCAL_STAMP_FIELD, STAMP_FIELD};
use seckill_common::ids::keyed_reservation_id;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{reserve, ReserveOutcome};
use seckill_common::reserve_units::reserve_units;
use seckill_tests::RedisServer;

fn stamps(redis: &RedisServer, sale: u64, stamp: &str, local: Option<&str>) {
    let meta = SaleKeys::new(sale).meta();
    let mut con = redis.con();
    let _: () = con.hset(&meta, STAMP_FIELD, stamp).unwrap();
    let _: () = match local {
        Some(l) => con.hset(&meta, LOCAL_STAMP_FIELD, l).unwrap(),
        None => con.hdel(&meta, LOCAL_STAMP_FIELD).unwrap(),
    };
}

#[test]
fn a_bucket_whose_stamps_differ_takes_nothing_until_they_match() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 10);
    open_units_sale(&redis, 2, 10, 4, 2);
    let held = ReserveOutcome::Paused("master_changed".into());
    for (stamp, local) in [("7", None), ("7", Some("5"))] {
        stamps(&redis, 1, stamp, local);
        stamps(&redis, 2, stamp, local);
        let before = (snapshot(&redis, 1), snapshot(&redis, 2));
        assert_eq!(reserve(&mut redis.con(), 1, "alice").unwrap(), held);
        let rid = keyed_reservation_id(2, "bob", "k");
        let units = reserve_units(&mut redis.con(), 2, "bob", &rid, 2).unwrap();
        assert_eq!(units.outcome, held);
        assert_eq!((snapshot(&redis, 1), snapshot(&redis, 2)), before);
    }
    // Checked on this server: both stamps equal; the sales sell.
    stamps(&redis, 1, "8", Some("8"));
    stamps(&redis, 2, "8", Some("8"));
    assert!(matches!(
        reserve(&mut redis.con(), 1, "alice").unwrap(),
        ReserveOutcome::Reserved(_)
    ));
    let rid = keyed_reservation_id(2, "bob", "k");
    let units = reserve_units(&mut redis.con(), 2, "bob", &rid, 2).unwrap();
    assert!(
        matches!(units.outcome, ReserveOutcome::Reserved(_)),
        "{units:?}"
    );
}
