//! Specifies how a stalled cluster master held in quarantine
//! (`common/src/quarantine.rs`) comes back, and what holding it costs the
//! gateway's other calls: on a real Redis Cluster whose replicas never
//! take over (`cluster-replica-no-failover yes`, so the stopped master
//! keeps its slots), a sale split over 3 buckets on at least two masters,
//! one master stopped with SIGSTOP (it accepts and never answers).

use crate::support::gateway as gateway_support;

use gateway_support::{get, Client, Gateway};
use redis::Commands;
use seckill_common::buckets::{home_bucket, share};
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::{create_split_sale, TestDb};
use std::time::{Duration, Instant};

const BUCKETS: u32 = 3;
const STOCK: u64 = 3_000;

fn users_of(prefix: &str, buckets: &[u32], n: usize) -> Vec<String> {
    seckill_tests::users_in(prefix, buckets, n, BUCKETS)
}

/// A sale whose buckets span two masters, the master port of each bucket,
/// and the buckets of one master that is not bucket 0's (the gateway reads
/// the sale's bucket count from bucket 0): `(sale, stalled port, its
/// buckets)`.
fn sale_and_victim(db: &TestDb, cluster: &RedisCluster) -> (u64, u16, Vec<u32>) {
    let (sale, masters) = seckill_tests::split_sale_over_masters(db, cluster, STOCK, BUCKETS);
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

/// Without group commit (`SECKILL_GATEWAY_REDIS_THREADS=0`: each purchase
/// one round trip on a shared link), as with it
/// (`cluster_master_down::a_stalled_master_holds_back_only_the_purchases_of_its_buckets`):
/// while a master is stopped, every buyer of the other masters' buckets
/// gets 202.
#[test]
fn without_group_commit_a_stalled_master_holds_back_only_its_buckets() {
    let cluster = cluster();
    let db = TestDb::create();
    let (sale, stalled, buckets) = sale_and_victim(&db, &cluster);
    let live_buckets: Vec<u32> = (0..BUCKETS).filter(|b| !buckets.contains(b)).collect();
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "0"),
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
        ],
    );
    const EACH: usize = 30;
    let stalled_users = users_of("stalled", &buckets, EACH);
    let live_users = users_of("live", &live_buckets, EACH);
    // Warm-up: the links are connected.
    assert_eq!(Client::connect(g.port).buy(sale, "warm-0").status, 202);
    let buy_all = |users: &[String]| -> Vec<u16> {
        gateway_support::buy_all(g.port, sale, users)
            .into_iter()
            .map(|(status, _)| status)
            .collect()
    };
    cluster.signal(stalled, "STOP");
    let (stalled_answers, live_answers) = std::thread::scope(|s| {
        let first = s.spawn(|| buy_all(&stalled_users));
        std::thread::sleep(Duration::from_millis(150));
        let live = buy_all(&live_users);
        (first.join().expect("the stalled buyers"), live)
    });
    cluster.signal(stalled, "CONT");
    assert_eq!(
        live_answers,
        vec![202; EACH],
        "the live buckets' buyers (the stalled bucket's: {stalled_answers:?})"
    );
    // Exactly their 202s sold (and the warm-up buyer).
    let mut con = cluster.target_con();
    for &b in &live_buckets {
        let sold = live_users
            .iter()
            .chain(std::iter::once(&"warm-0".to_string()))
            .filter(|u| home_bucket(u, BUCKETS) == b)
            .count() as u64;
        let stock: i64 = con.get(SaleKeys::bucket(sale, b).stock()).unwrap();
        assert_eq!(
            stock,
            (share(STOCK, BUCKETS, b) - sold) as i64,
            "bucket {b}"
        );
    }
}

/// A master killed and started again on its port (its replica never takes
/// over) sells again within 2 s of saying `cluster_state:ok`, and its bucket holds
/// exactly its share less the 202s.
#[test]
fn a_master_killed_and_restarted_sells_again_at_once() {
    let mut cluster = cluster();
    let db = TestDb::create();
    let (sale, victim, buckets) = sale_and_victim(&db, &cluster);
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
        ],
    );
    let users = users_of("restart", &buckets, 400);
    let mut next = users.iter();
    let mut c = Client::connect(g.port);
    let mut sold = vec![next.next().unwrap().clone()];
    assert_eq!(c.buy(sale, &sold[0]).status, 202, "before");

    cluster.kill(victim);
    for _ in 0..5 {
        let r = c.buy(sale, next.next().unwrap());
        assert_eq!((r.status, r.error()), (503, "unavailable".to_string()));
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster.restart(victim);
    let node = redis::Client::open(format!("redis://127.0.0.1:{victim}/")).unwrap();
    // It serves once it says its cluster is whole again (a restarted
    // master waits a moment before that, answering CLUSTERDOWN meanwhile).
    seckill_tests::wait_until(Duration::from_secs(20), "the node to serve", || {
        node.get_connection_with_timeout(Duration::from_millis(200))
            .and_then(|mut k| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut k))
            .is_ok_and(|i| i.lines().any(|l| l.trim() == "cluster_state:ok"))
    });
    let back = Instant::now();
    let mut answers = Vec::new();
    loop {
        let u = next.next().expect("enough buyers");
        let r = c.buy(sale, u);
        answers.push(r.status);
        match r.status {
            202 => {
                sold.push(u.clone());
                break;
            }
            503 => {}
            s => panic!("{s} {:?}", r.body),
        }
        assert!(back.elapsed() < Duration::from_secs(10), "{answers:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = back.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "first 202 {took:?} after: {answers:?}"
    );
    // The 503s took nothing.
    let mut con = cluster.target_con();
    for &b in &buckets {
        let n = sold.iter().filter(|u| home_bucket(u, BUCKETS) == b).count() as u64;
        let stock: i64 = con.get(SaleKeys::bucket(sale, b).stock()).unwrap();
        assert_eq!(stock, (share(STOCK, BUCKETS, b) - n) as i64, "bucket {b}");
    }
}

/// While a master is held, `/readyz` is 503 (a master would not take its
/// purchases) on a link that stays connected: a load balancer polling it
/// does not make the gateway reconnect per poll. Before, each poll dropped
/// its link, reconnected and failed again: 10 polls, 10 reconnects.
#[test]
fn readyz_polls_of_a_held_master_do_not_reconnect_the_gateway() {
    let cluster = cluster();
    let db = TestDb::create();
    let (sale, stalled, buckets) = sale_and_victim(&db, &cluster);
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
            ("SECKILL_GATEWAY_THREADS", "1"),
        ],
    );
    let users = users_of("ready", &buckets, 2);
    let mut c = Client::connect(g.port);
    assert_eq!(c.buy(sale, &users[0]).status, 202);
    assert_eq!(c.send("GET", "/readyz", None).status, 200);

    cluster.signal(stalled, "STOP");
    // The first try waits one timeout and puts the master in quarantine.
    assert_eq!(c.buy(sale, &users[1]).status, 503);
    let before = connects(g.port);
    let statuses: Vec<u16> = (0..10)
        .map(|_| c.send("GET", "/readyz", None).status)
        .collect();
    let after = connects(g.port);
    cluster.signal(stalled, "CONT");
    assert_eq!(statuses, vec![503; 10]);
    assert_eq!(after - before, 0, "reconnects for 10 polls of /readyz");
}

/// While bucket 0's master is stopped, the buyers of the sale's buckets on
/// the other masters get 202, as the buyers of any other stopped master's
/// buckets do. Not so (not fixed): every purchase of a split sale first
/// needs its bucket count, read again from bucket 0's meta once a second
/// (`home::RECOUNT_AFTER`), so the whole sale answers 503.
#[test]
#[ignore = "finding, not fixed: a stopped bucket 0 master stops the whole split sale"]
fn a_stalled_bucket_0_master_holds_back_only_its_buckets() {
    let cluster = cluster();
    let db = TestDb::create();
    let (sale, masters) = (0..20)
        .find_map(|_| {
            let sale = create_split_sale(&db, &cluster, STOCK, -1000, 600_000, BUCKETS);
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
    let stalled = masters[0];
    let live: Vec<u32> = (0..BUCKETS)
        .filter(|&b| masters[b as usize] != stalled)
        .collect();
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
        ],
    );
    let users = users_of("b0", &live, 11);
    let mut c = Client::connect(g.port);
    assert_eq!(c.buy(sale, &users[0]).status, 202, "before");
    cluster.signal(stalled, "STOP");
    std::thread::sleep(Duration::from_millis(1200));
    let statuses: Vec<u16> = users[1..].iter().map(|u| c.buy(sale, u).status).collect();
    cluster.signal(stalled, "CONT");
    assert_eq!(statuses, vec![202; 10]);
}
