//! Specifies the bound on what the gateway remembers of buyers
//! (docs/reliability.md §1): nothing for a sale still selling (RSS stays flat however
//! many units it sells), at most `SECKILL_GATEWAY_BUYERS_MAX` buyers over
//! all sold-out sales (the rest answered by one `HGET`, still 409 for a
//! winner), and a sale's buyers freed once it has ended.

use crate::support::gateway as gateway_support;

use gateway_support::{get, load_sale, Client, Gateway};
use seckill_tests::{wait_until, RedisServer};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn metric(port: u16, name: &str) -> f64 {
    get(port, "/metrics")
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn sold_out_buyers_are_bounded_answered_409_and_freed_when_the_sales_end() {
    let redis = RedisServer::start();
    // 50 sales of 20 units, open for a minute (ended by hand below).
    for id in 1..=50 {
        load_sale(&redis, id, 20, -1000, 60_000);
    }
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYERS_MAX", "500")]);
    let mut c = Client::connect(g.port);
    let mut rids = Vec::new();
    for id in 1..=50u64 {
        for u in 0..20 {
            let r = c.buy(id, &format!("s{id}-u{u}"));
            assert_eq!(r.status, 202);
            rids.push((
                id,
                format!("s{id}-u{u}"),
                r.json()["reservation_id"].clone(),
            ));
        }
        assert_eq!(c.buy(id, "late").status, 410);
    }
    // Half the sales fit in 500 buyers; every winner still gets 409.
    wait_until(Duration::from_secs(5), "the buyers loaded", || {
        metric(g.port, "seckill_gateway_buyers_remembered") == 500.0
    });
    for (id, user, rid) in &rids {
        let r = c.buy(*id, user);
        assert_eq!(r.status, 409, "{user}");
        assert_eq!(&r.json()["reservation_id"], rid, "{user}");
    }
    assert_eq!(metric(g.port, "seckill_gateway_buyers_remembered"), 500.0);
    // Each of the 1,000 retries was answered from the buyers in memory, by
    // one HGET of its buyer (a sale that did not fit), or by the script
    // (the sale's sold-out answer was due for its recheck).
    let outcome = |o: &str| {
        metric(
            g.port,
            &format!("seckill_gateway_purchases_total{{outcome=\"{o}\"}}"),
        )
    };
    let (memory, read_one, script) = (
        outcome("already_purchased_from_memory"),
        outcome("already_purchased_after_buyer_read"),
        outcome("already_purchased"),
    );
    assert_eq!(
        memory + read_one + script,
        1000.0,
        "{memory} {read_one} {script}"
    );
    assert!(
        memory > 0.0 && read_one > 0.0,
        "{memory} {read_one} {script}"
    );
    // Every 410 is one of the three `sold_out` outcomes, however decided:
    // the 50 late buyers.
    let sold_out = outcome("sold_out")
        + outcome("sold_out_from_memory")
        + outcome("sold_out_after_buyer_read");
    assert_eq!(sold_out, 50.0);
    // The sales end (their window moved to the past in Redis): the next
    // recheck hears `ended` and frees each sale's buyers.
    let past = seckill_common::now_ms() - 1;
    for id in 1..=50u64 {
        let _: () = redis::cmd("HSET")
            .arg(seckill_common::keys::SaleKeys::new(id).meta())
            .arg("ends_at_ms")
            .arg(past)
            .query(&mut redis.con())
            .unwrap();
    }
    wait_until(Duration::from_secs(10), "the buyers freed", || {
        for id in 1..=50u64 {
            c.buy(id, "late");
        }
        metric(g.port, "seckill_gateway_buyers_remembered") == 0.0
    });
    assert_eq!(c.buy(1, "s1-u0").error(), "sale_ended");
}

#[test]
fn a_sale_that_keeps_selling_costs_no_memory_per_buyer() {
    // 16 connections buying flat out: never beside another crowd.
    let _crowd = crate::support::crowd();
    let redis = RedisServer::start();
    load_sale(&redis, 1, 100_000_000, -1000, 600_000);
    // Each buyer's token is verified once and remembered up to
    // `SECKILL_AUTH_CACHE_MAX` (its own bound, docs/IDENTITY.md): kept small
    // so that it is full before the first reading and the figure is the
    // sale's alone.
    let g = Gateway::start(&redis, &[("SECKILL_AUTH_CACHE_MAX", "1000")]);
    let stop = Arc::new(AtomicBool::new(false));
    let sold = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (stop, sold, port) = (stop.clone(), sold.clone(), g.port);
            std::thread::spawn(move || {
                let mut c = Client::connect(port);
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    assert_eq!(c.buy(1, &format!("t{t}-{i}")).status, 202);
                    sold.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                }
            })
        })
        .collect();
    // 20 s in the suite; SECKILL_TEST_SOAK_SECS=180 for the issue's
    // 3-minute run (samples every tenth of it).
    let secs: u64 = std::env::var("SECKILL_TEST_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    // Samples go on past `secs` (up to 6 times it) until 20,000 units
    // have sold after warm-up: a loaded machine sells slower, and the
    // figure needs the units, not the seconds.
    let start = Instant::now();
    let mut samples = Vec::new();
    let enough = |s: &[(u64, u64)]| s.len() > 2 && s[s.len() - 1].0 - s[1].0 > 20_000;
    while start.elapsed() < Duration::from_secs(secs)
        || (!enough(&samples) && start.elapsed() < Duration::from_secs(6 * secs))
    {
        std::thread::sleep(Duration::from_secs(secs) / 10);
        samples.push((sold.load(Ordering::SeqCst), rss_kib(g.child.id())));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "(units sold, gateway RSS KiB) every {} s: {samples:?}",
        secs / 10
    );
    // After warm-up (the first fifth), flat: under 4 MiB of growth while
    // tens of thousands more units sell (the old gateway kept ~150 bytes
    // per buyer, and never gave them back).
    let warm = samples[1].1;
    let peak = samples.iter().skip(1).map(|s| s.1).max().unwrap();
    let more = samples.last().unwrap().0 - samples[1].0;
    assert!(more > 20_000, "only {more} units sold after warm-up");
    assert!(peak < warm + 4096, "RSS grew from {warm} to {peak} KiB");
    assert_eq!(metric(g.port, "seckill_gateway_buyers_remembered"), 0.0);
}
