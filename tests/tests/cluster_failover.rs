//! Specifies a master failing mid-sale on a real Redis Cluster (one-bucket
//! sale): 100 of 300 units sold, the replica of the sale's master stopped
//! (SIGSTOP, its replication link closed) while 50 more are sold and
//! ordered, then the master killed
//! with SIGKILL and the replica let go. The replica takes over without the
//! last 50 reservations; meanwhile the gateway answers 503 and never
//! anything else; it recovers without a restart; the workers' data-loss
//! watch pauses the sale (the replica is behind MySQL's mark); the
//! reconciler reports it as one `redis_data_loss` finding; `sale repair`
//! rebuilds it from MySQL; every user holding an order gets 409 with their
//! own reservation id, and the sale sells out to exactly 300 orders, no
//! user with two.

use crate::support::after_repair::holders_409_then_sells_out_exactly;
use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{buy, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_sale, TempDir, TestDb};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use worker_support::{wait_orders, Opts, WorkerProc};

const STOCK: u64 = 300;

fn buy_all(port: u16, sale: u64, users: impl Iterator<Item = String>) -> HashMap<String, String> {
    users
        .map(|u| {
            let r = buy(port, sale, &u);
            assert_eq!(r.status, 202, "{u}: {r:?}");
            let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
            (u, rid)
        })
        .collect()
}

#[test]
fn a_killed_master_of_the_sale_fails_over_and_every_lost_reservation_is_found_and_repaired() {
    let mut cluster = RedisCluster::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let review = dir.path().join("review.sqlite3");
    let sale = create_sale(&db, &cluster, STOCK, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let master = cluster.master_of(&k.stock()).unwrap();
    let replica = cluster.replica_of(&k.stock()).unwrap();
    // The lost buyers retry on purpose: no per-buyer limit.
    let g = Gateway::start(&cluster, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let _w1 = WorkerProc::start(&cluster, &db, "w1", &Opts::default());
    let _w2 = WorkerProc::start(&cluster, &db, "w2", &Opts::default());
    let mut rids = buy_all(g.port, sale, (0..100).map(|i| format!("u{i}")));
    wait_orders(&db, sale, 100, Duration::from_secs(30));

    // The replica misses the next 50: acknowledged, ordered, then lost.
    let _m = cluster.cut_off_replica(master, replica);
    rids.extend(buy_all(g.port, sale, (100..150).map(|i| format!("u{i}"))));
    wait_orders(&db, sale, 150, Duration::from_secs(30));
    seckill_tests::wait_until(Duration::from_secs(10), "the watch to see 150", || {
        db.count(&format!(
            "SELECT seq_high FROM sale_redis_state WHERE sale_id = {sale}"
        )) == 150
    });
    cluster.kill(master);
    cluster.signal(replica, "CONT");
    let killed = Instant::now();

    // Until the replica serves the slot (and a while after, while the
    // watch notices): 503 or the sale's 202/409 — never another answer.
    let mut answers: HashMap<u16, usize> = HashMap::new();
    let mut slipped = Vec::new();
    let mut paused = false;
    'buy: while killed.elapsed() < Duration::from_secs(60) {
        for i in 100..150 {
            let u = format!("u{i}");
            let r = buy(g.port, sale, &u);
            *answers.entry(r.status).or_default() += 1;
            match (r.status, r.error().as_str()) {
                (202, _) => slipped.push(u),
                (503, "sale_paused") => {
                    paused = true;
                    break 'buy;
                }
                (409 | 503, _) => {}
                other => panic!("{u}: {other:?}"),
            }
        }
    }
    assert!(paused, "the sale was never paused: {answers:?}");
    assert_eq!(cluster.master_of(&k.stock()), Some(replica));
    eprintln!(
        "failover: paused {:?} after the kill; answers {answers:?}; {} slipped through",
        killed.elapsed(),
        slipped.len()
    );
    assert!(answers.get(&503).copied().unwrap_or(0) >= 1, "{answers:?}");

    // The reconciler reports the loss; the repair rebuilds from MySQL.
    let (code, out) = seckill_tests::reconciler(&cluster, &db, &review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, listed) = seckill_tests::reconciler(&cluster, &db, &review, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let kinds: Vec<&str> = findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"redis_data_loss"), "{listed}");
    let (code, out) = seckill_tests::reconciler(
        &cluster,
        &db,
        &review,
        &["sale", "repair", &sale.to_string(), "--by", "tester"],
    );
    assert_eq!(code, 0, "{out}");

    // Every user holding an order: 409 with their own reservation id; the
    // gateway took purchases again without a restart: the sale sells out
    // to exactly its stock.
    holders_409_then_sells_out_exactly(|u| buy(g.port, sale, u), &rids, 150, &db, (sale, STOCK));
    assert_eq!(
        db.count(&format!(
            "SELECT available_stock FROM sales WHERE id = {sale}"
        )),
        0
    );
    let stock: i64 = cluster.target_con().get(k.stock()).unwrap();
    assert_eq!(stock, 0);
}
