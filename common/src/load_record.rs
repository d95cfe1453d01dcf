//! Owns MySQL's record that a sale was put into Redis (`sales.loaded_at`,
//! migration 7) and the check of which of a loaded sale's buckets lost
//! their keys.
//!
//! Redis can lose a sale's keys before any worker has written a mark for
//! it (`data_loss.rs`): a crash with no worker running, an eviction policy
//! switched on a full Redis. Without a record in MySQL such a sale looks
//! never sold, and its acknowledged purchases would vanish without a word.
//! `sale create` and `sale load` record the load once Redis holds the
//! sale; from then on a sale that is not archived (an archive removes the
//! keys on purpose) and whose stock counter or meta is gone lost them: the
//! watch pauses it and `sale load` refuses to put it back on sale.

use crate::keys::SaleKeys;
use mysql::prelude::Queryable;
use redis::ConnectionLike;

/// Records that sale `sale_id` is in Redis: `sales.loaded_at`, the first
/// load's time (a later load keeps it). Called once the load into Redis has
/// answered: a process that dies in between leaves the sale unrecorded,
/// which the next `sale load` (answered "already live") records.
///
/// Errors: MySQL failures.
pub fn record<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<(), mysql::Error> {
    db.exec_drop(
        "UPDATE sales SET loaded_at = COALESCE(loaded_at, UTC_TIMESTAMP(3)) WHERE id = ?",
        (sale_id,),
    )
}

/// When sale `sale_id` was first loaded into Redis (Unix ms); `None` when
/// MySQL has no such sale, no load recorded (a sale created before
/// migration 7 and not loaded since), or the sale is archived (its keys
/// are gone on purpose).
///
/// Errors: MySQL failures.
pub fn loaded_at_ms<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<Option<u64>, mysql::Error> {
    let at: Option<Option<i64>> = db.exec_first(
        "SELECT CAST(UNIX_TIMESTAMP(loaded_at) * 1000 AS SIGNED) FROM sales
         WHERE id = ? AND archived_at IS NULL",
        (sale_id,),
    )?;
    Ok(at.flatten().map(|ms| ms.max(0) as u64))
}

/// The buckets among the first `buckets` of sale `sale_id` whose stock
/// counter or meta (its `total_stock`) Redis no longer holds, in order: a
/// meta holding only the pause (`paused`, written back by the watch after
/// the meta was lost) counts as gone. Two reads per bucket.
///
/// Errors: Redis failures; a key of the wrong type.
pub fn gone_buckets<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    buckets: u32,
) -> redis::RedisResult<Vec<u32>> {
    let mut gone = Vec::new();
    for b in 0..buckets.max(1) {
        let k = SaleKeys::bucket(sale_id, b);
        let total: Option<String> = redis::cmd("HGET")
            .arg(k.meta())
            .arg("total_stock")
            .query(con)?;
        let stock: Option<String> = redis::cmd("GET").arg(k.stock()).query(con)?;
        if total.is_none() || stock.is_none() {
            gone.push(b);
        }
    }
    Ok(gone)
}
