//! Specifies that a master going down costs only the purchases of the
//! buckets it serves (gateways answer 503 for that bucket meanwhile): on a real Redis Cluster, a sale split over 3 buckets, the
//! master of one bucket killed with SIGKILL, and a crowd of that bucket's
//! buyers and of the other buckets' buyers buying at once through one
//! gateway whose one Redis thread puts both kinds in the same group
//! commit. Every buyer of a bucket on a live master gets 202; the dead
//! bucket's buyers get 503 until its replica takes over, then 202; the
//! gateway recovers without a restart and the live buckets' stock is
//! exactly their share less their 202s.

use crate::support::gateway as gateway_support;

use gateway_support::{Client, Gateway};
use redis::Commands;
use seckill_common::buckets::{home_bucket, share};
use seckill_common::keys::SaleKeys;
use seckill_tests::cluster::{RedisCluster, TestRedis};
use seckill_tests::TestDb;
use std::collections::HashMap;
use std::time::Duration;

const BUCKETS: u32 = 3;
const STOCK: u64 = 3_000;
/// Buyers per side (the dead bucket's, the live buckets').
const PER_SIDE: usize = 300;
/// Client threads buying at once.
const THREADS: usize = 8;

fn users_of(prefix: &str, buckets: &[u32], n: usize) -> Vec<String> {
    seckill_tests::users_in(prefix, buckets, n, BUCKETS)
}

fn split_over_masters(db: &TestDb, cluster: &RedisCluster) -> (u64, Vec<u16>) {
    seckill_tests::split_sale_over_masters(db, cluster, STOCK, BUCKETS)
}

/// Checks the answers of one side's buyers: the live side's `live`, all
/// `n` of them 202; the other side's `down`, each 503 `unavailable` or
/// 202, at least one 503 (its master was out while they bought).
fn assert_sides(
    live: &HashMap<(u16, String), usize>,
    down: &HashMap<(u16, String), usize>,
    n: usize,
) {
    assert_eq!(
        live,
        &HashMap::from([((202, String::new()), n)]),
        "the live buckets' buyers (the other bucket's: {down:?})"
    );
    let count = |k: (u16, &str)| down.get(&(k.0, k.1.to_string())).copied().unwrap_or(0);
    let (d503, d202) = (count((503, "unavailable")), count((202, "")));
    assert_eq!(d503 + d202, n, "{down:?}");
    assert!(d503 >= 1, "the master was out while they bought: {down:?}");
}

/// The live buckets lost nothing and sold exactly their 202s: each bucket
/// of `buckets` holds its share less the buyers of `sold` whose home it is.
fn assert_sold_exactly(cluster: &RedisCluster, sale: u64, buckets: &[u32], sold: &[&String]) {
    let mut con = cluster.target_con();
    let mut sold_by_bucket: HashMap<u32, u64> = HashMap::new();
    for u in sold {
        *sold_by_bucket.entry(home_bucket(u, BUCKETS)).or_default() += 1;
    }
    for &b in buckets {
        let stock: i64 = con.get(SaleKeys::bucket(sale, b).stock()).unwrap();
        let sold = sold_by_bucket.get(&b).copied().unwrap_or(0);
        assert_eq!(
            stock,
            (share(STOCK, BUCKETS, b) - sold) as i64,
            "bucket {b}"
        );
    }
}

#[test]
fn a_dead_master_fails_only_the_purchases_of_its_buckets() {
    // As OPERATIONS.md advises for split sales: the other masters keep
    // serving while one slot range has no master.
    let mut cluster = RedisCluster::start_with(&[("cluster-require-full-coverage", "no")]);
    let db = TestDb::create();
    let (sale, masters) = split_over_masters(&db, &cluster);
    let dead = masters[1];
    let dead_buckets: Vec<u32> = (0..BUCKETS)
        .filter(|&b| masters[b as usize] == dead)
        .collect();
    let live_buckets: Vec<u32> = (0..BUCKETS)
        .filter(|&b| masters[b as usize] != dead)
        .collect();
    let replica = cluster
        .replica_of(&SaleKeys::bucket(sale, 1).stock())
        .unwrap();
    // One Redis thread: the two kinds of buyer share its pipelines.
    let g = Gateway::start(
        &cluster,
        &[
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
        ],
    );
    let dead_users = users_of("down", &dead_buckets, PER_SIDE);
    let live_users = users_of("up", &live_buckets, PER_SIDE);
    // Interleaved, so that every pipeline holds both kinds.
    let crowd: Vec<(bool, String)> = dead_users
        .iter()
        .zip(&live_users)
        .flat_map(|(d, l)| [(false, d.clone()), (true, l.clone())])
        .collect();

    cluster.kill(dead);
    let per_thread = crowd.len().div_ceil(THREADS);
    let answers: Vec<(bool, String, u16, String)> = std::thread::scope(|s| {
        let port = g.port;
        let handles: Vec<_> = crowd
            .chunks(per_thread)
            .map(|part| {
                s.spawn(move || {
                    let mut c = Client::connect(port);
                    part.iter()
                        .map(|(live, u)| {
                            let r = c.buy(sale, u);
                            (*live, u.clone(), r.status, r.error())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a client thread"))
            .collect()
    });

    let mut live: HashMap<(u16, String), usize> = HashMap::new();
    let mut down: HashMap<(u16, String), usize> = HashMap::new();
    for (is_live, _, status, error) in &answers {
        let side = if *is_live { &mut live } else { &mut down };
        *side.entry((*status, error.clone())).or_default() += 1;
    }
    assert_sides(&live, &down, PER_SIDE);

    // The replica takes over; the same gateway sells that bucket again.
    cluster.wait_for("the replica to serve the dead bucket", || {
        cluster.master_of(&SaleKeys::bucket(sale, 1).stock()) == Some(replica)
    });
    let late = users_of("late", &dead_buckets, 1);
    let mut c = Client::connect(g.port);
    let mut status = 0;
    seckill_tests::wait_until(Duration::from_secs(10), "a 202 after the failover", || {
        status = c.buy(sale, &late[0]).status;
        status == 202
    });

    let sold: Vec<&String> = answers
        .iter()
        .filter(|(is_live, _, status, _)| *is_live && *status == 202)
        .map(|(_, u, _, _)| u)
        .collect();
    assert_sold_exactly(&cluster, sale, &live_buckets, &sold);
    eprintln!("dead bucket's buyers during the failover: {down:?}");
}

/// A master that stalls (SIGSTOP: it accepts and never answers, like one
/// cut off by a partition) holds back only its own buckets' purchases:
/// its buyers' pipeline costs the group commit one `SECKILL_REDIS_TIMEOUT`
/// (300 ms here), not one per purchase. 30 of its buyers buy at once, then
/// 30 buyers of the other buckets while the master is still stopped, all
/// through one Redis thread: every one of the others gets 202. Before, a
/// batch all on the stalled master failed the whole cluster connection,
/// each reconnect waited on that master again, and the reads of bucket 0
/// went through the redis crate's cluster connection, whose opening pings
/// every node: the others waited for a link until their bound (3 × 300 ms)
/// and got 503. Now the stalled master is held in quarantine for every
/// connection of the gateway (`quarantine.rs`) and the reads go through
/// the slot router (`Con::route_reads`).
#[test]
fn a_stalled_master_holds_back_only_the_purchases_of_its_buckets() {
    let cluster = RedisCluster::start_with(&[("cluster-require-full-coverage", "no")]);
    let db = TestDb::create();
    let (sale, masters) = split_over_masters(&db, &cluster);
    // Not bucket 0's master: the gateway reads the sale's bucket count from
    // bucket 0, and without it no bucket sells.
    let stalled = *masters
        .iter()
        .find(|&&m| m != masters[0])
        .expect("a master other than bucket 0's");
    eprintln!("buckets' masters {masters:?}, stalled {stalled}");
    let stalled_buckets: Vec<u32> = (0..BUCKETS)
        .filter(|&b| masters[b as usize] == stalled)
        .collect();
    let live_buckets: Vec<u32> = (0..BUCKETS)
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
    const EACH: usize = 30;
    let stalled_users = users_of("stalled", &stalled_buckets, EACH);
    let live_users = users_of("live", &live_buckets, EACH);
    let buy_all = |users: &[String]| gateway_support::buy_all(g.port, sale, users);

    cluster.signal(stalled, "STOP");
    let (stalled_answers, live_answers) = std::thread::scope(|s| {
        let first = s.spawn(|| buy_all(&stalled_users));
        // Their pipelines are out when the others arrive.
        std::thread::sleep(Duration::from_millis(150));
        let live = buy_all(&live_users);
        (first.join().expect("the stalled buyers"), live)
    });
    cluster.signal(stalled, "CONT");

    let tally = |answers: &[(u16, String)]| {
        let mut t: HashMap<(u16, String), usize> = HashMap::new();
        for a in answers {
            *t.entry(a.clone()).or_default() += 1;
        }
        t
    };
    let live = tally(&live_answers);
    let stalled_tally = tally(&stalled_answers);
    assert_sides(&live, &stalled_tally, EACH);
    assert_sold_exactly(
        &cluster,
        sale,
        &live_buckets,
        &live_users.iter().collect::<Vec<_>>(),
    );
}
