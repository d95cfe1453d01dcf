//! The reconciler benchmark's baseline (`scripts/bench-reconciler.sh`):
//! reads the three data sets of one sale exactly as `seckill-reconciler
//! run` reads them (flow records by `HSCAN`, orders and ledger rows by
//! streamed `SELECT` in one snapshot, `mysql_read::snapshot`) and does
//! nothing with them, then prints the counts and the time in ms. Read-only.
//! Configured by the shared variables (`SECKILL_REDIS_URL`,
//! `SECKILL_MYSQL_URL` and their timeouts).
//!
//! Usage: `bench_read SALE_ID`; prints
//! `flow_records=N ledger_rows=N orders=N read_ms=N`. Exit 2 when it could
//! not run, 64 for a bad argument.

use seckill_common::keys::SaleKeys;
use seckill_common::start::{self, EXIT_CONFIG, EXIT_USAGE};
use seckill_reconciler::error::RunError;
use seckill_reconciler::{connect, mysql_read, redis_read};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    const PROGRAM: &str = "bench_read";
    let id = match std::env::args().nth(1).map(|a| a.parse::<u64>()) {
        Some(Ok(id)) => id,
        _ => return start::fail(PROGRAM, &"usage: bench_read SALE_ID", EXIT_USAGE),
    };
    let env = seckill_common::Env::from_env();
    let config = match seckill_common::Services::from_env(&env) {
        Ok(c) => c,
        Err(e) => return start::fail(PROGRAM, &e, EXIT_CONFIG),
    };
    start::finish(PROGRAM, read(&config, id), |_| EXIT_CONFIG)
}

/// Reads sale `id`'s three data sets and prints their counts and time.
fn read(config: &seckill_common::Services, id: u64) -> Result<u8, RunError> {
    let mut redis = connect::redis(config)?;
    let mut mysql = connect::mysql(config)?;
    let started = Instant::now();
    let mut flows = 0u64;
    redis_read::scan_hash(
        &mut redis,
        &SaleKeys::new(id).flow(),
        |_, _| flows += 1,
        || Ok::<(), RunError>(()),
    )?;
    let mut orders = 0u64;
    let snap = mysql_read::snapshot(&mut mysql, id, |_| orders += 1)?;
    let ledger = snap.map_or(0, |s| s.deducted.len());
    println!(
        "flow_records={flows} ledger_rows={ledger} orders={orders} read_ms={}",
        started.elapsed().as_millis()
    );
    Ok(0)
}
