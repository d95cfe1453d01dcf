//! Benchmark driver of `scripts/bench-worker.sh` (not a test): for each
//! batch size, first times the raw rate of the same MySQL taking the same
//! rows (the order and ledger row of each message, multi-row `INSERT`s of
//! `batch` rows each, one commit per batch, from one connection, nothing
//! else), then preloads the messages into a sale's queue and times one
//! `seckill-worker` draining them into MySQL; prints both rates, their
//! ratio (issue 16: worker >= 0.5 x raw) and the ratio to batch size 1.
//!
//! Usage: `bench_worker WORKER_BIN REDIS_URL MYSQL_SERVER_URL MESSAGES BATCH...`
//! The MySQL database `seckill_demo_bench_worker` is dropped and recreated
//! for every batch size; the Redis server must be private to the benchmark
//! (it is flushed).

use mysql::prelude::Queryable;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const DB: &str = "seckill_demo_bench_worker";

/// Most commits of one raw run: `batch` x this rows (2,000 commits take
/// about 5 s with durable commits here).
const RAW_BATCHES: u64 = 2_000;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        return Err(
            "usage: bench_worker WORKER_BIN REDIS_URL MYSQL_SERVER_URL MESSAGES BATCH...".into(),
        );
    }
    let (bin, redis_url, server) = (&args[1], &args[2], args[3].trim_end_matches('/'));
    let n: u64 = args[4].parse()?;
    let batches: Vec<usize> = args[5..]
        .iter()
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let db_url = format!("{server}/{DB}");
    let mut rows = Vec::new();
    for batch in batches {
        // Raw before and after the drain, their mean the reference: a
        // machine shared with other work drifts within a minute. At most
        // RAW_BATCHES commits each (batch 1 would take minutes otherwise).
        let raw_n = n.min((batch as u64).saturating_mul(RAW_BATCHES)).max(1);
        let (sale, msgs) = fresh_sale(server, &db_url, n)?;
        let (raw_before, raw_cpu) = raw_inserts(&db_url, sale, &msgs[..raw_n as usize], batch)?;
        let (sale, msgs) = fresh_sale(server, &db_url, n)?;
        queue(redis_url, sale, &msgs)?;
        let (secs, cpu) = drain(bin, redis_url, &db_url, n, batch)?;
        let rate = n as f64 / secs;
        redis_cost(redis_url, n)?;
        let (sale, msgs) = fresh_sale(server, &db_url, n)?;
        let (raw_after, _) = raw_inserts(&db_url, sale, &msgs[..raw_n as usize], batch)?;
        let raw = 2.0 * raw_n as f64 / (raw_before + raw_after);
        eprintln!(
            "batch {batch:>4}: {n} orders in {secs:.2} s = {rate:.0} orders/s; raw MySQL \
             {raw:.0} orders/s ({raw_n} rows: {raw_before:.2} s before, {raw_after:.2} s \
             after); worker / raw = {:.2}",
            rate / raw
        );
        let us = |c: f64| c * 1e6 / n as f64;
        let raw_us = |c: f64| c * 1e6 / raw_n as f64;
        eprintln!(
            "  CPU per order: worker run {:.1} us (MySQL {:.1}, Redis {:.1}, worker {:.1}); \
             raw run {:.1} us (MySQL {:.1}, client {:.1}); raw / worker run = {:.2}",
            us(cpu.total()),
            us(cpu.mysql),
            us(cpu.redis),
            us(cpu.own),
            raw_us(raw_cpu.total()),
            raw_us(raw_cpu.mysql),
            raw_us(raw_cpu.own),
            raw_us(raw_cpu.total()) / us(cpu.total())
        );
        rows.push((batch, secs, rate, raw));
    }
    let base = rows.iter().find(|r| r.0 == 1).map(|r| r.2);
    println!("| batch | messages | seconds | orders/s | raw MySQL orders/s | worker / raw | vs batch 1 |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (batch, secs, rate, raw) in &rows {
        let ratio = base.map_or("n/a".to_string(), |b| format!("{:.1} x", rate / b));
        println!(
            "| {batch} | {n} | {secs:.2} | {rate:.0} | {raw:.0} | {:.2} | {ratio} |",
            rate / raw
        );
    }
    Ok(())
}

/// CPU seconds (user + system) a run took, by process: MySQL's server
/// (`BENCH_MYSQL_PID`), the private Redis (`BENCH_REDIS_PID`), and the
/// process doing the work (the worker, or this driver in the raw run).
/// Wall time on 2 shared cores drifts with other work; CPU per order much
/// less. 0 for a process whose pid is not given.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    mysql: f64,
    redis: f64,
    own: f64,
}

impl Cpu {
    fn total(&self) -> f64 {
        self.mysql + self.redis + self.own
    }

    /// The servers' counters now (`own` 0).
    fn servers() -> Cpu {
        let of = |var: &str| std::env::var(var).map_or(0.0, |p| cpu_secs(&p));
        Cpu {
            mysql: of("BENCH_MYSQL_PID"),
            redis: of("BENCH_REDIS_PID"),
            own: 0.0,
        }
    }

    /// The servers' CPU since `self` was read, and `own`.
    fn since(&self, own: f64) -> Cpu {
        let now = Cpu::servers();
        Cpu {
            mysql: now.mysql - self.mysql,
            redis: now.redis - self.redis,
            own,
        }
    }
}

/// utime + stime of process `pid` in seconds, from `/proc/PID/stat`
/// (clock ticks of 10 ms); 0 when unreadable.
fn cpu_secs(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces), 1-based 14, 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}

/// The raw rate's run: the order and ledger rows the worker writes for
/// `msgs` (same columns and values, sale `sale`, no payment window), in
/// multi-row `INSERT`s of `batch` rows per table and one `COMMIT` per
/// batch, over one connection; returns the seconds. No lock, no read, no
/// Redis: what MySQL alone takes for these rows. Returns the seconds and
/// the CPU it took.
fn raw_inserts(db_url: &str, sale: u64, msgs: &[OrderMessage], batch: usize) -> Res<(f64, Cpu)> {
    use mysql::{Params, Value};
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    let me = std::process::id().to_string();
    let (cpu, own) = (Cpu::servers(), cpu_secs(&me));
    let started = Instant::now();
    for chunk in msgs.chunks(batch.max(1)) {
        let mut tx = c.start_transaction(mysql::TxOpts::default())?;
        let rows = vec!["(?, ?, ?, 1, 'confirmed', FROM_UNIXTIME(? / 1000), NULL)"; chunk.len()];
        let params: Vec<Value> = chunk
            .iter()
            .flat_map(|m| {
                [
                    Value::from(m.reservation_id.as_str()),
                    Value::from(sale),
                    Value::from(m.user_id.as_str()),
                    Value::from(m.reserved_at_ms),
                ]
            })
            .collect();
        tx.exec_drop(
            format!(
                "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, status, \
                 reserved_at, pay_by) VALUES {}",
                rows.join(",")
            ),
            Params::Positional(params),
        )?;
        let rows = vec!["(?, ?, ?, -1, 'order')"; chunk.len()];
        let params: Vec<Value> = chunk
            .iter()
            .flat_map(|m| {
                [
                    Value::from(m.reservation_id.as_str()),
                    Value::from(sale),
                    Value::from(m.user_id.as_str()),
                ]
            })
            .collect();
        tx.exec_drop(
            format!(
                "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason) \
                 VALUES {}",
                rows.join(",")
            ),
            Params::Positional(params),
        )?;
        tx.commit()?;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok((secs, cpu.since(cpu_secs(&me) - own)))
}

/// Prints Redis's own time per order during the drain, by command, from
/// `INFO commandstats` (reset when the messages were queued): where the
/// Redis side of a batch goes.
fn redis_cost(redis_url: &str, n: u64) -> Res<()> {
    let mut r = redis::Client::open(redis_url)?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut r)?;
    let mut rows: Vec<(String, u64, u64)> = info
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.parse::<u64>().ok())
            };
            Some((name.to_string(), field("calls=")?, field("usec=")?))
        })
        .filter(|(name, _, _)| name != "info")
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.2));
    let total: u64 = rows.iter().map(|r| r.2).sum();
    let top: Vec<String> = rows
        .iter()
        .take(6)
        .map(|(name, calls, usec)| format!("{name} {:.2} ({calls} calls)", *usec as f64 / n as f64))
        .collect();
    eprintln!(
        "  redis: {:.2} us of server time per order: {}",
        total as f64 / n as f64,
        top.join(", ")
    );
    Ok(())
}

/// Fresh database with one sale of `n` units; returns the sale and `n`
/// order messages for it.
fn fresh_sale(server: &str, db_url: &str, n: u64) -> Res<(u64, Vec<OrderMessage>)> {
    let mut c = seckill_common::schema::connect(&format!("{server}/"), Duration::from_secs(10))?;
    c.query_drop(format!("DROP DATABASE IF EXISTS `{DB}`"))?;
    seckill_common::schema::migrate(db_url, Duration::from_secs(10))?;
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    let now = seckill_common::now_ms();
    // BENCH_PER_BUYER (default 1): the sale's units per buyer; above 1 the
    // worker checks each buyer's units in MySQL (every buyer buys one).
    let per_buyer: u64 = std::env::var("BENCH_PER_BUYER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    c.exec_drop(
        "INSERT INTO sales (sku, title, total_stock, available_stock, starts_at, ends_at,
                            per_user_limit)
         VALUES ('BENCH', 'bench', ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000), ?)",
        (n, n, now - 1000, now + 3_600_000, per_buyer),
    )?;
    let sale = c.last_insert_id();
    let msgs = (0..n)
        .map(|i| OrderMessage {
            v: 1,
            reservation_id: seckill_common::ids::new_reservation_id(),
            sale_id: sale,
            user_id: format!("user-{i}"),
            reserved_at_ms: now,
            quantity: 1,
        })
        .collect();
    Ok((sale, msgs))
}

/// Flushes Redis and queues `msgs` for sale `sale` (with their flow
/// records and `queued` statuses, as the reservation script leaves them).
fn queue(redis_url: &str, sale: u64, msgs: &[OrderMessage]) -> Res<()> {
    let mut r = redis::Client::open(redis_url)?.get_connection()?;
    redis::cmd("FLUSHALL").query::<()>(&mut r)?;
    redis::cmd("SADD")
        .arg(seckill_common::keys::SALES)
        .arg(sale)
        .query::<()>(&mut r)?;
    let k = SaleKeys::new(sale);
    for chunk in msgs.chunks(1000) {
        let mut p = redis::pipe();
        for m in chunk {
            let json = m.to_json();
            p.hset(k.flow(), &m.reservation_id, &json).ignore();
            p.hset(k.status(), &m.reservation_id, "queued").ignore();
            p.lpush(k.queue(), json).ignore();
        }
        p.query::<()>(&mut r)?;
    }
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut r)?;
    Ok(())
}

/// Starts one worker with `batch` and returns the seconds until the sale's
/// MySQL stock is used up (its `n` units: `n` orders); then stops it with
/// SIGTERM and checks that MySQL holds `n` orders.
fn drain(bin: &str, redis_url: &str, db_url: &str, n: u64, batch: usize) -> Res<(f64, Cpu)> {
    let cpu = Cpu::servers();
    let started = Instant::now();
    let mut child = Command::new(bin)
        .env("SECKILL_REDIS_URL", redis_url)
        .env("SECKILL_MYSQL_URL", db_url)
        .env("SECKILL_WORKER_ID", "bench")
        .env("SECKILL_WORKER_BATCH", batch.to_string())
        .env("SECKILL_WORKER_METRICS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    // The sale's one row, not COUNT(*) of orders: a scan every 50 ms
    // would take MySQL's CPU from the worker being timed.
    let secs = loop {
        let left: Option<i64> = c.query_first("SELECT available_stock FROM sales")?;
        if left.unwrap_or(1) <= 0 {
            break started.elapsed().as_secs_f64();
        }
        if let Some(st) = child.try_wait()? {
            return Err(format!("worker exited early: {st}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let cpu = cpu.since(cpu_secs(&child.id().to_string()));
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait()?;
    let orders: Option<u64> = c.query_first("SELECT COUNT(*) FROM orders")?;
    if orders != Some(n) {
        return Err(format!("{orders:?} orders for {n} messages").into());
    }
    Ok((secs, cpu))
}
