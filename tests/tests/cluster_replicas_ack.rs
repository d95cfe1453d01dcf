//! Specifies `SECKILL_REDIS_REPLICAS_ACK=1` (the `WAIT` mode): on a real
//! Redis Cluster every purchase is answered 202 once a replica has it; on
//! a Redis without a replica the reservation is made but answered 503
//! (the retry gets 409 with its id). Prints what the wait costs per
//! purchase (sequential purchases, with and without the mode). And a
//! sale's slot migrated to another master mid-sale: the group commit
//! follows `ASK` (with `ASKING`, `WAIT` after it) and then `MOVED`, and a
//! target that has lost the script (`SCRIPT FLUSH`) gets it again.

use crate::support::gateway as gateway_support;

use gateway_support::{buy, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::time::Instant;

const N: usize = 200;

/// Buys for `N` users `PREFIX-i`; every one 202; returns the ms taken.
fn buy_n(port: u16, sale: u64, prefix: &str) -> f64 {
    let t = Instant::now();
    for i in 0..N {
        let r = buy(port, sale, &format!("{prefix}-{i}"));
        assert_eq!(r.status, 202, "{prefix}-{i}: {r:?}");
    }
    t.elapsed().as_secs_f64() * 1000.0
}

#[test]
fn with_replicas_ack_a_cluster_answers_202_once_a_replica_has_the_reservation() {
    let cluster = RedisCluster::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &cluster, 2 * N as u64, -1000, 600_000);
    let plain = Gateway::start(&cluster, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let acked = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_REDIS_REPLICAS_ACK", "1"),
            // WAIT gets half of it: 2.5 s, so that a replica of a loaded
            // 2-core machine (load 16 seen) confirms within it; the
            // default's 250 ms made one purchase of 200 a 503 there.
            ("SECKILL_REDIS_TIMEOUT", "5s"),
        ],
    );
    let without = buy_n(plain.port, sale, "a");
    let with = buy_n(acked.port, sale, "b");
    eprintln!(
        "replicas ack: {N} sequential purchases {without:.0} ms without, {with:.0} ms with \
         WAIT 1 ({:.2} ms more per purchase, {:.2}x)",
        (with - without) / N as f64,
        with / without
    );
    let stock: i64 = cluster
        .target_con()
        .get(SaleKeys::new(sale).stock())
        .unwrap();
    assert_eq!(stock, 0);
}

#[test]
fn with_replicas_ack_and_no_replica_a_reservation_is_answered_503_then_409() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_REDIS_REPLICAS_ACK", "1"),
            ("SECKILL_REDIS_TIMEOUT", "400ms"),
        ],
    );
    let r = buy(g.port, sale, "u1");
    assert_eq!(r.status, 503, "{r:?}");
    let stock: i64 = redis.con().get(SaleKeys::new(sale).stock()).unwrap();
    assert_eq!(stock, 9, "the reservation was made on the master");
    let r = buy(g.port, sale, "u1");
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(
        redis
            .con()
            .get::<_, i64>(SaleKeys::new(sale).stock())
            .unwrap(),
        9
    );
}

fn node(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn myid(port: u16) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut node(port))
        .unwrap()
}

#[test]
fn with_replicas_ack_a_sale_whose_slot_migrates_mid_sale_sells_each_unit_once() {
    let cluster = RedisCluster::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &cluster, 10, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_REDIS_REPLICAS_ACK", "1"),
            ("SECKILL_REDIS_TIMEOUT", "5s"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
        ],
    );
    assert_eq!(buy(g.port, sale, "a0").status, 202);

    let slot = seckill_common::slot_router::slot_of(&k.stock());
    let src = cluster.master_of(&k.stock()).unwrap();
    // Another master: the master of some key not in the sale's slot.
    let dst = (0..1000)
        .filter_map(|i| cluster.master_of(&format!("k{i}")))
        .find(|&p| p != src)
        .unwrap();
    let (src_id, dst_id) = (myid(src), myid(dst));
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&src_id)
        .query(&mut node(dst))
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&dst_id)
        .query(&mut node(src))
        .unwrap();
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut node(src))
        .unwrap();
    assert!(keys.len() >= 4, "{keys:?}");
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys)
        .query(&mut node(src))
        .unwrap();
    // The target forgets the script: its first ASKING EVALSHA is NOSCRIPT.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut node(dst))
        .unwrap();

    // Mid-migration: every purchase is ASKed to the target.
    for u in ["b0", "b1", "b2"] {
        let r = buy(g.port, sale, u);
        assert_eq!(r.status, 202, "{u}: {r:?}");
    }
    assert_eq!(buy(g.port, sale, "b0").status, 409);

    // The migration ends: the gateway's map is stale (MOVED).
    for p in cluster.ports() {
        let mut c = node(p);
        let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut c).unwrap();
        if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&dst_id)
                .query(&mut c)
                .unwrap();
        }
    }
    for u in ["c0", "c1"] {
        let r = buy(g.port, sale, u);
        assert_eq!(r.status, 202, "{u}: {r:?}");
    }
    assert_eq!(buy(g.port, sale, "b1").status, 409);
    assert_eq!(buy(g.port, sale, "a0").status, 409);

    let mut d = node(dst);
    let stock: i64 = d.get(k.stock()).unwrap();
    let buyers: u64 = d.hlen(k.buyers()).unwrap();
    assert_eq!((stock, buyers), (4, 6), "6 buyers, one unit each");
}
