//! Measures how long a gateway keeps selling after the Redis server's
//! eviction policy is switched live to `allkeys-lru` (docs/reliability.md
//! §3): four buyers buy in a loop, the policy is switched, and the answers
//! after the switch are counted until the gateway refuses. Printed: the
//! 202s after the switch and the last one's time. Checked exactly: once a
//! purchase is refused for the policy, no later one is accepted, and every
//! unit taken has its flow record.

use crate::support::gateway as gateway_support;

use gateway_support::{Client, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::{create_sale, RedisServer, TestDb};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BUYERS: usize = 4;

#[test]
fn a_live_switch_to_an_evicting_policy_stops_purchases_within_the_check_period() {
    let redis = RedisServer::start();
    let db = TestDb::create();
    let sale = create_sale(&db, &redis, 1_000_000, -1_000, 600_000);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let stop = Arc::new(AtomicBool::new(false));
    let switched: Arc<Mutex<Option<Instant>>> = Arc::default();
    let threads: Vec<_> = (0..BUYERS)
        .map(|t| {
            let (stop, switched, port) = (stop.clone(), switched.clone(), g.port);
            std::thread::spawn(move || {
                let mut c = Client::connect(port);
                let mut seen = Vec::new();
                for i in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let r = c.buy(sale, &format!("b{t}-{i}"));
                    let at = switched.lock().unwrap().map(|s| s.elapsed());
                    seen.push((at, r.status, r.error()));
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let mut con = redis.con();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .exec(&mut con)
        .expect("CONFIG SET");
    *switched.lock().unwrap() = Some(Instant::now());
    std::thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Release);
    let seen: Vec<Vec<_>> = threads
        .into_iter()
        .map(|t| t.join().expect("buyer"))
        .collect();
    let after: Vec<&(Option<Duration>, u16, String)> =
        seen.iter().flatten().filter(|s| s.0.is_some()).collect();
    let sold_after = after.iter().filter(|s| s.1 == 202).count();
    let last_202 = after
        .iter()
        .filter(|s| s.1 == 202)
        .filter_map(|s| s.0)
        .max();
    let first_503 = after
        .iter()
        .filter(|s| s.1 == 503)
        .filter_map(|s| s.0)
        .min();
    println!(
        "policy switched live: {sold_after} purchases answered 202 after the switch, the last \
         {last_202:?} after it; first 503 {first_503:?} after it; {} answers after it",
        after.len()
    );
    // Per buyer, in order: no 202 after its first 503.
    for s in &seen {
        let refused = s.iter().position(|a| a.1 == 503);
        if let Some(i) = refused {
            assert!(s[i..].iter().all(|a| a.1 == 503), "{:?}", &s[i..]);
            assert_eq!(s[i].2, "unavailable");
        }
    }
    assert!(first_503.is_some(), "never refused");
    let k = SaleKeys::new(sale);
    let stock: i64 = con.get(k.stock()).expect("stock");
    let flow: usize = con.hlen(k.flow()).expect("flow");
    let accepted = seen.iter().flatten().filter(|s| s.1 == 202).count();
    assert_eq!((flow, 1_000_000 - stock as usize), (accepted, accepted));
}
