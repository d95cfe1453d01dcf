//! Specifies how a stalled cluster master held in quarantine
//! (`common/src/quarantine.rs`) comes back, and what holding it costs the
//! gateway's other calls: on a real Redis Cluster whose replicas never
//! take over (`cluster-replica-no-failover yes`, so the stopped master
//! keeps its slots), a sale split over 3 buckets on at least two masters,
//! one master stopped with SIGSTOP (it accepts and never answers).

#[path = "gateway_support.rs"]
mod gateway_support;

use gateway_support::{get, Client, Gateway};
use seckill_common::buckets::home_bucket;
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::RedisCluster;
use seckill_tests::{create_split_sale, TestDb};
use std::time::{Duration, Instant};

const BUCKETS: u32 = 3;
const STOCK: u64 = 3_000;

/// The first `n` user ids `PREFIX-i` whose home bucket is in `buckets`.
fn users_of(prefix: &str, buckets: &[u32], n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|u| buckets.contains(&home_bucket(u, BUCKETS)))
        .take(n)
        .collect()
}

/// A sale whose buckets span two masters, the master port of each bucket,
/// and the buckets of one master that is not bucket 0's (the gateway reads
/// the sale's bucket count from bucket 0): `(sale, stalled port, its
/// buckets)`.
fn sale_and_victim(db: &TestDb, cluster: &RedisCluster) -> (u64, u16, Vec<u32>) {
    let (sale, masters) = (0..20)
        .find_map(|_| {
            let sale = create_split_sale(db, cluster, STOCK, -1000, 600_000, BUCKETS);
            let masters: Vec<u16> = (0..BUCKETS)
                .map(|b| {
                    cluster
                        .master_of(&SaleKeys::bucket(sale, b).stock())
                        .unwrap()
                })
                .collect();
            (masters.iter().any(|&m| m != masters[0])).then_some((sale, masters))
        })
        .expect("a sale whose buckets span two masters");
    let victim = *masters
        .iter()
        .find(|&&m| m != masters[0])
        .expect("a master other than bucket 0's");
    let buckets = (0..BUCKETS)
        .filter(|&b| masters[b as usize] == victim)
        .collect();
    (sale, victim, buckets)
}

fn cluster() -> RedisCluster {
    RedisCluster::start_with(&[
        ("cluster-require-full-coverage", "no"),
        // The stopped master keeps its slots: it is resumed, not replaced.
        ("cluster-replica-no-failover", "yes"),
    ])
}

/// `seckill_gateway_redis_connects_total` from `/metrics`.
fn connects(port: u16) -> u64 {
    let m = get(port, "/metrics").body;
    m.lines()
        .find_map(|l| l.strip_prefix("seckill_gateway_redis_connects_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .expect("seckill_gateway_redis_connects_total in /metrics")
}

/// A master that stalled for a moment (2.5 s, with the default 1 s
/// `SECKILL_REDIS_TIMEOUT`) and was then resumed sells again within 2 s of
/// resuming.
#[test]
fn a_stalled_master_that_resumes_sells_again_within_two_seconds() {
    let cluster = cluster();
    let db = TestDb::create();
    let (sale, stalled, buckets) = sale_and_victim(&db, &cluster);
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
        ],
    );
    let users = users_of("resume", &buckets, 200);
    let mut next = users.iter();
    let mut c = Client::connect(g.port);
    assert_eq!(c.buy(sale, next.next().unwrap()).status, 202, "before");

    cluster.signal(stalled, "STOP");
    let t = Instant::now();
    let during = c.buy(sale, next.next().unwrap());
    eprintln!("503 after {:?}", t.elapsed());
    assert_eq!(
        (during.status, during.error()),
        (503, "unavailable".to_string())
    );
    // Stalled 2.5 s in all: whatever another thread of the gateway had
    // sent to it before it stopped has timed out too.
    std::thread::sleep(Duration::from_millis(1500));
    cluster.signal(stalled, "CONT");
    let resumed = Instant::now();

    let mut answers = Vec::new();
    loop {
        let r = c.buy(sale, next.next().expect("enough buyers"));
        answers.push(r.status);
        if r.status == 202 {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(10),
            "no 202 within 10 s of resuming: {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = resumed.elapsed();
    eprintln!("first 202 {took:?} after resuming: {answers:?}");
    assert!(
        took < Duration::from_secs(2),
        "the first 202 came {took:?} after the master resumed ({} answers: {answers:?})",
        answers.len()
    );
}

/// While a master is held, a status read of one of its buyers is 503 at
/// once, and the link it was read on stays connected: the gateway does not
/// reconnect (a new slot map, every master's INFO and SCRIPT LOAD) per
/// read. Before, each such read dropped its link, reconnected and failed
/// again: 20 reads, 20 reconnects.
#[test]
fn reads_of_a_held_masters_buyers_do_not_reconnect_the_gateway() {
    let cluster = cluster();
    let db = TestDb::create();
    let (sale, stalled, buckets) = sale_and_victim(&db, &cluster);
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
            // One reading link: every read below uses the same one.
            ("SECKILL_GATEWAY_THREADS", "1"),
        ],
    );
    let users = users_of("held", &buckets, 2);
    let mut c = Client::connect(g.port);
    assert_eq!(c.buy(sale, &users[0]).status, 202);
    let path = format!("/v1/sales/{sale}/purchases/{}", users[0]);
    assert_eq!(c.send("GET", &path, None).status, 200);

    cluster.signal(stalled, "STOP");
    // The first try waits one timeout and puts the master in quarantine.
    assert_eq!(c.buy(sale, &users[1]).status, 503);
    let before = connects(g.port);
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(c.send("GET", &path, None).status);
    }
    let took = started.elapsed();
    let after = connects(g.port);
    cluster.signal(stalled, "CONT");
    assert_eq!(statuses, vec![503; 20]);
    assert_eq!(
        after - before,
        0,
        "reconnects for 20 reads of a held master"
    );
    eprintln!("20 reads took {took:?}");
}
