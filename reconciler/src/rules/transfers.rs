//! Owns the transfer rule of a sale split over buckets (`stock_mismatch`
//! findings whose subject names the broken equation, as for the totals):
//! - `transfer_incomplete:TID`: a transfer stopped between its two steps
//!   (`seckill_common::transfer`) at least [`IN_FLIGHT_MS`] ago (a younger
//!   one is its mover's to finish); completed here, exactly once (step 2 is
//!   idempotent by transfer id), finding `auto_fixed`;
//! - `bucket_books:bB`: bucket B's `share + units in − units out ≠
//!   total_stock`;
//! - `transfer_unmatched:TID`: a transfer recorded on one side only (not in
//!   flight), or with different units on the two sides;
//! - `bucket_stock:bB`: bucket B's stock + reservations ≠ its `total_stock`
//!   (read at one instant: a reservation, a release back to the bucket and
//!   each transfer step keep it in one script), so a unit released to the
//!   wrong bucket, or twice, is found where it happened; the sale-wide sum
//!   is `stock_mismatch`'s `redis_stock`. In a sale of several units per
//!   buyer the reservations are the flow records' units
//!   (`redis_read::bucket_units`), and a bucket whose units kept moving
//!   during the read is judged by the next run.
//!
//! Runs before the sale's scan, so the totals it reads find no transfer
//! open that this run could have completed.

use crate::bucket_read::{self, BucketBooks};
use crate::error::RunError;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::transfer::{complete_open, Record};
use serde_json::json;
use std::collections::HashSet;

/// A transfer whose source time is this close to a read (ms) may still be
/// on its way; it is judged by the next run.
pub const IN_FLIGHT_MS: u64 = 1000;

/// Completes the open transfers of sale `sale_id` (K = `buckets` > 1),
/// then checks every bucket's books and every transfer's two sides.
///
/// Errors: Redis failures (the completions before stand).
pub fn observe(redis: &mut Con, sale_id: u64, buckets: u32) -> Result<Vec<Observation>, RunError> {
    let mut out = Vec::new();
    for c in complete_open(redis, sale_id, buckets, IN_FLIGHT_MS)? {
        let r = c.rec;
        log::info!(
            "sale {sale_id}: transfer {} of {} units from bucket {} to {} was half done: completed",
            c.tid,
            r.units,
            c.from,
            r.peer
        );
        let mut o = obs(
            Kind::StockMismatch,
            sale_id,
            format!("transfer_incomplete:{}", c.tid),
            json!({"rule": "every transfer out is taken in once", "transfer_id": c.tid,
                   "from_bucket": c.from, "to_bucket": r.peer, "units": r.units,
                   "at_ms": r.at_ms}),
        );
        o.fixed = Some(if c.took_in {
            format!(
                "took the {} units in at bucket {} (step 2) and closed the transfer",
                r.units, r.peer
            )
        } else {
            "step 2 had been done; closed the transfer's open record".to_string()
        });
        out.push(o);
    }
    let keys = seckill_common::buckets::all(sale_id, buckets);
    let units = crate::redis_read::sells_units(redis, &keys[0])?;
    let books = keys
        .iter()
        .map(|k| bucket_read::books(redis, *k, units))
        .collect::<redis::RedisResult<Vec<BucketBooks>>>()?;
    let mut open = HashSet::new();
    for k in &keys {
        open.extend(bucket_read::open_ids(redis, *k)?);
    }
    let mut taken_later: Vec<HashSet<String>> = Vec::with_capacity(keys.len());
    for k in &keys {
        taken_later.push(bucket_read::taken_ids(redis, *k)?.into_iter().collect());
    }
    for (b, bk) in books.iter().enumerate() {
        out.extend(bucket_books(sale_id, b as u32, bk));
        out.extend(bucket_stock(sale_id, b as u32, bk));
        for (tid, r) in &bk.out {
            let arrived = taken_later
                .get(r.peer as usize)
                .is_some_and(|t| t.contains(tid));
            if !arrived && !open.contains(tid) {
                out.push(unmatched(sale_id, tid, "out", b as u32, r));
            }
        }
        for (tid, r) in &bk.taken {
            let Some(src) = books.get(r.peer as usize) else {
                out.push(unmatched(sale_id, tid, "in", b as u32, r));
                continue;
            };
            match src.out.get(tid) {
                Some(o) if o.units == r.units && o.peer == b as u32 => {}
                Some(_) => out.push(unmatched(sale_id, tid, "in", b as u32, r)),
                None if r.at_ms + IN_FLIGHT_MS >= src.now_ms => {}
                None => out.push(unmatched(sale_id, tid, "in", b as u32, r)),
            }
        }
        for (tid, raw) in &bk.malformed {
            out.push(obs(
                Kind::StockMismatch,
                sale_id,
                format!("transfer_unmatched:{tid}"),
                json!({"rule": "transfer records parse", "bucket": b, "record": raw}),
            ));
        }
    }
    Ok(out)
}

/// The `bucket_books` observation of bucket `b`, if its books do not balance.
fn bucket_books(sale_id: u64, b: u32, bk: &BucketBooks) -> Option<Observation> {
    let given: u64 = bk.out.values().map(|r| r.units).sum();
    let taken: u64 = bk.taken.values().map(|r| r.units).sum();
    let (Some(share), Some(total)) = (bk.share, bk.total_stock) else {
        return Some(obs(
            Kind::StockMismatch,
            sale_id,
            format!("bucket_books:b{b}"),
            json!({"rule": "every bucket is loaded", "bucket": b,
                   "key": SaleKeys::bucket(sale_id, b).meta(),
                   "share": bk.share, "total_stock": bk.total_stock}),
        ));
    };
    if share + taken as i64 - given as i64 == total {
        return None;
    }
    Some(obs(
        Kind::StockMismatch,
        sale_id,
        format!("bucket_books:b{b}"),
        json!({"rule": "share + units in - units out = total_stock", "bucket": b,
               "share": share, "units_in": taken, "units_out": given, "total_stock": total}),
    ))
}

/// The `bucket_stock` observation of bucket `b`, if its stock and
/// reservations do not add up to its `total_stock` (a bucket not loaded is
/// `bucket_books`'s).
fn bucket_stock(sale_id: u64, b: u32, bk: &BucketBooks) -> Option<Observation> {
    let (stock, reservations, total) = match bk.units {
        None => (bk.stock, bk.reservations, bk.total_stock),
        // Units kept moving during the read: judged by the next run.
        Some(u) if u.unsettled => return None,
        Some(u) => (u.stock, u.units, u.total_stock),
    };
    let (Some(stock), Some(total)) = (stock, total) else {
        return None;
    };
    if stock + reservations == total {
        return None;
    }
    Some(obs(
        Kind::StockMismatch,
        sale_id,
        format!("bucket_stock:b{b}"),
        json!({"rule": "a bucket's stock + reservations = its total_stock", "bucket": b,
               "stock": stock, "reservations": reservations, "released": bk.released,
               "total_stock": total}),
    ))
}

fn unmatched(sale_id: u64, tid: &str, side: &str, bucket: u32, r: &Record) -> Observation {
    obs(
        Kind::StockMismatch,
        sale_id,
        format!("transfer_unmatched:{tid}"),
        json!({"rule": "every transfer appears once on each side, with the same units",
               "transfer_id": tid, "seen_on": side, "bucket": bucket, "other_bucket": r.peer,
               "units": r.units, "at_ms": r.at_ms}),
    )
}
