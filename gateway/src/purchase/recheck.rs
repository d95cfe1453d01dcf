//! Owns the public recheck of a sale remembered sold out: whether it still
//! is, read from Redis with no buyer (its reservation sequence and pause
//! marks), so that the request that happens to make the recheck is
//! answered a public fact whatever its token, and no signature is checked
//! to learn it.

use crate::redis::link::{LinkPool, Unavailable};
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::sequence;

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
