//! Specifies how every binary treats a Redis server that cannot keep the
//! sale safe (docs/reliability.md §3): an eviction policy that can delete the sale's
//! keys is refused by the gateway (503, `/readyz` 503), the worker (takes
//! nothing) and the reconciler (exit 2), each naming the setting; under
//! `noeviction` a full Redis answers 503 and no purchase is half-written,
//! and every 202 ends as an order once memory is raised; a Redis that
//! refuses writes (a replica) makes `/readyz` 503; one that persists
//! nothing is flagged by a metric.

use crate::support::gateway as gateway_support;
use crate::support::worker as worker_support;

use gateway_support::{buy, get, open_sale, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, wait_until, RedisServer, TempDir, TestDb};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use worker_support::{wait_orders, Opts, WorkerProc};

const EVICTING: [&str; 7] = [
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

fn config_set(redis: &RedisServer, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut redis.con())
        .unwrap();
}

fn metric(port: u16, name: &str) -> Option<f64> {
    get(port, "/metrics").body.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

fn reconcile(redis: &RedisServer, db: &TestDb, dir: &TempDir) -> (i32, String) {
    seckill_tests::reconciler(redis, db, &dir.path().join("review.sqlite3"), &["run"])
}

#[test]
fn an_evicting_policy_is_refused_by_gateway_worker_and_reconciler() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let dir = TempDir::new();
    let sale = create_sale(&db, &redis, 5, -1000, 600_000);
    let k = SaleKeys::new(sale);
    for policy in EVICTING {
        config_set(&redis, "maxmemory-policy", policy);
        let g = Gateway::start(&redis, &[]);
        let before = gateway_support::snapshot(&redis, sale);
        let r = buy(g.port, sale, "alice");
        assert_eq!(
            (r.status, r.error()),
            (503, "unavailable".into()),
            "{policy}"
        );
        assert_eq!(get(g.port, "/readyz").status, 503, "{policy}");
        assert_eq!(gateway_support::snapshot(&redis, sale), before, "{policy}");
        assert!(metric(g.port, "seckill_gateway_redis_refused_total").unwrap() >= 1.0);
        let (code, err) = reconcile(&redis, &db, &dir);
        assert_eq!(code, 2, "{policy}: {err}");
        assert!(err.contains("maxmemory-policy"), "{policy}: {err}");
    }
    // A unit reserved behind the gateway's back: the worker must not take it.
    config_set(&redis, "maxmemory-policy", "noeviction");
    assert!(matches!(
        seckill_common::reservation::reserve(&mut redis.con(), sale, "bob").unwrap(),
        seckill_common::reservation::ReserveOutcome::Reserved(_)
    ));
    config_set(&redis, "maxmemory-policy", "allkeys-lru");
    let w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    std::thread::sleep(Duration::from_secs(2));
    let queued: usize = redis.con().llen(k.queue()).unwrap();
    assert_eq!(queued, 1);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        0
    );
    drop(w);
    // Fixed: the worker orders it, the gateway sells, the reconciler runs.
    config_set(&redis, "maxmemory-policy", "noeviction");
    let _w = WorkerProc::start(&redis, &db, "w2", &Opts::default());
    wait_orders(&db, sale, 1, Duration::from_secs(20));
    let g = Gateway::start(&redis, &[]);
    assert_eq!(buy(g.port, sale, "alice").status, 202);
    assert_eq!(get(g.port, "/readyz").status, 200);
    wait_orders(&db, sale, 2, Duration::from_secs(20));
    let (code, err) = reconcile(&redis, &db, &dir);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_full_noeviction_redis_answers_503_and_half_writes_nothing() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 20_000, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let used: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut redis.con())
        .unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // About 1 MB of room: a few thousand reservations, not 20,000.
    config_set(&redis, "maxmemory", &(used + (1 << 20)).to_string());
    let g = Gateway::start(&redis, &[]);
    let accepted = Arc::new(AtomicUsize::new(0));
    let unavailable = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (accepted, unavailable, port) = (accepted.clone(), unavailable.clone(), g.port);
            std::thread::spawn(move || {
                let mut c = gateway_support::Client::connect(port);
                for i in 0..1250 {
                    match c.buy(sale, &format!("u{t}-{i}")).status {
                        202 => accepted.fetch_add(1, Ordering::SeqCst),
                        503 => unavailable.fetch_add(1, Ordering::SeqCst),
                        s => panic!("status {s}"),
                    };
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (accepted, unavailable) = (
        accepted.load(Ordering::SeqCst),
        unavailable.load(Ordering::SeqCst),
    );
    assert_eq!(accepted + unavailable, 20_000);
    assert!(
        accepted > 0 && unavailable > 0,
        "{accepted} / {unavailable}"
    );
    assert_eq!(get(g.port, "/readyz").status, 503, "full memory: not ready");
    // Every 202 whole, nothing else.
    let mut con = redis.con();
    let stock: i64 = con.get(k.stock()).unwrap();
    let flow: usize = con.hlen(k.flow()).unwrap();
    let buyers: usize = con.hlen(k.buyers()).unwrap();
    let statuses: usize = con.hlen(k.status()).unwrap();
    let queued: usize = con.llen(k.queue()).unwrap();
    let seq = seckill_common::reservation::read_sequence(&mut con, sale).unwrap();
    assert_eq!(
        (stock, flow, buyers, statuses, queued, seq),
        (
            20_000 - accepted as i64,
            accepted,
            accepted,
            accepted,
            accepted,
            accepted as u64
        )
    );
    // Memory raised: every 202 becomes an order.
    config_set(&redis, "maxmemory", "0");
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    wait_orders(&db, sale, accepted as i64, Duration::from_secs(60));
    assert_eq!(get(g.port, "/readyz").status, 200);
}

#[test]
fn readyz_is_503_while_redis_refuses_writes_and_a_volatile_redis_is_flagged() {
    let redis = RedisServer::start();
    open_sale(&redis, 4, 5);
    let g = Gateway::start(&redis, &[]);
    assert_eq!(get(g.port, "/readyz").status, 200);
    assert_eq!(
        metric(g.port, "seckill_gateway_redis_persistence_off"),
        Some(0.0)
    );
    // A replica (of a master that is not there) refuses writes.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(seckill_tests::free_port())
        .query(&mut redis.con())
        .unwrap();
    assert_eq!(get(g.port, "/readyz").status, 503);
    let before = gateway_support::snapshot(&redis, 4);
    assert_eq!(buy(g.port, 4, "alice").status, 503);
    assert_eq!(gateway_support::snapshot(&redis, 4), before);
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut redis.con())
        .unwrap();
    wait_until(Duration::from_secs(5), "readyz 200 again", || {
        get(g.port, "/readyz").status == 200
    });
    assert_eq!(buy(g.port, 4, "alice").status, 202);
    // Persistence off: a new gateway says so in its metrics.
    config_set(&redis, "appendonly", "no");
    let g2 = Gateway::start(&redis, &[]);
    assert_eq!(get(g2.port, "/readyz").status, 200);
    assert_eq!(
        metric(g2.port, "seckill_gateway_redis_persistence_off"),
        Some(1.0)
    );
}

#[test]
fn a_policy_changed_on_a_live_redis_stops_purchases_and_workers_within_seconds() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 10, -1000, 600_000);
    let k = SaleKeys::new(sale);
    let g = Gateway::start(&redis, &[]);
    let _w = WorkerProc::start(&redis, &db, "w1", &Opts::default());
    assert_eq!(buy(g.port, sale, "before").status, 202);
    wait_orders(&db, sale, 1, Duration::from_secs(20));
    config_set(&redis, "maxmemory-policy", "allkeys-lru");
    wait_until(Duration::from_secs(5), "purchases refused", || {
        buy(g.port, sale, "during").status == 503
    });
    // Reserved behind the gateway's back once the worker's watch has seen
    // the policy (every 200 ms) and its blocking wait (200 ms here) has come back: the
    // worker must leave it queued.
    std::thread::sleep(Duration::from_secs(2));
    assert!(matches!(
        seckill_common::reservation::reserve(&mut redis.con(), sale, "sneaky").unwrap(),
        seckill_common::reservation::ReserveOutcome::Reserved(_)
    ));
    std::thread::sleep(Duration::from_secs(2));
    let queued: usize = redis.con().llen(k.queue()).unwrap();
    assert_eq!(queued, 1);
    assert_eq!(buy(g.port, sale, "during").status, 503);
    config_set(&redis, "maxmemory-policy", "noeviction");
    wait_until(Duration::from_secs(5), "purchases taken again", || {
        buy(g.port, sale, "after").status == 202
    });
    wait_orders(&db, sale, 3, Duration::from_secs(20));
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale} AND user_id IN ('before', 'sneaky', 'after')"
        )),
        3
    );
}
