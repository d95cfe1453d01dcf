//! Owns the public rechecks, read from Redis with no buyer, so that the
//! request that happens to make one is answered a public fact whatever its
//! token, and no signature is checked to learn it: whether a sale
//! remembered sold out still is (its reservation sequence and pause marks;
//! for a sale split over buckets, every bucket, as the pull's sold-out
//! decision reads them), and whether every bucket of a sale is paused.

use crate::redis::link::{LinkPool, Unavailable};
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::sequence;
use seckill_common::transfer::{self, Snapshot};

/// What the recheck found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Still {
    /// No unit reserved or released since `seq`, and not paused: sold out.
    SoldOut,
    /// Something changed (a reservation, a release, a pause, the window's
    /// end): the purchase goes the whole way (the buyer verified, Redis
    /// asked), so the script's answer (`ended` frees the sale's buyers)
    /// replaces the memory.
    Changed,
}

/// Whether the one-bucket sale `sale_id`, remembered sold out at `seq`,
/// still is: one round trip of `HMGET meta` and `GET stock` on a shared
/// link. The same sequence means no unit was reserved and none came back,
/// so the stock is still 0; a window that has ended is a change.
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn sold_out_still(links: &LinkPool, sale_id: u64, seq: u64) -> Result<Still, Unavailable> {
    let k = SaleKeys::new(sale_id);
    let (meta, stock) = links.with(|link| {
        link.with(|con| {
            redis::pipe()
                .cmd("HMGET")
                .arg(k.meta())
                .arg("total_stock")
                .arg("releases")
                .arg(seckill_common::data_loss::PAUSED_FIELD)
                .arg(seckill_common::sale_admin::OPERATOR_PAUSED)
                .arg("ends_at_ms")
                .cmd("GET")
                .arg(k.stock())
                .query::<(Vec<Option<String>>, Option<i64>)>(con)
        })
    })?;
    let num = |i: usize| meta.get(i).cloned().flatten()?.parse::<u64>().ok();
    let paused = [2, 3]
        .iter()
        .any(|&i| meta.get(i).is_some_and(Option::is_some));
    let Some(total) = num(0) else {
        return Ok(Still::Changed);
    };
    let ended = num(4).is_some_and(|end| seckill_common::now_ms() >= end);
    let now = sequence(total, stock.unwrap_or(0), num(1).unwrap_or(0));
    Ok(
        if !paused && !ended && now == seq && stock.unwrap_or(0) <= 0 {
            Still::SoldOut
        } else {
            Still::Changed
        },
    )
}

/// Whether every bucket of `sale_id` (K = `k`) carries a pause mark (the
/// data-loss `paused` or the operator's `operator_paused`): then the
/// reservation script answers `paused` to every buyer, whatever their home
/// bucket. One `HMGET` per bucket on a shared link, stopping at the first
/// bucket without a mark (a bucket not loaded is not paused: the script
/// decides).
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn paused_everywhere(links: &LinkPool, sale_id: u64, k: u32) -> Result<bool, Unavailable> {
    links.with(|link| {
        link.with(|con| {
            for b in seckill_common::buckets::all(sale_id, k) {
                let marks: (Option<String>, Option<String>) = redis::cmd("HMGET")
                    .arg(b.meta())
                    .arg(seckill_common::data_loss::PAUSED_FIELD)
                    .arg(seckill_common::sale_admin::OPERATOR_PAUSED)
                    .query(con)?;
                if marks.0.is_none() && marks.1.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    })
}

/// [`sold_out_still`] for a sale split over `k` > 1 buckets, remembered
/// sold out at `seq` (the sum of its buckets' sequences when the pull
/// decided it, `transfer::pull`): two snapshot rounds of every bucket as
/// that decision reads them (every stock 0, no transfer open, no bucket's
/// `moved_in` changed between the rounds, the same sum of sequences), and
/// between them every bucket's pause marks and window end. Any difference,
/// a bucket gone, a pause or an ended window is [`Still::Changed`].
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn split_sold_out_still(
    links: &LinkPool,
    sale_id: u64,
    k: u32,
    seq: u64,
) -> Result<Still, Unavailable> {
    let keys = seckill_common::buckets::all(sale_id, k);
    let empty = |round: &[Snapshot]| {
        round.iter().all(|s| s.stock <= 0 && s.open == 0)
            && round.iter().map(|s| s.seq).sum::<u64>() == seq
    };
    links.with(|link| {
        link.with(|con| {
            let first = snapshots(con, &keys)?;
            if !empty(&first) {
                return Ok(Still::Changed);
            }
            for b in &keys {
                let (total, paused, operator, ends): Marks = redis::cmd("HMGET")
                    .arg(b.meta())
                    .arg("total_stock")
                    .arg(seckill_common::data_loss::PAUSED_FIELD)
                    .arg(seckill_common::sale_admin::OPERATOR_PAUSED)
                    .arg("ends_at_ms")
                    .query(con)?;
                let ended = ends
                    .and_then(|e| e.parse::<u64>().ok())
                    .is_some_and(|end| seckill_common::now_ms() >= end);
                if total.is_none() || paused.is_some() || operator.is_some() || ended {
                    return Ok(Still::Changed);
                }
            }
            let second = snapshots(con, &keys)?;
            let moved = first
                .iter()
                .zip(&second)
                .any(|(a, b)| a.moved_in != b.moved_in);
            Ok(if empty(&second) && !moved {
                Still::SoldOut
            } else {
                Still::Changed
            })
        })
    })
}

/// One [`transfer::snapshot`] of each of `keys`, in order.
fn snapshots<C: redis::ConnectionLike>(
    con: &mut C,
    keys: &[SaleKeys],
) -> redis::RedisResult<Vec<Snapshot>> {
    keys.iter().map(|b| transfer::snapshot(con, *b)).collect()
}

/// A bucket meta's `total_stock`, pause marks and `ends_at_ms`.
type Marks = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);
