//! Benchmark driver of `scripts/bench-worker.sh --consumers` (not a test):
//! what more consumers buy. For each number of sales and each number of
//! consumers it preloads the same number of order messages, spread evenly
//! over the sales, and times their drain into MySQL; prints orders/s and
//! the ratio to one consumer.
//!
//! Usage: `bench_consumers WORKER_BIN REDIS_URL MYSQL_SERVER_URL MESSAGES
//! SALES,SALES.. CONSUMERS,CONSUMERS..`
//!
//! `BENCH_CONSUMERS_BY=processes` runs that many worker processes of one
//! consumer each; otherwise one worker process runs that many consumers
//! (`SECKILL_WORKER_CONSUMERS_MIN` = `_MAX`). The MySQL database
//! `seckill_demo_bench_consumers` is dropped and recreated for every run;
//! the Redis server must be private to the benchmark (it is flushed).

use mysql::prelude::Queryable;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const DB: &str = "seckill_demo_bench_consumers";

fn list(arg: &str) -> Res<Vec<u64>> {
    Ok(arg
        .split(',')
        .map(|a| a.trim().parse())
        .collect::<Result<_, _>>()?)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        return Err(
            "usage: bench_consumers WORKER_BIN REDIS_URL MYSQL_SERVER_URL MESSAGES \
                    SALES,.. CONSUMERS,.."
                .into(),
        );
    }
    let (bin, redis_url, server) = (&args[1], &args[2], args[3].trim_end_matches('/'));
    let n: u64 = args[4].parse()?;
    let by_process = std::env::var("BENCH_CONSUMERS_BY").is_ok_and(|v| v == "processes");
    let db_url = format!("{server}/{DB}");
    println!("| sales | consumers | messages | seconds | orders/s | vs 1 consumer |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for sales in list(&args[5])? {
        let mut one = None;
        for consumers in list(&args[6])? {
            let msgs = fresh_sales(server, &db_url, n, sales)?;
            queue(redis_url, &msgs)?;
            let secs = drain(bin, redis_url, &db_url, n, consumers, by_process)?;
            let rate = n as f64 / secs;
            let base = *one.get_or_insert(rate);
            println!(
                "| {sales} | {consumers} | {n} | {secs:.2} | {rate:.0} | {:.2} x |",
                rate / base
            );
        }
    }
    Ok(())
}

/// Fresh database with `sales` sales of `n / sales` units each (the last
/// takes the rest); returns `n` order messages over them, interleaved.
fn fresh_sales(server: &str, db_url: &str, n: u64, sales: u64) -> Res<Vec<OrderMessage>> {
    let mut c = seckill_common::schema::connect(&format!("{server}/"), Duration::from_secs(10))?;
    c.query_drop(format!("DROP DATABASE IF EXISTS `{DB}`"))?;
    seckill_common::schema::migrate(db_url, Duration::from_secs(10))?;
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    let now = seckill_common::now_ms();
    let mut ids = Vec::new();
    for s in 0..sales {
        let units = n / sales + if s + 1 == sales { n % sales } else { 0 };
        c.exec_drop(
            "INSERT INTO sales (sku, title, total_stock, available_stock, starts_at, ends_at)
             VALUES (?, 'bench', ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000))",
            (
                format!("BENCH-{s}"),
                units,
                units,
                now - 1000,
                now + 3_600_000,
            ),
        )?;
        ids.push(c.last_insert_id());
    }
    Ok((0..n)
        .map(|i| OrderMessage {
            v: 1,
            reservation_id: seckill_common::ids::new_reservation_id(),
            sale_id: ids[(i % sales) as usize],
            user_id: format!("user-{i}"),
            reserved_at_ms: now,
            quantity: 1,
        })
        .collect())
}

/// Flushes Redis and queues `msgs` on their sales' queues (with their flow
/// records and `queued` statuses, as the reservation script leaves them).
fn queue(redis_url: &str, msgs: &[OrderMessage]) -> Res<()> {
    let mut r = redis::Client::open(redis_url)?.get_connection()?;
    redis::cmd("FLUSHALL").query::<()>(&mut r)?;
    for chunk in msgs.chunks(1000) {
        let mut p = redis::pipe();
        for m in chunk {
            let k = SaleKeys::new(m.sale_id);
            let json = m.to_json();
            p.sadd(seckill_common::keys::SALES, m.sale_id).ignore();
            p.hset(k.flow(), &m.reservation_id, &json).ignore();
            p.hset(k.status(), &m.reservation_id, "queued").ignore();
            p.lpush(k.queue(), json).ignore();
        }
        p.query::<()>(&mut r)?;
    }
    Ok(())
}

fn worker(bin: &str, redis_url: &str, db_url: &str, id: &str, consumers: u64) -> Res<Child> {
    Ok(Command::new(bin)
        .env("SECKILL_REDIS_URL", redis_url)
        .env("SECKILL_MYSQL_URL", db_url)
        .env("SECKILL_WORKER_ID", id)
        .env("SECKILL_WORKER_CONSUMERS_MIN", consumers.to_string())
        .env("SECKILL_WORKER_CONSUMERS_MAX", consumers.to_string())
        .env("SECKILL_WORKER_METRICS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?)
}

/// Starts the consumers and returns the seconds until every sale's MySQL
/// stock is used up (`n` orders); then stops them with SIGTERM and checks
/// that MySQL holds `n` orders.
fn drain(
    bin: &str,
    redis_url: &str,
    db_url: &str,
    n: u64,
    consumers: u64,
    by_process: bool,
) -> Res<f64> {
    let started = Instant::now();
    let mut children = Vec::new();
    if by_process {
        for i in 0..consumers {
            children.push(worker(bin, redis_url, db_url, &format!("bench-{i}"), 1)?);
        }
    } else {
        children.push(worker(bin, redis_url, db_url, "bench", consumers)?);
    }
    let mut c = seckill_common::schema::connect(db_url, Duration::from_secs(10))?;
    let secs = loop {
        let left: Option<i64> = c.query_first("SELECT SUM(available_stock) FROM sales")?;
        if left.unwrap_or(1) <= 0 {
            break started.elapsed().as_secs_f64();
        }
        for child in children.iter_mut() {
            if let Some(st) = child.try_wait()? {
                return Err(format!("worker exited early: {st}").into());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for child in children.iter_mut() {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        child.wait()?;
    }
    let orders: Option<u64> = c.query_first("SELECT COUNT(*) FROM orders")?;
    if orders != Some(n) {
        return Err(format!("{orders:?} orders for {n} messages").into());
    }
    Ok(secs)
}
