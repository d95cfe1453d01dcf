//! Owns `seckill-reconciler sale repair ID`: rebuilds a sale's Redis state
//! from MySQL after Redis lost data of it (docs/reliability.md §4, the pause in
//! `seckill_common::data_loss`), releases the duplicate reservations made
//! before the pause, and resumes the sale.
//!
//! MySQL is the system of record. For every order: the buyer's mark, the
//! flow record (the order message rebuilt from the row) and the order's
//! status. A flow record Redis holds without an order is kept when it is
//! still on its way (queued; the worker will apply it), and released when
//! its user already holds an order of another reservation (a duplicate made
//! between the loss and the pause): flow record removed, status `failed`,
//! message taken off the queue, its dead letters archived with this action
//! (`dead_letter_archive.rs`, as for a rollback). Stock = total − orders
//! holding a unit − reservations kept in flight; the sequence = the larger
//! of Redis's and MySQL's mark. All Redis writes of a bucket are one
//! `MULTI`. Refused (nothing written, exit 1) while a worker holds messages
//! of the sale in its processing list: run it again when they are settled.
//!
//! A split sale is rebuilt bucket by bucket (`repair_rebuild.rs`: each
//! order in its buyer's home bucket, each bucket's books matched with its
//! peers' transfer records), one `MULTI` per bucket, bucket 0 last.
//! Orders whose unit was released (`expired`, `cancelled`) count back in
//! stock and are written released; `pending_payment` and `paid` keep their
//! status.
//!
//! Idempotent: a second repair finds every order restored and no duplicate,
//! and writes the same state again. Audited: see [`repair`].

use crate::cli::RepairArgs;
use crate::dead_letter_archive::{archive_entries_in, Existing, SettledBy};
use crate::error::RunError;
use crate::lock::{RunLock, LOCK_WAIT};
use crate::output::outln;
use crate::repair_rebuild::{self, BucketRepair, OrderRow};
use crate::review::findings::{FindingState, Kind};
use crate::review::{ActionKind, ActionStatus, PendingAction, Review};
use crate::run_cmd::{mysql_connect, redis_connect};
use crate::sale_cmd::fetch_sale;
use crate::settle::Outcome;
use mysql::prelude::Queryable;
use redis::Commands;
use seckill_common::data_loss;
use seckill_common::keys::{self, SaleKeys};
use seckill_common::order::OrderStatus;
use seckill_common::redis_target::Con;
use seckill_common::sale::Sale;
use seckill_common::Config;

/// `sale repair ID --by NAME`; returns the exit code: 0 repaired (or
/// nothing to repair), 1 refused (no open `redis_data_loss` finding yet:
/// run `run` first; or a worker holds messages of the sale), 2 no such sale
/// in MySQL.
///
/// Audited like `resolve`: the `repair` action on the sale's
/// `redis_data_loss` finding is written ahead (`settle.rs`); the rebuild,
/// the end of the pause in Redis and the action's mark in the meta hash
/// (`repaired_by`) are one `MULTI`, so an interrupted repair is recorded
/// as done exactly when that `MULTI` ran.
///
/// Errors: Redis, MySQL or SQLite failures (nothing or all of the Redis
/// state was written; run it again).
pub fn repair(config: &Config, args: &RepairArgs) -> Result<u8, RunError> {
    let id = args.sale_id;
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let Some(sale) = fetch_sale(&mut db, id).map_err(|e| RunError::Refused(e.to_string()))? else {
        eprintln!("seckill-reconciler: no sale {id} in MySQL");
        return Ok(2);
    };
    let mut redis = redis_connect(config)?;
    let buckets = seckill_common::buckets::all(id, buckets_of(&mut redis, &mut db, id)?);
    let mut paused_in_redis = false;
    for k in &buckets {
        paused_in_redis |= redis.hexists::<_, _, bool>(k.meta(), "paused")?;
    }
    if data_loss::mysql_state(&mut db, id)?.paused.is_none() && !paused_in_redis {
        outln!("sale {id} is not paused; nothing to repair");
        return Ok(0);
    }
    let review = Review::open(&config.review_db)?;
    crate::settle::complete_pending(&review, || redis_connect(config), || mysql_connect(config))?;
    let Some(finding) = review
        .list_findings(Some(FindingState::Open), Some(id))?
        .into_iter()
        .find(|f| f.kind == Kind::RedisDataLoss)
    else {
        eprintln!(
            "seckill-reconciler: sale {id} is paused but has no open redis_data_loss finding \
             yet; run `seckill-reconciler run` first (the repair is recorded on that finding)"
        );
        return Ok(1);
    };
    let lock = RunLock::acquire(redis_connect(config)?, LOCK_WAIT)?;
    let outcome = crate::settle::written_ahead(
        &review,
        &mut redis,
        &finding,
        ActionKind::Repair,
        &args.by,
        args.note.as_deref(),
        &format!("rebuild sale {id}'s Redis state from MySQL and resume it"),
        |con, started| rebuild(con, &mut db, &sale, started),
    );
    let released = lock.release();
    let outcome = outcome?;
    released?;
    if outcome.status == ActionStatus::Done {
        // A worker's watch that read the pause just before it ended may
        // set it again in Redis; take such a late pause back.
        std::thread::sleep(data_loss::WATCH_EVERY * 2);
        if data_loss::mysql_state(&mut db, id)?.paused.is_none() {
            for k in &buckets {
                redis.hdel::<_, _, ()>(k.meta(), "paused")?;
            }
        }
    }
    outln!("{}", outcome.text);
    Ok(if outcome.settles() { 0 } else { 1 })
}

/// The effect: reads MySQL and Redis, refuses while a worker holds
/// messages of the sale (any bucket), resumes the sale in MySQL with the
/// repaired marks, then writes each bucket's rebuilt Redis state and the
/// end of its pause in one `MULTI` per bucket (a bucket is one slot),
/// buckets K−1 .. 1 first and bucket 0, with `mark`, last.
fn rebuild(
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
    let workers: Vec<String> = con.smembers(keys::WORKERS)?;
    let mut held = 0usize;
    for b in &bucket_keys {
        for w in &workers {
            held += con.llen::<_, usize>(b.processing(w))?;
        }
    }
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
    let mut done: Vec<BucketRepair> = Vec::with_capacity(bucket_keys.len());
    let mut shares: Vec<u64> = Vec::with_capacity(bucket_keys.len());
    for (b, bk) in bucket_keys.iter().enumerate() {
        let homed: Vec<&OrderRow> = orders
            .iter()
            .filter(|o| seckill_common::buckets::home_bucket(&o.user, k) as usize == b)
            .collect();
        let now = repair_rebuild::read_now(con, bk)?;
        let out = repair_rebuild::restore(&mut pipes[b], bk, &homed, &now, rebuy);
        shares.push(if k > 1 {
            seckill_common::buckets::share(sale.total_stock, k, b as u32)
        } else {
            sale.total_stock
        });
        done.push(out);
    }
    // A bucket whose books give it fewer units than its orders hold: units
    // were moved out of it while its Redis was behind (after a failover,
    // before the pause: a failover test can end with 590 orders against
    // 542 units). The sale's units are conserved, so move the difference from
    // buckets with units to spare, recorded on both sides as any transfer.
    repair_rebuild::cover_deficits(&mut books, &mut pipes, &bucket_keys, &shares, &done, &mark);
    for (b, bk) in bucket_keys.iter().enumerate() {
        let out = &mut done[b];
        let share = shares[b];
        let moved_in: u64 = books[b].inn.values().map(|r| r.units).sum();
        let moved_out: u64 = books[b].out.values().map(|r| r.units).sum();
        out.total = share as i64 + moved_in as i64 - moved_out as i64;
        out.stock = out.total - (out.orders + out.in_flight) as i64;
        if out.stock < 0 {
            return Ok(Outcome::refused(format!(
                "bucket {b} of sale {id} holds {} orders and {} reservations in flight, more \
                 than its {} units (share {share} + {moved_in} in − {moved_out} out), and the \
                 other buckets have none to spare; nothing changed (docs/OPERATIONS.md, \
                 'sale repair')",
                out.orders, out.in_flight, out.total
            )));
        }
        let (redis_seq, redis_ck, redis_moved_in) = redis_marks(con, bk)?;
        // The sequence (total − stock + releases) must not go back behind
        // either mark, nor below the units ever reserved here: `releases`
        // makes up the difference.
        let (seq_high, ck_high) = all_marks[b];
        let taken = (out.orders + out.in_flight) as u64;
        let target = redis_seq
            .max(seq_high)
            .max(taken + (out.released_orders + out.duplicates.len()) as u64);
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
            fields.push((REPAIRED_BY, mark.clone()));
        }
        if let Some(r) = &operator_pause {
            fields.push((seckill_common::sale_admin::OPERATOR_PAUSED, r.clone()));
        }
        pipes[b].hset_multiple(bk.meta(), &fields).ignore();
        pipes[b].hdel(bk.meta(), "paused").ignore();
        pipes[b].set(bk.stock(), out.stock).ignore();
    }
    // MySQL first: a Redis that still says paused keeps the sale paused
    // (the watch leaves a pause only Redis holds alone) until the MULTIs.
    let split: Vec<(u32, u64, u64)> = done
        .iter()
        .enumerate()
        .map(|(b, o)| (b as u32, o.seq, o.checkpoint))
        .collect();
    seckill_common::bucket_marks::set_split(db, id, &split)?;
    data_loss::resume_mysql(db, id, done[0].seq, done[0].checkpoint).map_err(watch_error)?;
    for p in pipes.iter().rev() {
        p.query::<()>(con)?;
    }
    // Apart from the MULTIs (another cluster slot than the sale's keys);
    // a repeat of the repair adds it again.
    con.sadd::<_, _, ()>(keys::SALES, id)?;
    // The released duplicates' dead letters go to the archive with this
    // action, as for a rollback (each moved atomically; a repeat moves the
    // rest).
    let at = seckill_common::timefmt::format_ms(seckill_common::now_ms());
    let by = SettledBy {
        action: ActionKind::Repair.as_str(),
        actor: &started.actor,
        finding_id: started.finding_id,
        action_id: started.id,
        at: &at,
    };
    let mut duplicates: Vec<String> = Vec::new();
    for (bk, out) in bucket_keys.iter().zip(&done) {
        for rid in &out.duplicates {
            archive_entries_in(con, *bk, rid, &Existing::All, &by)?;
        }
        duplicates.extend(out.duplicates.iter().cloned());
    }
    duplicates.sort();
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
    Ok(Outcome::done(format!(
        "repaired sale {id}: {} orders restored, {} duplicate reservations released{listed}, \
         {} released orders written released, {} reservations in flight kept, stock {}, \
         sequence {}{per_bucket}; sale resumed",
        sum(|o| o.orders),
        duplicates.len(),
        sum(|o| o.released_orders),
        sum(|o| o.in_flight),
        done.iter().map(|o| o.stock).sum::<i64>(),
        done.iter().map(|o| o.seq).sum::<u64>(),
    )))
}

/// How many buckets sale `id` has: what the watch knows
/// (`data_loss::bucket_count`: bucket 0's meta, MySQL's marks) or, when
/// more, one above the highest bucket Redis holds (bucket 0's meta, which
/// holds K, may be what was lost before any mark was written).
///
/// Errors: Redis or MySQL failures.
fn buckets_of(con: &mut Con, db: &mut mysql::Conn, id: u64) -> Result<u32, RunError> {
    let known = data_loss::bucket_count(con, db, id).map_err(watch_error)?;
    let present = seckill_common::buckets::highest_present(con, id)?.map_or(1, |b| b + 1);
    Ok(known.max(present))
}

/// Every order of sale `id`, as the repair reads them.
///
/// Errors: MySQL failures.
fn read_orders(db: &mut mysql::Conn, id: u64) -> Result<Vec<OrderRow>, RunError> {
    // reservation id, user, reserved at ms, status, pay by ms
    type Row = (String, String, Option<i64>, String, Option<i64>);
    let rows: Vec<Row> = db.exec(
        "SELECT reservation_id, user_id, CAST(UNIX_TIMESTAMP(reserved_at) * 1000 AS SIGNED),
                status, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED)
         FROM orders WHERE sale_id = ?",
        (id,),
    )?;
    Ok(rows
        .into_iter()
        .map(|(rid, user, at, status, pay_by)| OrderRow {
            rid,
            user,
            reserved_at_ms: at.unwrap_or(0).max(0) as u64,
            // An older row's `created` holds its unit, as `confirmed` does.
            status: status.parse().unwrap_or(OrderStatus::Confirmed),
            pay_by_ms: pay_by.map(|p| p.max(0) as u64),
        })
        .collect())
}

/// A bucket's reservation sequence, checkpoint and `moved_in` as Redis
/// holds them now, read leniently: a field that is not a number (the
/// damage being repaired, perhaps) counts as 0, and is overwritten by the
/// repair.
///
/// Errors: Redis failures.
fn redis_marks(con: &mut Con, k: &SaleKeys) -> redis::RedisResult<(u64, Option<u64>, u64)> {
    let (total, releases_now, ck, moved_in): (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) = redis::cmd("HMGET")
        .arg(k.meta())
        .arg("total_stock")
        .arg("releases")
        .arg("checkpoint")
        .arg("moved_in")
        .query(con)?;
    let stock_now: Option<String> = con.get(k.stock())?;
    let num = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<i64>().ok());
    let redis_seq = seckill_common::reservation::sequence(
        num(&total).unwrap_or(0).max(0) as u64,
        num(&stock_now).unwrap_or(0),
        num(&releases_now).unwrap_or(0).max(0) as u64,
    );
    let redis_ck = num(&ck).map(|c| c.max(0) as u64);
    Ok((
        redis_seq,
        redis_ck,
        num(&moved_in).unwrap_or(0).max(0) as u64,
    ))
}

/// The meta field that holds the mark of the repair that last rebuilt the
/// sale (how an interrupted repair is known to have happened).
pub const REPAIRED_BY: &str = "repaired_by";

fn watch_error(e: data_loss::WatchError) -> RunError {
    match e {
        data_loss::WatchError::Redis(e) => RunError::Redis(e),
        data_loss::WatchError::Mysql(e) => RunError::Mysql(e),
        other => RunError::Refused(other.to_string()),
    }
}
