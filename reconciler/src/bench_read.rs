//! Owns `seckill-reconciler bench-read ID`: the benchmark's baseline. It reads
//! the three data sets of one sale exactly as `run` reads them (flow records
//! by `HSCAN`, orders and ledger rows by streamed `SELECT` in one snapshot,
//! `mysql_read::snapshot`) and does nothing with them, then prints the
//! counts and the time in ms. Read-only.

use crate::error::RunError;
use crate::run_cmd::redis_connect;
use seckill_common::keys::SaleKeys;
use seckill_common::Config;
use std::time::Instant;

/// Prints `flow_records=N ledger_rows=N orders=N read_ms=N` for sale `id`.
pub fn bench_read(config: &Config, id: u64) -> Result<u8, RunError> {
    let mut redis = redis_connect(config)?;
    let mut mysql = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let started = Instant::now();
    let mut flows = 0u64;
    crate::redis_read::scan_hash(
        &mut redis,
        &SaleKeys::new(id).flow(),
        |_, _| flows += 1,
        || Ok::<(), RunError>(()),
    )?;
    let mut orders = 0u64;
    let snap = crate::mysql_read::snapshot(&mut mysql, id, |_| orders += 1)?;
    let ledger = snap.map_or(0, |s| s.deducted.len());
    crate::output::outln!(
        "flow_records={flows} ledger_rows={ledger} orders={orders} read_ms={}",
        started.elapsed().as_millis()
    );
    Ok(0)
}
