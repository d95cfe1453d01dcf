//! Owns what the reconciler reads from the buckets of a sale split over
//! buckets (`seckill_common::buckets`): the sale's Redis totals summed over
//! its buckets at one instant, and each bucket's books (its transfers, and
//! its stock, reservations and released units at one instant), and the
//! per-bucket table `sale show` and `sale rebalance` print ([`write_table`]).
//!
//! No script reads two buckets (on a cluster they are on different
//! masters), so the totals are read twice: each bucket's stock, flow record
//! count, `total_stock` and open transfers in one `MULTI` (a sale of
//! several units per buyer: its flow records' units summed between two
//! reads of the stock, `releases` and `total_stock`,
//! `redis_read::bucket_units`), then each bucket's `total_stock` and open
//! transfers again. Every transfer step
//! changes its bucket's `total_stock`, and units in flight sit in an open
//! record from step 1 until after step 2; so when no bucket had an open
//! transfer and no `total_stock` moved between the two reads, the sums are
//! those of one instant.

use crate::redis_read::RedisTotals;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::transfer::{Direction, Record};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

/// How many times [`totals`] reads before it gives up (transfers kept
/// moving units meanwhile).
pub const TOTALS_TRIES: usize = 5;

/// Pause between two tries of [`totals`].
pub const TOTALS_PAUSE: Duration = Duration::from_millis(20);

/// The totals of sale `sale_id` over its `buckets` buckets; `None` when no
/// two reads agreed within [`TOTALS_TRIES`] (the caller then judges no
/// totals this run). `stock` is `None` when some bucket's stock is not
/// loaded.
///
/// Errors: Redis failures.
pub fn totals(
    con: &mut Con,
    sale_id: u64,
    buckets: u32,
) -> redis::RedisResult<Option<RedisTotals>> {
    let keys = seckill_common::buckets::all(sale_id, buckets);
    let units = crate::redis_read::sells_units(con, &keys[0])?;
    for _ in 0..TOTALS_TRIES {
        let mut sum = RedisTotals {
            stock: Some(0),
            reservations: 0,
            now_ms: 0,
            unsettled: false,
        };
        let mut first = Vec::with_capacity(keys.len());
        let mut settled = true;
        for k in &keys {
            let (stock, flows, total, open, now_ms) = if units {
                let u = crate::redis_read::bucket_units(con, k)?;
                settled &= !u.unsettled;
                let open: u64 = redis::cmd("HLEN").arg(k.transfers_open()).query(con)?;
                (u.stock, u.units, u.total_stock, open, u.now_ms)
            } else {
                read_one(con, k)?
            };
            sum.stock = match (sum.stock, stock) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
            sum.reservations += flows;
            sum.now_ms = sum.now_ms.max(now_ms);
            first.push((total, open));
        }
        let mut same = settled && first.iter().all(|(_, open)| *open == 0);
        for (k, before) in keys.iter().zip(&first) {
            let again: (Option<i64>, u64) = redis::pipe()
                .atomic()
                .hget(k.meta(), "total_stock")
                .hlen(k.transfers_open())
                .query(con)?;
            same &= again == *before;
        }
        if same {
            return Ok(Some(sum));
        }
        std::thread::sleep(TOTALS_PAUSE);
    }
    Ok(None)
}

/// One bucket's stock, units reserved, `total_stock`, open transfers and
/// Redis's clock (Unix ms), as [`totals`] reads them.
type OneBucket = (Option<i64>, i64, Option<i64>, u64, u64);

/// Bucket `k`'s stock, flow records, `total_stock`, open transfers and
/// Redis's clock (Unix ms), in one `MULTI`: a sale of one unit per buyer,
/// whose flow records are its units.
///
/// Errors: Redis failures.
fn read_one(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<OneBucket> {
    let (stock, flows, total, open, time): (Option<i64>, i64, Option<i64>, u64, (u64, u64)) =
        redis::pipe()
            .atomic()
            .get(k.stock())
            .hlen(k.flow())
            .hget(k.meta(), "total_stock")
            .hlen(k.transfers_open())
            .cmd("TIME")
            .query(con)?;
    Ok((stock, flows, total, open, time.0 * 1000 + time.1 / 1000))
}

/// One bucket's transfer books, read in one `MULTI`.
#[derive(Debug, Default)]
pub struct BucketBooks {
    /// Meta `share`: the units it was loaded with (`None`: not loaded).
    pub share: Option<i64>,
    /// Meta `total_stock`: its share moved by its transfers.
    pub total_stock: Option<i64>,
    /// Its stock counter (`None`: not loaded).
    pub stock: Option<i64>,
    /// Its flow records: units reserved there and not released.
    pub reservations: i64,
    /// Its `released` hash: units the order lifecycle gave back to it.
    pub released: i64,
    /// Transfer id -> record, of the units it gave (`transfers:out`).
    pub out: HashMap<String, Record>,
    /// Transfer id -> record, of the units it took (`transfers:in`).
    pub taken: HashMap<String, Record>,
    /// Records of either hash that do not parse: transfer id, raw text.
    pub malformed: Vec<(String, String)>,
    /// Redis's clock at the read, Unix ms.
    pub now_ms: u64,
    /// In a sale of several units per buyer, its stock, flow records'
    /// units and `total_stock` at one instant (`redis_read::bucket_units`;
    /// what `bucket_stock` judges, `reservations` counting records, not
    /// units).
    pub units: Option<crate::redis_read::BucketUnits>,
}

/// `((share, total_stock), stock, flow records, released, transfers:out,
/// transfers:in, TIME)`.
type BooksReply = (
    (Option<i64>, Option<i64>),
    Option<i64>,
    i64,
    i64,
    Vec<(String, String)>,
    Vec<(String, String)>,
    (u64, u64),
);

/// Reads bucket `k`'s books atomically; with `units` (the sale sells
/// several units per buyer) its units too ([`BucketBooks::units`]).
///
/// Errors: Redis failures.
pub fn books(con: &mut Con, k: SaleKeys, units: bool) -> redis::RedisResult<BucketBooks> {
    let ((share, total), stock, reservations, released, out, taken, time): BooksReply =
        redis::pipe()
            .atomic()
            .cmd("HMGET")
            .arg(k.meta())
            .arg("share")
            .arg("total_stock")
            .get(k.stock())
            .hlen(k.flow())
            .hlen(k.released())
            .hgetall(k.transfers_out())
            .hgetall(k.transfers_in())
            .cmd("TIME")
            .query(con)?;
    let mut b = BucketBooks {
        share,
        total_stock: total,
        stock,
        reservations,
        released,
        now_ms: time.0 * 1000 + time.1 / 1000,
        ..BucketBooks::default()
    };
    if units {
        b.units = Some(crate::redis_read::bucket_units(con, &k)?);
    }
    for (tid, raw) in out {
        match Record::parse(&raw, Direction::Out) {
            Some(r) => {
                b.out.insert(tid, r);
            }
            None => b.malformed.push((tid, raw)),
        }
    }
    for (tid, raw) in taken {
        match Record::parse(&raw, Direction::In) {
            Some(r) => {
                b.taken.insert(tid, r);
            }
            None => b.malformed.push((tid, raw)),
        }
    }
    Ok(b)
}

/// The transfer ids of bucket `k`'s open records (`HKEYS transfers:open`).
///
/// Errors: Redis failures.
pub fn open_ids(con: &mut Con, k: SaleKeys) -> redis::RedisResult<Vec<String>> {
    redis::cmd("HKEYS").arg(k.transfers_open()).query(con)
}

/// The transfer ids bucket `k` has taken in (`HKEYS transfers:in`).
///
/// Errors: Redis failures.
pub fn taken_ids(con: &mut Con, k: SaleKeys) -> redis::RedisResult<Vec<String>> {
    redis::cmd("HKEYS").arg(k.transfers_in()).query(con)
}

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
    /// Units the order lifecycle released back to it (the `released`
    /// hash's entries, each of its message's quantity).
    pub released: u64,
    /// Messages in its queue.
    pub queued: u64,
    /// Dead-letter entries.
    pub dead: u64,
    /// Transfers in, out, and out not yet taken in.
    pub transfers: (u64, u64, u64),
}

/// Reads bucket `k`'s figures (one pipeline; then the released hash's
/// units when it has entries).
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
    // Released entries are few (released orders only): their units are
    // read whole; none is one call less.
    let released: u64 = match released {
        0u64 => 0,
        _ => crate::redis_read::hash_units(con, &k.released())?,
    };
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
    seckill_common::buckets::all(id, k)
        .into_iter()
        .map(|b| figures(con, b))
        .collect()
}

/// Writes the per-bucket table of `sale show`.
pub fn write_table(w: &mut dyn Write, id: u64, figs: &[BucketFigures]) -> std::io::Result<()> {
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    writeln!(
        w,
        "bucket  tag                 stock    total    share    reserved units    released queued dead  transfers in/out/open"
    )?;
    for (b, f) in figs.iter().enumerate() {
        let tag = SaleKeys::bucket(id, b as u32).tag();
        // Units its reservations hold: its total less what is left.
        let units = f.total_stock.zip(f.stock).map(|(t, s)| t - s);
        writeln!(
            w,
            "{b:<7} {tag:<19} {:<8} {:<8} {:<8} {:<8} {:<8} {:<8} {:<6} {:<5} {}/{}/{}",
            opt(f.stock),
            opt(f.total_stock),
            opt(f.share),
            f.flows,
            opt(units),
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
