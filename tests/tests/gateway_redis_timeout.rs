//! Specifies that a purchase whose Redis call timed out never buys twice,
//! with `SECKILL_REDIS_TIMEOUT=300ms` and the purchase link warmed up first
//! (so its connection "had already been in use", the case in which
//! `gateway/src/redis/link.rs` runs a failed call once more on a fresh connection). Two
//! ways Redis stops answering for 1 s:
//!
//! - `CLIENT PAUSE 1000 WRITE`: the call waits in Redis unexecuted, the
//!   gateway gives up, and Redis drops a closed client's pending commands;
//! - SIGSTOP of the test's private `redis-server`: the call is in Redis's
//!   socket when the gateway gives up, and runs when Redis resumes: the
//!   unit is taken although the buyer was told 503;
//! - a script busy for 500 ms (a slow command of someone else): the call
//!   runs when Redis is free again, and so can the gateway's second sending
//!   of it on a fresh connection; the script finds the buyer's own
//!   reservation id and takes nothing.
//!
//! Either way the buyer gets 202 or 503 (never 409), at most one unit is
//! taken, every unit taken has its flow record and queued message, and the
//! buyer's next purchase is 409 with the reservation id Redis holds. Run
//! with group commit (one Redis thread) and without (one shared link).
//!
//! And a stalled Redis seen from every route: 503 `unavailable` on each
//! one that needs Redis, `/healthz` 200, and the gateway serving again
//! once Redis resumes.

use crate::support::gateway as gateway_support;

use gateway_support::{buy, counts, get, open_sale, signal, Gateway};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_tests::RedisServer;
use std::time::{Duration, Instant};

/// How long Redis stops answering, in ms.
const FREEZE_MS: u64 = 1000;

/// How Redis stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Freeze {
    /// `CLIENT PAUSE 1000 WRITE`.
    ClientPause,
    /// SIGSTOP of `redis-server`, SIGCONT 1 s later.
    Sigstop,
    /// A Lua script spinning for [`BUSY_MS`] on another connection.
    Busy,
}

/// How long the busy script spins, in ms.
const BUSY_MS: u64 = 500;

/// Spins for ARGV[1] ms by Redis's clock (Redis serves nothing else).
const SPIN_LUA: &str = "local function now() local t = redis.call('TIME') \
    return t[1] * 1000 + math.floor(t[2] / 1000) end \
    local stop = now() + tonumber(ARGV[1]) while now() < stop do end return 1";

/// Executed calls of `cmdstat_<name>` in `INFO commandstats` (0: never).
fn command_calls(redis: &RedisServer, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.con())
        .unwrap();
    let prefix = format!("cmdstat_{name}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn a_timed_out_purchase_takes_at_most_one_unit(redis_threads: &str, freeze: Freeze) {
    let redis = RedisServer::start();
    let sale = 1;
    open_sale(&redis, sale, 5);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
            ("SECKILL_GATEWAY_REDIS_THREADS", redis_threads),
            ("SECKILL_GATEWAY_THREADS", "1"),
        ],
    );
    // Warm-up: the one link that carries purchases is now connected and used.
    assert_eq!(buy(g.port, sale, "u0").status, 202);
    let ran_before = command_calls(&redis, "evalsha");

    let frozen_at = Instant::now();
    let resume = match freeze {
        Freeze::ClientPause => {
            let _: () = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(FREEZE_MS)
                .arg("WRITE")
                .query(&mut redis.con())
                .unwrap();
            None
        }
        Freeze::Sigstop => {
            let pid = redis.pid().expect("redis runs");
            signal(pid, "STOP");
            Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(FREEZE_MS));
                signal(pid, "CONT");
            }))
        }
        Freeze::Busy => {
            let mut con = redis.con();
            let t = std::thread::spawn(move || {
                let _: i64 = redis::cmd("EVAL")
                    .arg(SPIN_LUA)
                    .arg(0)
                    .arg(BUSY_MS)
                    .query(&mut con)
                    .unwrap();
            });
            // Let the spin start before the purchase is sent.
            std::thread::sleep(Duration::from_millis(50));
            Some(t)
        }
    };
    let first = buy(g.port, sale, "u1");
    let answered_after = frozen_at.elapsed();
    if let Some(t) = resume {
        t.join().unwrap();
    }
    assert!(
        first.status == 202 || first.status == 503,
        "u1 while Redis is frozen: {first:?}"
    );

    // Past the freeze, and past any call still queued behind it.
    std::thread::sleep(Duration::from_millis(FREEZE_MS + 500).saturating_sub(frozen_at.elapsed()));
    let (stock, flow, queued) = counts(&redis, sale);
    let taken = 5 - stock;
    let u1_rid: Option<String> = redis
        .con()
        .hget(SaleKeys::new(sale).buyers(), "u1")
        .unwrap();
    let ran = command_calls(&redis, "evalsha") - ran_before;
    eprintln!(
        "{freeze:?}, redis threads {redis_threads}: u1 answered {} after {answered_after:?}; \
         units taken {taken}; reservation scripts run for u1: {ran}",
        first.status
    );
    // u0's unit, and u1's at most once.
    assert!(taken == 1 || taken == 2, "units taken: {taken}");
    assert_eq!(
        u1_rid.is_some(),
        taken == 2,
        "u1 holds a unit iff one was taken"
    );
    assert_eq!((flow as i64, queued as i64), (taken, taken));
    if first.status == 202 {
        assert_eq!(taken, 2);
        assert_eq!(first.json()["reservation_id"].as_str(), u1_rid.as_deref());
    }
    match freeze {
        // The call was in Redis's socket: it ran once, after the 503.
        Freeze::Sigstop => assert_eq!((first.status, taken, ran), (503, 2, 1)),
        // It ran, and perhaps its second sending too, which took nothing.
        Freeze::Busy => assert!(taken == 2 && (ran == 1 || ran == 2), "{taken} {ran}"),
        Freeze::ClientPause => {}
    }

    let next = buy(g.port, sale, "u1");
    match &u1_rid {
        Some(rid) => {
            assert_eq!(next.status, 409, "{next:?}");
            assert_eq!(next.error(), "already_purchased");
            assert_eq!(next.json()["reservation_id"].as_str(), Some(rid.as_str()));
        }
        None => assert_eq!(next.status, 202, "{next:?}"),
    }
    let (stock, flow, _) = counts(&redis, sale);
    assert_eq!((stock, flow), (3, 2), "u0 and u1, one unit each");
}

#[test]
fn a_pipelined_purchase_timed_out_by_client_pause_never_buys_twice() {
    a_timed_out_purchase_takes_at_most_one_unit("1", Freeze::ClientPause);
}

#[test]
fn a_single_purchase_timed_out_by_client_pause_never_buys_twice() {
    a_timed_out_purchase_takes_at_most_one_unit("0", Freeze::ClientPause);
}

#[test]
fn a_pipelined_purchase_run_after_its_timeout_is_409_with_its_id_next_time() {
    a_timed_out_purchase_takes_at_most_one_unit("1", Freeze::Sigstop);
}

#[test]
fn a_single_purchase_run_after_its_timeout_is_409_with_its_id_next_time() {
    a_timed_out_purchase_takes_at_most_one_unit("0", Freeze::Sigstop);
}

#[test]
fn a_pipelined_purchase_sent_twice_to_a_busy_redis_takes_one_unit() {
    a_timed_out_purchase_takes_at_most_one_unit("1", Freeze::Busy);
}

#[test]
fn a_single_purchase_sent_twice_to_a_busy_redis_takes_one_unit() {
    a_timed_out_purchase_takes_at_most_one_unit("0", Freeze::Busy);
}

/// docs/DESIGN.md "Redis down", for a Redis that stalls (SIGSTOP, held
/// until the answers are in, so no freeze length is assumed): every route
/// that needs Redis answers 503 `unavailable` with `Retry-After: 1` once its
/// bound (`SECKILL_REDIS_TIMEOUT`, 300 ms here) has passed — a purchase, a
/// sale read, a status read, `/readyz` — while `/healthz` stays 200; after
/// SIGCONT the same gateway serves again: `/readyz` 200, the sale with the
/// stalled purchase's unit taken (its script was in Redis's socket), and
/// that buyer's retry 409 with the reservation id Redis holds.
#[test]
fn a_stalled_redis_gives_503_on_every_redis_route_and_the_gateway_serves_after() {
    let redis = RedisServer::start();
    let sale = 1;
    open_sale(&redis, sale, 5);
    let g = Gateway::start(
        &redis,
        &[
            ("SECKILL_REDIS_TIMEOUT", "300ms"),
            ("SECKILL_GATEWAY_REDIS_THREADS", "1"),
        ],
    );
    assert_eq!(buy(g.port, sale, "u0").status, 202);
    let pid = redis.pid().expect("redis runs");
    signal(pid, "STOP");
    let answers = [
        ("purchase", buy(g.port, sale, "u1")),
        ("sale", get(g.port, "/v1/sales/1")),
        ("status", get(g.port, "/v1/sales/1/purchases/u0")),
        ("readyz", get(g.port, "/readyz")),
    ];
    let healthz = get(g.port, "/healthz");
    signal(pid, "CONT");
    for (what, r) in &answers {
        assert_eq!(
            (r.status, r.error(), r.header("Retry-After")),
            (503, "unavailable".into(), Some("1")),
            "{what} while Redis is stalled: {r:?}"
        );
    }
    assert_eq!(healthz.status, 200);

    seckill_tests::wait_until(Duration::from_secs(20), "/readyz to answer 200", || {
        get(g.port, "/readyz").status == 200
    });
    let s = get(g.port, "/v1/sales/1");
    assert_eq!(
        (s.status, s.json()["stock_remaining"].as_i64()),
        (200, Some(3))
    );
    let u1_rid: Option<String> = redis
        .con()
        .hget(SaleKeys::new(sale).buyers(), "u1")
        .unwrap();
    let again = buy(g.port, sale, "u1");
    assert_eq!(
        (again.status, again.error()),
        (409, "already_purchased".into())
    );
    assert_eq!(again.json()["reservation_id"].as_str(), u1_rid.as_deref());
    assert!(u1_rid.is_some());
    assert_eq!(buy(g.port, sale, "u2").status, 202);
    assert_eq!(counts(&redis, sale), (2, 3, 3));
}
