//! Owns the effect of `sale repair`, one function per step: refuse while
//! a worker holds messages of the sale ([`held_by_workers`]), restore each
//! bucket's orders and reservations ([`restore_buckets`]), give each bucket
//! its units and marks ([`settle_bucket`]), commit (MySQL first, then one
//! `MULTI` per bucket, bucket 0 last: [`commit`]), archive the released
//! duplicates' dead letters ([`archive_duplicates`]), and say what was done
//! ([`summary`]).

use super::buckets_of;
use super::read::{read_orders, redis_marks};
use crate::dead_letter_archive::{archive_entries_in, Existing, SettledBy};
use crate::error::RunError;
use crate::repair_rebuild::{self, Books, BucketRepair, OrderRow, REPAIRED_BY};
use crate::review::{ActionKind, PendingAction};
use crate::settle::Outcome;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::data_loss;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::redis_target::Con;
use seckill_common::sale::Sale;

/// The effect: reads MySQL and Redis, refuses while a worker holds
/// messages of the sale (any bucket), resumes the sale in MySQL with the
/// repaired marks, then writes each bucket's rebuilt Redis state and the
/// end of its pause in one `MULTI` per bucket (a bucket is one slot),
/// buckets K−1 .. 1 first and bucket 0, with `mark`, last.
///
/// Errors: Redis or MySQL failures.
pub fn rebuild(
    con: &mut Con,
    db: &mut mysql::Conn,
    sale: &Sale,
    started: &PendingAction,
) -> Result<Outcome, RunError> {
    let mark = started.mark();
    let id = sale.id;
    let k = buckets_of(con, db, id)?;
    // An operator's pause outlives the repair (its own meta field, which a
    // lost meta hash lost too): MySQL holds it.
    let operator_pause =
        seckill_common::sale_admin::settings(db, id)?.and_then(|s| s.paused_reason);
    let bucket_keys = seckill_common::buckets::all(id, k);
    let held = held_by_workers(con, &bucket_keys)?;
    if held > 0 {
        return Ok(Outcome::refused(format!(
            "workers hold {held} messages of sale {id} in their processing lists; nothing \
             changed, run the repair again in a few seconds"
        )));
    }
    let orders = read_orders(db, id)?;
    let rebuy: bool = db
        .exec_first::<bool, _, _>("SELECT rebuy_after_release FROM sales WHERE id = ?", (id,))?
        .unwrap_or(false);
    let limits = seckill_common::sale::Limits::read(db, id)?;
    let marks = data_loss::mysql_state(db, id)?;
    let mut all_marks = vec![(marks.seq_high, marks.checkpoint_high)];
    all_marks.extend(
        seckill_common::bucket_marks::read_split(db, id, k)?
            .into_iter()
            .map(|m| (m.seq_high, m.checkpoint_high)),
    );
    let mut pipes: Vec<redis::Pipeline> = bucket_keys
        .iter()
        .map(|_| {
            let mut p = redis::pipe();
            p.atomic();
            p
        })
        .collect();
    let mut books = repair_rebuild::read_books(con, &bucket_keys)?;
    repair_rebuild::match_books(&mut books, &mut pipes, &bucket_keys);
    let (mut done, shares) = restore_buckets(
        con,
        sale,
        k,
        &bucket_keys,
        &orders,
        &mut pipes,
        (rebuy, limits),
    )?;
    // A bucket whose books give it fewer units than its orders hold: units
    // were moved out of it while its Redis was behind (after a failover,
    // before the pause: the hostile CI run saw 590 orders against 542
    // units). The sale's units are conserved, so move the difference from
    // buckets with units to spare, recorded on both sides as any transfer.
    repair_rebuild::cover_deficits(&mut books, &mut pipes, &bucket_keys, &shares, &done, &mark);
    for (b, bk) in bucket_keys.iter().enumerate() {
        let bucket = Bucket {
            b,
            keys: bk,
            k,
            share: shares[b],
            books: &books[b],
            marks: all_marks[b],
        };
        let extra = Extra {
            mark: &mark,
            operator_pause: operator_pause.as_deref(),
            limits,
        };
        if let Some(refused) =
            settle_bucket(con, sale, &bucket, &extra, &mut done[b], &mut pipes[b])?
        {
            return Ok(refused);
        }
    }
    commit(con, db, id, &pipes, &done)?;
    let duplicates = archive_duplicates(con, &bucket_keys, &done, started)?;
    Ok(Outcome::done(summary(id, k, &done, &duplicates)))
}

/// Messages of the sale (in any of `bucket_keys`) in the workers'
/// processing lists.
///
/// Errors: Redis failures.
fn held_by_workers(con: &mut Con, bucket_keys: &[SaleKeys]) -> Result<usize, RunError> {
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let mut held = 0usize;
    for b in bucket_keys {
        for w in &workers {
            held += con.llen::<_, usize>(b.processing(w))?;
        }
    }
    Ok(held)
}

/// Restores each bucket's orders (each in its buyer's home bucket) into
/// its `MULTI`; returns what each bucket holds and its share of the units.
///
/// Errors: Redis failures.
fn restore_buckets(
    con: &mut Con,
    sale: &Sale,
    k: u32,
    bucket_keys: &[SaleKeys],
    orders: &[OrderRow],
    pipes: &mut [redis::Pipeline],
    (rebuy, limits): (bool, seckill_common::sale::Limits),
) -> Result<(Vec<BucketRepair>, Vec<u64>), RunError> {
    let mut done: Vec<BucketRepair> = Vec::with_capacity(bucket_keys.len());
    let mut shares: Vec<u64> = Vec::with_capacity(bucket_keys.len());
    for (b, bk) in bucket_keys.iter().enumerate() {
        let homed: Vec<&OrderRow> = orders
            .iter()
            .filter(|o| seckill_common::buckets::home_bucket(&o.user, k) as usize == b)
            .collect();
        let now = repair_rebuild::read_now(con, bk)?;
        let out = match limits.max_per_buyer {
            1 => repair_rebuild::restore(&mut pipes[b], bk, &homed, &now, rebuy),
            l => repair_rebuild::restore_multi(&mut pipes[b], bk, &homed, &now, (rebuy, l)),
        };
        shares.push(if k > 1 {
            seckill_common::buckets::share(sale.total_stock, k, b as u32)
        } else {
            sale.total_stock
        });
        done.push(out);
    }
    Ok((done, shares))
}

/// One bucket as [`settle_bucket`] reads it.
struct Bucket<'a> {
    /// Its number.
    b: usize,
    /// Its keys.
    keys: &'a SaleKeys,
    /// The sale's bucket count.
    k: u32,
    /// Its share of the sale's units.
    share: u64,
    /// Its transfer books, matched with its peers'.
    books: &'a Books,
    /// MySQL's reservation sequence and checkpoint marks of it.
    marks: (u64, u64),
}

/// What bucket 0 and every bucket carry besides their figures.
struct Extra<'a> {
    /// The repair's mark (bucket 0's `repaired_by`).
    mark: &'a str,
    /// An operator's pause MySQL holds, kept in Redis.
    operator_pause: Option<&'a str>,
    /// The sale's limits on units (in the meta when `L` is above 1).
    limits: seckill_common::sale::Limits,
}

/// Gives bucket `bucket` its units, stock, sequence and checkpoint, and
/// adds its meta hash, the end of its pause and its stock to its `MULTI`;
/// `Some(refused)` when its orders and reservations in flight need more
/// units than it has and no bucket has any to spare (nothing is written).
///
/// Errors: Redis failures.
fn settle_bucket(
    con: &mut Con,
    sale: &Sale,
    bucket: &Bucket<'_>,
    extra: &Extra<'_>,
    out: &mut BucketRepair,
    pipe: &mut redis::Pipeline,
) -> Result<Option<Outcome>, RunError> {
    let Bucket {
        b,
        keys: bk,
        k,
        share,
        books,
        marks: (seq_high, ck_high),
    } = *bucket;
    let id = sale.id;
    let moved_in: u64 = books.inn.values().map(|r| r.units).sum();
    let moved_out: u64 = books.out.values().map(|r| r.units).sum();
    out.total = share as i64 + moved_in as i64 - moved_out as i64;
    out.stock = out.total - out.held_units as i64;
    if out.stock < 0 {
        return Ok(Some(Outcome::refused(format!(
            "bucket {b} of sale {id} holds {} orders and {} reservations in flight, more \
             than its {} units (share {share} + {moved_in} in − {moved_out} out), and the \
             other buckets have none to spare; nothing changed (docs/OPERATIONS.md, \
             'sale repair')",
            out.orders, out.in_flight, out.total
        ))));
    }
    let (redis_seq, redis_ck, redis_moved_in) = redis_marks(con, bk)?;
    // The sequence (total − stock + releases) must not go back behind
    // either mark, nor below the units ever reserved here: `releases`
    // makes up the difference.
    let taken = out.held_units;
    let target = redis_seq.max(seq_high).max(taken + out.gone_units);
    let releases = target.saturating_sub(taken);
    out.seq = seckill_common::reservation::sequence(out.total as u64, out.stock, releases);
    out.checkpoint = redis_ck.unwrap_or(0).max(ck_high);
    let mut fields = vec![
        ("total_stock", out.total.to_string()),
        ("starts_at_ms", sale.starts_at_ms.to_string()),
        ("ends_at_ms", sale.ends_at_ms.to_string()),
        ("releases", releases.to_string()),
        ("checkpoint", out.checkpoint.to_string()),
    ];
    if k > 1 {
        fields.push(("share", share.to_string()));
        fields.push(("moved_in", redis_moved_in.max(moved_in).to_string()));
        if b == 0 {
            fields.push((seckill_common::buckets::BUCKETS_FIELD, k.to_string()));
        }
    }
    if b == 0 {
        fields.push((REPAIRED_BY, extra.mark.to_string()));
    }
    if extra.limits.max_per_buyer > 1 {
        use seckill_common::allowance::{MAX_PER_BUYER_FIELD, MAX_PER_PURCHASE_FIELD};
        fields.push((MAX_PER_BUYER_FIELD, extra.limits.max_per_buyer.to_string()));
        fields.push((
            MAX_PER_PURCHASE_FIELD,
            extra.limits.max_per_purchase.to_string(),
        ));
    }
    if let Some(r) = extra.operator_pause {
        fields.push((seckill_common::sale_admin::OPERATOR_PAUSED, r.to_string()));
    }
    pipe.hset_multiple(bk.meta(), &fields).ignore();
    pipe.hdel(bk.meta(), data_loss::PAUSED_FIELD).ignore();
    pipe.set(bk.stock(), out.stock).ignore();
    Ok(None)
}

/// MySQL first (each bucket's marks, the end of the pause): a Redis that
/// still says paused keeps the sale paused (the watch leaves a pause only
/// Redis holds alone) until the `MULTI`s, run buckets K−1 .. 1 then 0.
///
/// Errors: Redis or MySQL failures.
fn commit(
    con: &mut Con,
    db: &mut mysql::Conn,
    id: u64,
    pipes: &[redis::Pipeline],
    done: &[BucketRepair],
) -> Result<(), RunError> {
    let split: Vec<(u32, u64, u64)> = done
        .iter()
        .enumerate()
        .map(|(b, o)| (b as u32, o.seq, o.checkpoint))
        .collect();
    seckill_common::bucket_marks::set_split(db, id, &split)?;
    data_loss::resume_mysql(db, id, done[0].seq, done[0].checkpoint)?;
    for p in pipes.iter().rev() {
        p.query::<()>(con)?;
    }
    // Apart from the MULTIs (another cluster slot than the sale's keys);
    // a repeat of the repair adds it again.
    con.sadd::<_, _, ()>(keys::SALES, id)?;
    Ok(())
}

/// Moves the released duplicates' dead letters to the archive with this
/// action, as for a rollback (each moved atomically; a repeat moves the
/// rest); returns the duplicates' reservation ids, sorted.
///
/// Errors: Redis failures.
fn archive_duplicates(
    con: &mut Con,
    bucket_keys: &[SaleKeys],
    done: &[BucketRepair],
    started: &PendingAction,
) -> Result<Vec<String>, RunError> {
    let at = seckill_common::timefmt::format_ms(seckill_common::now_ms());
    let by = SettledBy {
        action: ActionKind::Repair.as_str(),
        actor: &started.actor,
        finding_id: started.finding_id,
        action_id: started.id,
        at: &at,
    };
    let mut duplicates: Vec<String> = Vec::new();
    for (bk, out) in bucket_keys.iter().zip(done) {
        for rid in &out.duplicates {
            archive_entries_in(con, *bk, rid, &Existing::All, &by)?;
        }
        duplicates.extend(out.duplicates.iter().cloned());
    }
    duplicates.sort();
    Ok(duplicates)
}

/// The repair's audit text: what was restored and released, per bucket
/// for a split sale.
fn summary(id: u64, k: u32, done: &[BucketRepair], duplicates: &[String]) -> String {
    let listed = if duplicates.is_empty() {
        String::new()
    } else {
        format!(" ({})", duplicates.join(", "))
    };
    let sum = |f: fn(&BucketRepair) -> usize| done.iter().map(f).sum::<usize>();
    let per_bucket = if k > 1 {
        let each: Vec<String> = done
            .iter()
            .enumerate()
            .map(|(b, o)| format!("bucket {b}: {} orders, stock {}", o.orders, o.stock))
            .collect();
        format!(" [{}]", each.join("; "))
    } else {
        String::new()
    };
    format!(
        "repaired sale {id}: {} orders restored, {} duplicate reservations released{listed}, \
         {} released orders written released, {} reservations in flight kept, stock {}, \
         sequence {}{per_bucket}; sale resumed",
        sum(|o| o.orders),
        duplicates.len(),
        sum(|o| o.released_orders),
        sum(|o| o.in_flight),
        done.iter().map(|o| o.stock).sum::<i64>(),
        done.iter().map(|o| o.seq).sum::<u64>(),
    )
}
