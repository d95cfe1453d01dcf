//! Reconciliation during a queue backlog, against a real Redis, MySQL and
//! two real workers draining: `seckill-reconciler run` (grace 0) over a
//! sale with 200,000 queued messages completes with exactly the findings
//! of a quiet sale (here: the one message deleted from the middle of the
//! queue), and every command it sends is a bounded page: none holds Redis
//! for 10 ms (Redis's own SLOWLOG, every command logged; Redis in the
//! real-time class, so that the log times work and not the waits of a
//! loaded machine's scheduler; docs/DESIGN.md).

use crate::support::reconciler as support;
use crate::support::worker as wsupport;

use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::ReserveOutcome;
use seckill_common::reservation::{parse_batch, reserve_script, write_calls, ReserveKeys};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use support::World;
use wsupport::{wait_drained, wait_orders, Opts, WorkerProc};

/// Messages queued before the workers start.
const QUEUED: usize = 200_000;
/// Buyers per reservation script call while filling the queue.
const PER_CALL: usize = 1000;
/// The bound, µs: a reconciler command that holds Redis this long fails
/// the test.
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

/// Puts Redis's threads (`INFO`'s `process_id`) in the real-time class
/// (`chrt -f`), so that the SLOWLOG times the work of a command and not
/// the time the OS gives its core to other processes in the middle of it
/// (SLOWLOG is wall time: on 2 cores at load 30+ a 0.1 ms page preempted
/// once reads 10-20 ms). Returns why it could not (not root: then a
/// preempted page counts against the bound).
fn real_time(con: &mut redis::Connection) -> Result<(), String> {
    let info: String = redis::cmd("INFO").arg("server").query(con).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|p| p.trim().to_string())
        .ok_or("no process_id in INFO server")?;
    let out = std::process::Command::new("chrt")
        .args(["-a", "-f", "-p", "1", &pid])
        .output()
        .map_err(|e| format!("chrt: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Per command name: how many, the median, the 99th percentile and the
/// slowest, µs, of `entries`, one line each.
fn by_command(entries: &[&(String, u64, String)]) -> String {
    let mut by: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (c, us, _) in entries {
        let name = c.split(' ').next().unwrap_or("").to_uppercase();
        by.entry(name).or_default().push(*us);
    }
    let mut out = String::new();
    for (name, mut us) in by {
        us.sort_unstable();
        let at = |q: usize| us[(us.len() - 1) * q / 100];
        out += &format!(
            "  {name}: {} calls, p50 {} µs, p99 {} µs, max {} µs\n",
            us.len(),
            at(50),
            at(99),
            at(100)
        );
    }
    out
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

    // Small batches (one commit per 4 orders): the workers drain for
    // longer than the run takes, on a quiet machine and a loaded one alike.
    let opts = Opts {
        batch: 4,
        ..Opts::default()
    };
    let workers = [
        WorkerProc::start(&w.redis, &w.db, "bk-w1", &opts),
        WorkerProc::start(&w.redis, &w.db, "bk-w2", &opts),
    ];
    wait_orders(&w.db, w.sale, 2_000, Duration::from_secs(60));
    let before_run = client_addrs(&mut con);
    let priority = real_time(&mut con);
    // Every command is logged, with its time: the figures per command
    // printed below, and the bound checked on each.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .arg("slowlog-max-len")
        .arg(1_000_000)
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
    let stats = by_command(&by_reconciler);
    println!(
        "reconciler commands (Redis {}):\n{stats}",
        match &priority {
            Ok(()) => "real-time".to_string(),
            Err(e) => format!("at normal priority: {e}"),
        }
    );
    // Every one is a page (an `HSCAN` of about 200 fields, an `LRANGE` of
    // 1,000 entries, an `HMGET` of 500 fields: 0.1-0.5 ms each) or an
    // in-flight check within its budget (about 1 ms): none near 10 ms.
    let slow: Vec<_> = by_reconciler
        .iter()
        .filter(|(_, us, _)| *us >= SLOW_US)
        .collect();
    assert!(
        slow.is_empty(),
        "reconciler commands that held Redis {SLOW_US} µs or more: {slow:?}\n{stats}{}",
        match &priority {
            Ok(()) => String::new(),
            Err(e) => format!(
                "Redis ran at normal priority ({e}): a command the OS preempted counts its wait"
            ),
        }
    );
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

    // Two workers of full batches finish (the small-batch ones stop on
    // SIGTERM): every other reservation is an order.
    for mut wk in workers {
        wk.signal("-TERM");
        let status = wk.wait_exit(Duration::from_secs(60));
        assert!(status.success(), "worker stopped by SIGTERM: {status}");
    }
    let workers = [
        WorkerProc::start(&w.redis, &w.db, "bk-w3", &Opts::default()),
        WorkerProc::start(&w.redis, &w.db, "bk-w4", &Opts::default()),
    ];
    wait_drained(&w.redis, w.sale, Duration::from_secs(300));
    wait_orders(&w.db, w.sale, QUEUED as i64 - 1, Duration::from_secs(60));
    drop(workers);
    assert_eq!(
        w.sql("SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"),
        QUEUED as i64 - 1
    );
}
