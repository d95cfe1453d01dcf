//! Owns `seckill-reconciler sale repair ID`: rebuilds a sale's Redis state
//! from MySQL after Redis lost data of it (the pause of
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
//! and writes the same state again. Audited: see [`run`].
//!
//! An ended sale (closed for a minute, so never paused) that lost its keys
//! has the same open `redis_data_loss` finding (`rules/redis_data_loss.rs`)
//! and is rebuilt the same way; an archived sale whose tombstone Redis lost
//! has it written again ([`tombstone`]). `--dry-run` says what the repair
//! would write and changes and records nothing.
//!
//! Steps: this file checks and audits; [`rebuild`] is the effect, one
//! function per step; [`read`] reads the orders and the marks Redis holds.

mod read;
mod rebuild;
mod tombstone;

pub use tombstone::WRITTEN as TOMBSTONE_WRITTEN;

use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::lock::{RunLock, LOCK_WAIT};
use crate::output::outln;
use crate::review::findings::{FindingState, Kind};
use crate::review::{ActionKind, ActionStatus, Review};
use crate::sale_read::fetch_sale;
use redis::Commands;
use seckill_common::data_loss;
use seckill_common::redis_target::Con;

/// `sale repair ID --by NAME [--dry-run]`; returns the exit code: 0
/// repaired (or nothing to repair, or the dry run), 1 refused (paused but
/// no open `redis_data_loss` finding yet: run `run` first; or a worker
/// holds messages of the sale), 2 no review file or no such sale in MySQL.
/// A sale neither paused nor with an open `redis_data_loss` finding (an
/// ended sale that lost its keys has one) has nothing to repair; an
/// archived one gets its tombstone back when Redis lost it.
///
/// Audited like `resolve`: the `repair` action on the sale's
/// `redis_data_loss` finding is written ahead (`settle.rs`); the rebuild,
/// the end of the pause in Redis and the action's mark in the meta hash
/// (`repaired_by`) are one `MULTI`, so an interrupted repair is recorded
/// as done exactly when that `MULTI` ran.
///
/// Errors: Redis, MySQL or SQLite failures (nothing or all of the Redis
/// state was written; run it again).
pub fn run(config: &Config, args: &RepairArgs) -> Result<u8, RunError> {
    let id = args.sale_id;
    let review = Review::open_existing(&config.review_db)?;
    let mut db = connect::mysql(&config.services)?;
    let Some(sale) = fetch_sale(&mut db, id)? else {
        return Err(RunError::NoSuch(format!("no sale {id} in MySQL")));
    };
    let mut redis = connect::redis(&config.services)?;
    if crate::sale_read::is_archived(&mut db, id)? {
        return tombstone::run(&review, &mut redis, &mut db, args);
    }
    let buckets = seckill_common::buckets::all(id, buckets_of(&mut redis, &mut db, id)?);
    let mut paused = data_loss::mysql_state(&mut db, id)?.paused.is_some();
    for k in &buckets {
        paused |= redis.hexists::<_, _, bool>(k.meta(), data_loss::PAUSED_FIELD)?;
    }
    let open = review.open_data_loss(id)?;
    if !paused && open.is_none() {
        outln!("sale {id} is not paused; nothing to repair");
        return Ok(0);
    }
    if !args.dry_run {
        crate::settle::complete_pending(
            &review,
            || connect::redis(&config.services),
            || connect::mysql(&config.services),
        )?;
    }
    let Some(finding) = review
        .list_findings(Some(FindingState::Open), Some(id))?
        .into_iter()
        .find(|f| f.kind == Kind::RedisDataLoss)
    else {
        eprintln!(
            "seckill-reconciler: sale {id} is paused but has no open redis_data_loss finding \
             yet; run `seckill-reconciler run` first (the repair is recorded on that finding)"
        );
        return Ok(EXIT_REFUSED);
    };
    let would = format!("rebuild sale {id}'s Redis state from MySQL and resume it");
    if args.dry_run {
        let what = read::would(&mut redis, &mut db, &sale, &buckets)?;
        outln!("dry run, nothing changed: rebuild sale {id}'s Redis state from MySQL: {what}");
        return Ok(0);
    }
    let lock = RunLock::acquire(connect::redis(&config.services)?, LOCK_WAIT)?;
    let outcome = crate::settle::written_ahead(
        &review,
        &mut redis,
        &finding,
        ActionKind::Repair,
        &args.by,
        args.note.as_deref(),
        &would,
        |con, started| rebuild::rebuild(con, &mut db, &sale, started),
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
                redis.hdel::<_, _, ()>(k.meta(), data_loss::PAUSED_FIELD)?;
            }
        }
    }
    outln!("{}", outcome.text);
    Ok(if outcome.settles() { 0 } else { 1 })
}

/// How many buckets sale `id` has: what the watch knows
/// (`data_loss::bucket_count`: bucket 0's meta, MySQL's marks) or, when
/// more, one above the highest bucket Redis holds (bucket 0's meta, which
/// holds K, may be what was lost before any mark was written).
///
/// Errors: Redis or MySQL failures.
pub(super) fn buckets_of(con: &mut Con, db: &mut mysql::Conn, id: u64) -> Result<u32, RunError> {
    let known = data_loss::bucket_count(con, db, id)?;
    let present = seckill_common::buckets::highest_present(con, id)?.map_or(1, |b| b + 1);
    Ok(known.max(present))
}

/// Arguments of `sale repair`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairArgs {
    /// The sale.
    pub sale_id: u64,
    /// Who asks (`--by`), as for `resolve`.
    pub by: String,
    /// Why (`--note`).
    pub note: Option<String>,
    /// `--dry-run`: print what the repair would write; change and record
    /// nothing.
    pub dry_run: bool,
}
