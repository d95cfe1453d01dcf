//! Owns what the repair tests share: the one `redis_data_loss` finding a
//! lost master leaves, `sale repair` once the workers drained, and the
//! check every repair test ends with (the buyers who hold orders are
//! answered 409 with their own reservation ids, and the sale then sells
//! out to exactly its stock, one order per buyer).

use super::gateway::Resp;
use super::worker::wait_orders;
use seckill_tests::cluster::RedisCluster;
use seckill_tests::TestDb;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

/// After `sale repair` of `sale` (`stock` units): each of `holders`
/// (`u0`, `u1`, ... as `rids` holds them: user → reservation id) buys
/// again and gets 409 with their own id; new buyers `v0`, `v1`, ... then
/// take exactly the `stock - holders` units left, 202 each until 410; MySQL
/// ends with `stock` orders of the sale, no buyer with two.
pub fn holders_409_then_sells_out_exactly(
    mut buy: impl FnMut(&str) -> Resp,
    rids: &HashMap<String, String>,
    holders: u64,
    db: &TestDb,
    (sale, stock): (u64, u64),
) {
    for i in 0..holders {
        let u = format!("u{i}");
        let r = buy(&u);
        assert_eq!(r.status, 409, "{u}: {r:?}");
        assert_eq!(r.json()["reservation_id"], rids[&u].as_str(), "{u}");
    }
    let mut sold = 0;
    for i in 0..stock {
        let r = buy(&format!("v{i}"));
        match r.status {
            202 => sold += 1,
            410 => break,
            s => panic!("v{i}: {s} {r:?}"),
        }
    }
    assert_eq!(sold, stock - holders);
    wait_orders(db, sale, stock as i64, Duration::from_secs(60));
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        stock as i64
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = {sale} \
             GROUP BY user_id HAVING COUNT(*) > 1) t"
        )),
        0
    );
}

/// `run` opens one `redis_data_loss` finding, naming the lost buckets and
/// exactly the lost orders.
pub fn assert_one_loss_finding(
    cluster: &RedisCluster,
    db: &TestDb,
    review: &Path,
    lost: &BTreeSet<u32>,
    expected_lost: &BTreeSet<String>,
) {
    let (code, out) = seckill_tests::reconciler(cluster, db, review, &["run"]);
    assert_eq!(code, 1, "{out}");
    let (_, listed) = seckill_tests::reconciler(cluster, db, review, &["findings", "--json"]);
    let findings: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let loss: Vec<&serde_json::Value> = findings
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "redis_data_loss")
        .collect();
    assert_eq!(loss.len(), 1, "{listed}");
    let behind = loss[0]["evidence"]["buckets_behind"].as_array().unwrap();
    let named: BTreeSet<u32> = behind
        .iter()
        .map(|b| b["bucket"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(&named, lost, "{listed}");
    let found: BTreeSet<String> = behind
        .iter()
        .flat_map(|b| b["lost_reservation_ids"].as_array().unwrap().iter())
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert_eq!(&found, expected_lost);
    assert!(!expected_lost.is_empty());
    assert_eq!(loss[0]["evidence"]["lost_orders"], expected_lost.len());
}

/// `sale repair` of `sale`, retried while workers still hold its messages
/// in processing lists (refused then), until it succeeds.
pub fn repair_once_drained(cluster: &RedisCluster, db: &TestDb, review: &Path, sale: u64) {
    let mut repaired = false;
    for _ in 0..20 {
        let (code, out) = seckill_tests::reconciler(
            cluster,
            db,
            review,
            &["sale", "repair", &sale.to_string(), "--by", "tester"],
        );
        if code == 0 {
            repaired = true;
            break;
        }
        assert!(out.contains("processing lists"), "{out}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(repaired);
}
