//! Owns the bucket side of the `sale` commands for a sale split over
//! buckets (`sale create --shards K`): `sale rebalance` (complete
//! half-done transfers, refill empty buckets: `seckill_common::transfer`)
//! and the per-bucket table of `sale show`.

use crate::output::{outln, write_stdout};
use seckill_common::buckets;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::transfer;
use seckill_common::Config;
use std::error::Error;
use std::io::Write;

type Res<T> = Result<T, Box<dyn Error>>;

/// One bucket's figures as `sale show` prints them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BucketFigures {
    /// Units left to reserve (`None`: not loaded).
    pub stock: Option<i64>,
    /// Meta `total_stock`: its share moved by its transfers.
    pub total_stock: Option<i64>,
    /// Meta `share`: what it was loaded with.
    pub share: Option<i64>,
    /// Flow records.
    pub flows: u64,
    /// Units the order lifecycle released back to it (`released` hash).
    pub released: u64,
    /// Messages in its queue.
    pub queued: u64,
    /// Dead-letter entries.
    pub dead: u64,
    /// Transfers in, out, and out not yet taken in.
    pub transfers: (u64, u64, u64),
}

/// Reads bucket `k`'s figures (one pipeline).
///
/// Errors: Redis failures.
pub fn figures(con: &mut Con, k: SaleKeys) -> redis::RedisResult<BucketFigures> {
    let (stock, (total, share), flows, released, queued, dead, tin, tout, open) = redis::pipe()
        .get(k.stock())
        .cmd("HMGET")
        .arg(k.meta())
        .arg("total_stock")
        .arg("share")
        .hlen(k.flow())
        .hlen(k.released())
        .llen(k.queue())
        .llen(k.dead_letter())
        .hlen(k.transfers_in())
        .hlen(k.transfers_out())
        .hlen(k.transfers_open())
        .query(con)?;
    Ok(BucketFigures {
        stock,
        total_stock: total,
        share,
        flows,
        released,
        queued,
        dead,
        transfers: (tin, tout, open),
    })
}

/// The figures of every bucket of sale `id` (K = `k`), bucket 0 first.
///
/// Errors: Redis failures.
pub fn all_figures(con: &mut Con, id: u64, k: u32) -> redis::RedisResult<Vec<BucketFigures>> {
    buckets::all(id, k)
        .into_iter()
        .map(|b| figures(con, b))
        .collect()
}

/// Writes the per-bucket table of `sale show`.
pub fn write_table(w: &mut dyn Write, id: u64, figs: &[BucketFigures]) -> std::io::Result<()> {
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    writeln!(
        w,
        "bucket  tag                 stock    total    share    reserved released queued dead  transfers in/out/open"
    )?;
    for (b, f) in figs.iter().enumerate() {
        let tag = SaleKeys::bucket(id, b as u32).tag();
        writeln!(
            w,
            "{b:<7} {tag:<19} {:<8} {:<8} {:<8} {:<8} {:<8} {:<6} {:<5} {}/{}/{}",
            opt(f.stock),
            opt(f.total_stock),
            opt(f.share),
            f.flows,
            f.released,
            f.queued,
            f.dead,
            f.transfers.0,
            f.transfers.1,
            f.transfers.2
        )?;
    }
    Ok(())
}

/// `sale rebalance ID`: completes every half-done transfer of the sale and
/// gives every empty bucket half of the fullest one's stock
/// (`transfer::rebalance`), then prints the per-bucket table. Exit 1 for an
/// archived sale (MySQL's `archived_at`: its buckets are gone from Redis on
/// purpose, and its tombstone, which keeps no bucket count, would read as
/// one bucket), as `sale load` refuses one; exit 2 when Redis holds no
/// such sale.
pub fn rebalance(config: &Config, id: u64) -> Res<u8> {
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    if let Some(by) = crate::archive_cmd::sale_state(&mut db, id)?.and_then(|s| s.archived_by) {
        eprintln!(
            "seckill-reconciler: sale {id} was archived by {by}: its buckets are gone from \
             Redis on purpose; nothing moved"
        );
        return Ok(1);
    }
    let mut con = crate::sale_cmd::redis_con(config)?;
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
    })?;
    Ok(0)
}
