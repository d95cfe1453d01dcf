//! Owns `seckill-reconciler bench-read ID`: the benchmark's baseline. It reads
//! the three data sets of one sale exactly as `run` reads them (flow records
//! by `HSCAN`, ledger deductions and orders by streamed `SELECT`) and does
//! nothing with them, then prints the counts and the time in ms. Read-only.

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
    let ledger = crate::mysql_read::deducted_ids(&mut mysql, id)?.len();
    let mut orders = 0u64;
    crate::mysql_read::for_each_order_id(&mut mysql, id, |_| orders += 1)?;
    crate::output::outln!(
        "flow_records={flows} ledger_rows={ledger} orders={orders} read_ms={}",
        started.elapsed().as_millis()
    );
    Ok(0)
}
