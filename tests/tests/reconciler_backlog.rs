//! Reconciliation during a queue backlog, against a real Redis, MySQL and
//! two real workers draining: `seckill-reconciler run` (grace 0) over a
//! sale with 200,000 queued messages completes with exactly the findings
//! of a quiet sale (here: the one message deleted from the middle of the
//! queue), and every command it sends is a bounded page: none holds Redis
//! for long (Redis's own SLOWLOG at 10 ms; docs/DESIGN.md).

use crate::support::reconciler as support;
use crate::support::worker as wsupport;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::ReserveOutcome;
use seckill_common::reservation::{parse_batch, reserve_script, write_calls, ReserveKeys};
use std::collections::HashSet;
use std::time::Duration;
use support::World;
use wsupport::{wait_drained, wait_orders, Opts, WorkerProc};

/// Messages queued before the workers start.
const QUEUED: usize = 200_000;
/// Buyers per reservation script call while filling the queue.
const PER_CALL: usize = 1000;
/// Redis's SLOWLOG threshold, µs: every command at or over it is logged.
const SLOW_US: u64 = 10_000;

/// Fills the sale's queue with `QUEUED` real reservations (the batch form
/// of the reservation script, `PER_CALL` buyers a call); returns their ids
/// in order.
fn fill(w: &World) -> Vec<String> {
    let mut con = w.redis.con();
    let _: String = reserve_script().prepare_invoke().load(&mut con).unwrap();
    let keys = ReserveKeys::new(w.sale);
    let mut rids = Vec::with_capacity(QUEUED);
    for c in 0..QUEUED / PER_CALL {
        let users: Vec<String> = (0..PER_CALL).map(|i| format!("bk-{c}-{i}")).collect();
        let ids: Vec<String> = (0..PER_CALL)
            .map(|_| seckill_common::ids::new_reservation_id())
            .collect();
        let buyers: Vec<(&str, &str)> = users
            .iter()
            .zip(&ids)
            .map(|(u, r)| (u.as_str(), r.as_str()))
            .collect();
        let mut out = Vec::new();
        write_calls(&mut out, &keys, &buyers);
        let reply = redis::ConnectionLike::req_packed_command(&mut con, &out).unwrap();
        for (r, rid) in parse_batch(&reply, PER_CALL).into_iter().zip(&ids) {
            match r {
                Ok(r) if matches!(r.outcome, ReserveOutcome::Reserved(_)) => {}
                other => panic!("{rid}: {other:?}"),
            }
        }
        rids.extend(ids);
    }
    rids
}

/// The addresses (`ip:port`) of the clients connected to `con`'s Redis.
fn client_addrs(con: &mut redis::Connection) -> HashSet<String> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("addr=")))
        .map(str::to_string)
        .collect()
}

/// `(command, µs, client address)` of every SLOWLOG entry.
fn slowlog(con: &mut redis::Connection) -> Vec<(String, u64, String)> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1_000_000)
        .query(con)
        .unwrap();
    entries
        .into_iter()
        .map(|e| {
            let redis::Value::Array(f) = e else {
                panic!("SLOWLOG entry {e:?}")
            };
            let us: u64 = redis::from_redis_value(f[2].clone()).unwrap();
            let args: Vec<String> = redis::from_redis_value(f[3].clone()).unwrap();
            let addr: String = redis::from_redis_value(f[4].clone()).unwrap();
            (args.join(" ").chars().take(80).collect(), us, addr)
        })
        .collect()
}

#[test]
fn a_run_during_a_backlog_holds_redis_briefly_and_finds_exactly_the_lost_message() {
    let w = World::new(QUEUED as u64);
    let rids = fill(&w);
    let k = SaleKeys::new(w.sale);
    let mut con = w.redis.con();
    let queued: usize = con.llen(k.queue()).unwrap();
    assert_eq!(queued, QUEUED);
    // One message lost from the middle of the queue: the one finding.
    let lost = &rids[QUEUED / 2];
    w.lose_message(lost);

    let opts = Opts::default();
    let workers = [
        WorkerProc::start(&w.redis, &w.db, "bk-w1", &opts),
        WorkerProc::start(&w.redis, &w.db, "bk-w2", &opts),
    ];
    wait_orders(&w.db, w.sale, 2_000, Duration::from_secs(60));
    let before_run = client_addrs(&mut con);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(SLOW_US)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut con).unwrap();
    let backlog: usize = con.llen(k.queue()).unwrap();

    let out = w.cmd("0s", &["run"]);
    let slow = slowlog(&mut con);
    let still_queued: usize = con.llen(k.queue()).unwrap();
    println!(
        "run during a backlog of {backlog} -> {still_queued} queued: exit {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    // The reconciler's connections are the ones that were not there
    // before it ran (`?:0`: a command inside a script, whose call is
    // logged under its caller's address too).
    let by_reconciler: Vec<_> = slow
        .iter()
        .filter(|(_, _, addr)| !before_run.contains(addr) && addr != "?:0")
        .collect();
    // Every one is a page of a paged read (an `HSCAN` of at most 500
    // fields, an `LRANGE` of at most 1,000 entries, an `HMGET` of at most
    // 500 fields: about a millisecond of Redis's time when it has a core;
    // on a loaded machine a page waits for one and crosses 10 ms of wall
    // time now and then), none a whole key or a script, and none near the
    // old atomic scan's 1,800 ms.
    let pages = ["HSCAN", "LRANGE", "HMGET", "SSCAN"];
    let not_a_page: Vec<_> = by_reconciler
        .iter()
        .filter(|(c, _, _)| !pages.iter().any(|p| c.to_uppercase().starts_with(p)))
        .collect();
    assert!(
        not_a_page.is_empty(),
        "reconciler commands of {SLOW_US} µs or more that are not pages: {not_a_page:?}"
    );
    let worst = by_reconciler
        .iter()
        .map(|(_, us, _)| *us)
        .max()
        .unwrap_or(0);
    println!(
        "reconciler commands of {SLOW_US} µs or more: {} (slowest {worst} µs)",
        by_reconciler.len()
    );
    assert!(worst < 10 * SLOW_US, "{by_reconciler:?}");
    assert!(still_queued > 0, "the workers drained before the run ended");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        w.finding_keys(),
        vec![(
            "flow_without_order".to_string(),
            lost.clone(),
            "open".to_string()
        )]
    );

    // The workers finish: every other reservation is an order.
    wait_drained(&w.redis, w.sale, Duration::from_secs(120));
    wait_orders(&w.db, w.sale, QUEUED as i64 - 1, Duration::from_secs(60));
    drop(workers);
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
        QUEUED as i64 - 1
    );
}
