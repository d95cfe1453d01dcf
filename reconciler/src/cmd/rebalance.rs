//! Owns `sale rebalance ID` for a sale split over buckets (`sale create
//! --shards K`): complete half-done transfers and refill empty buckets
//! (`seckill_common::transfer`), then print the per-bucket table.

use crate::bucket_read::{all_figures, write_table};
use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::output::{outln, write_stdout};
use seckill_common::buckets;
use seckill_common::transfer;

/// `sale rebalance ID`: completes every half-done transfer of the sale and
/// gives every empty bucket half of the fullest one's stock
/// (`transfer::rebalance`), then prints the per-bucket table. Exit 1 for an
/// archived sale (MySQL's `archived_at`: its buckets are gone from Redis on
/// purpose, and its tombstone, which keeps no bucket count, would read as
/// one bucket), as `sale load` refuses one; exit 2 when Redis holds no
/// such sale.
pub fn run(config: &Config, id: u64) -> Result<u8, RunError> {
    let mut db = connect::mysql(&config.services)?;
    if let Some(by) = crate::sale_read::sale_state(&mut db, id)?.and_then(|s| s.archived_by) {
        eprintln!(
            "seckill-reconciler: sale {id} was archived by {by}: its buckets are gone from \
             Redis on purpose; nothing moved"
        );
        return Ok(EXIT_REFUSED);
    }
    let mut con = connect::redis(&config.services)?;
    let Some(k) = buckets::count(&mut con, id)? else {
        eprintln!("seckill-reconciler: Redis holds no sale {id}");
        return Ok(2);
    };
    if k == 1 {
        outln!("sale {id} has one bucket: nothing to move");
        return Ok(0);
    }
    let completed = transfer::complete_open(&mut con, id, k, 0)?;
    let moved = transfer::rebalance(&mut con, id, k)?;
    let figs = all_figures(&mut con, id, k)?;
    write_stdout(|w| {
        writeln!(
            w,
            "sale {id}: {} half-done transfer(s) completed, {moved} unit(s) moved",
            completed.len()
        )?;
        write_table(w, id, &figs)
    })
    .map_err(RunError::Output)?;
    Ok(0)
}
