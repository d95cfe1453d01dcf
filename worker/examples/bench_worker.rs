//! Benchmark driver of `scripts/bench-worker.sh` (not a test): for each
//! batch size, preloads the same number of order messages into a sale's
//! queue, times one `seckill-worker` draining them into MySQL, and prints
//! orders/s and the ratio to batch size 1 (one transaction per order).
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
        prepare(redis_url, server, &db_url, n)?;
        let secs = drain(bin, redis_url, &db_url, n, batch)?;
        let rate = n as f64 / secs;
        eprintln!("batch {batch:>4}: {n} orders in {secs:.2} s = {rate:.0} orders/s");
        rows.push((batch, secs, rate));
    }
    let base = rows.iter().find(|r| r.0 == 1).map(|r| r.2);
    println!("| batch | messages | seconds | orders/s | vs batch 1 |");
    println!("|---:|---:|---:|---:|---:|");
    for (batch, secs, rate) in &rows {
        let ratio = base.map_or("n/a".to_string(), |b| format!("{:.1} x", rate / b));
        println!("| {batch} | {n} | {secs:.2} | {rate:.0} | {ratio} |");
    }
    Ok(())
}

/// Fresh database with one sale of `n` units; Redis flushed and `n` order
/// messages queued (with their flow records and `queued` statuses, as the
/// reservation script leaves them).
fn prepare(redis_url: &str, server: &str, db_url: &str, n: u64) -> Res<()> {
    let mut c = seckill_common::schema::connect(&format!("{server}/"), Duration::from_secs(10))?;
    c.query_drop(format!("DROP DATABASE IF EXISTS `{DB}`"))?;
    seckill_common::schema::migrate(db_url, Duration::from_secs(10))?;
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    let now = seckill_common::now_ms();
    c.exec_drop(
        "INSERT INTO sales (sku, title, total_stock, available_stock, starts_at, ends_at)
         VALUES ('BENCH', 'bench', ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000))",
        (n, n, now - 1000, now + 3_600_000),
    )?;
    let sale = c.last_insert_id();
    let mut r = redis::Client::open(redis_url)?.get_connection()?;
    redis::cmd("FLUSHALL").query::<()>(&mut r)?;
    redis::cmd("SADD")
        .arg(seckill_common::keys::SALES)
        .arg(sale)
        .query::<()>(&mut r)?;
    let k = SaleKeys::new(sale);
    let mut i = 0;
    while i < n {
        let mut p = redis::pipe();
        for _ in 0..1000.min(n - i) {
            let m = OrderMessage {
                v: 1,
                reservation_id: seckill_common::ids::new_reservation_id(),
                sale_id: sale,
                user_id: format!("user-{i}"),
                reserved_at_ms: now,
            };
            let json = m.to_json();
            p.hset(k.flow(), &m.reservation_id, &json).ignore();
            p.hset(k.status(), &m.reservation_id, "queued").ignore();
            p.lpush(k.queue(), json).ignore();
            i += 1;
        }
        p.query::<()>(&mut r)?;
    }
    Ok(())
}

/// Starts one worker with `batch` and returns the seconds until MySQL holds
/// `n` orders; then stops it with SIGTERM.
fn drain(bin: &str, redis_url: &str, db_url: &str, n: u64, batch: usize) -> Res<f64> {
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
    let secs = loop {
        let done: Option<u64> = c.query_first("SELECT COUNT(*) FROM orders")?;
        if done.unwrap_or(0) >= n {
            break started.elapsed().as_secs_f64();
        }
        if let Some(st) = child.try_wait()? {
            return Err(format!("worker exited early: {st}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait()?;
    Ok(secs)
}
