//! Owns the archive of an ended sale, by hand (`cmd/archive.rs`: `sale
//! archive ID --by NAME`)
//! and `run`'s automatic one `SECKILL_ARCHIVE_AFTER` past the sale's end
//! (actor `reconciler`). Archiving removes the sale's Redis keys but a
//! tombstone (`seckill_common::archive`); MySQL and the review file keep
//! everything that matters.
//!
//! A sale is archived only when ([`refusal`]): it ended at least
//! [`MIN_AGE`] and `SECKILL_RECONCILE_GRACE` ago (so the run saw every flow
//! record old enough to judge); no order of it is `pending_payment` (every
//! order is final: paid, expired, cancelled, or confirmed for a sale
//! without a payment window); no order message of it is still queued or
//! in a processing list (a reservation on its way, which no finding
//! shows); it has no open finding; and a run that did not fail started
//! after that (by hand) or is the run archiving it (`run`). A refusal by
//! hand changes nothing, is logged as a `refused` row and exits 1; `run`
//! skips a sale not ready without a row.
//!
//! Order: MySQL decides (`sales.archived_at`, `archived_by`, set by one
//! guarded `UPDATE ... WHERE archived_at IS NULL`), Redis follows, then the
//! `done` row of the audit log (one per sale: the review store's index
//! `actions_archived_once`). An interruption after the decision is
//! completed by the next `run` or `sale archive` ([`complete_interrupted`]):
//! the Redis step again (idempotent) and the `done` row under the actor
//! MySQL kept. Both hold the run lock, so no run reads a sale half removed.
//!
//! An archived sale is no longer reconciled record by record (its Redis
//! state is gone on purpose); its payments still are (a late payment is a
//! finding). The worker no longer writes a Redis status for it.

use crate::error::RunError;
use crate::sale_read::{sale_state, SaleState};

use crate::review::{ActionStatus, Review};
use mysql::prelude::Queryable;
use seckill_common::archive::{self, Tombstone};
use seckill_common::keys::SaleKeys;
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;
use std::time::Duration;

/// The least time past a sale's end before it may be archived: the
/// workers' data-loss watch reads a sale until a minute after its end
/// (`worker/src/loss_watch.rs`) and would take its removed keys for lost
/// data.
pub const MIN_AGE: Duration = Duration::from_secs(60);

/// The actor of `run`'s automatic archives.
pub const RECONCILER: &str = "reconciler";

/// Removes again the Redis keys of archived sale `id` when they came back
/// (a Redis restored from a snapshot taken before the archive brings all of
/// a sale's keys back, and nothing else would remove them), and writes its
/// tombstone again when Redis lost it (late buyers would hear 404 instead
/// of 403 `sale_ended`), leaving Redis as the archive did; logged, as it
/// is the archive's own decision carried out again. Nothing happens while
/// Redis holds no stock counter of it and its tombstone. Returns whether
/// it wrote anything.
///
/// Errors: MySQL or Redis failures.
pub fn remove_again(redis: &mut Con, db: &mut mysql::Conn, id: u64) -> Result<bool, RunError> {
    let stock: Option<i64> = redis::cmd("GET")
        .arg(SaleKeys::new(id).stock())
        .query(redis)?;
    let Some(s) = sale_state(db, id)? else {
        return Ok(false);
    };
    if s.archived_by.is_none() {
        return Ok(false);
    }
    if stock.is_some() {
        let recorded = seckill_common::buckets::recorded(db, id)?;
        let buckets = archive::remove(redis, id, recorded, &s.tombstone)?;
        log::warn!(
            "sale {id} is archived but Redis held its keys again (restored from an older \
             snapshot?): removed again ({buckets} bucket(s)), its tombstone kept"
        );
        return Ok(true);
    }
    if tombstone_again(redis, db, id)? {
        log::warn!(
            "sale {id} is archived but Redis lost its tombstone: written again (late buyers \
             hear 403 sale_ended)"
        );
        return Ok(true);
    }
    Ok(false)
}

/// Writes archived sale `id`'s tombstone again (from MySQL's row) when
/// Redis holds none (bucket 0's meta lacks `archived_at_ms`): Redis lost
/// it. Returns whether it wrote it; `false` for a sale not archived.
///
/// Errors: Redis or MySQL failures.
pub fn tombstone_again(redis: &mut Con, db: &mut mysql::Conn, id: u64) -> Result<bool, RunError> {
    let Some(s) = sale_state(db, id)? else {
        return Ok(false);
    };
    if s.archived_by.is_none() {
        return Ok(false);
    }
    let kept: bool = redis::cmd("HEXISTS")
        .arg(SaleKeys::new(id).meta())
        .arg(archive::ARCHIVED_FIELD)
        .query(redis)?;
    if kept {
        return Ok(false);
    }
    let recorded = seckill_common::buckets::recorded(db, id)?;
    archive::remove(redis, id, recorded, &s.tombstone)?;
    Ok(true)
}

/// Why sale `s` (`id`) may not be archived at `now_ms`, or `None`;
/// `by_run`: the asking run has just checked it (else a finished run must
/// have started after the end).
///
/// Errors: SQLite failures.
pub fn refusal(
    review: &Review,
    redis: &mut Con,
    id: u64,
    s: &SaleState,
    now_ms: u64,
    grace: Duration,
    by_run: bool,
) -> Result<Option<String>, RunError> {
    let ends = s.tombstone.ends_at_ms;
    let settled = ends + MIN_AGE.max(grace).as_millis() as u64;
    if now_ms < settled {
        return Ok(Some(format!(
            "sale {id} ends {}: it may be archived from {}, a minute (or \
             SECKILL_RECONCILE_GRACE) after its end, not before",
            format_ms(ends),
            format_ms(settled)
        )));
    }
    if s.pending > 0 {
        return Ok(Some(format!(
            "sale {id} has {} order(s) still pending_payment",
            s.pending
        )));
    }
    let moving = seckill_common::archive::messages_on_their_way(redis, id)?;
    if moving > 0 {
        return Ok(Some(format!(
            "sale {id} has {moving} order message(s) still queued or in a processing list: \
             let the workers apply them"
        )));
    }
    let open = review.open_count_of(id)?;
    if open > 0 {
        return Ok(Some(format!(
            "sale {id} has {open} open finding(s): settle them first"
        )));
    }
    if !by_run && !review.run_finished_since(&format_ms(settled))? {
        return Ok(Some(format!(
            "no reconciliation run has checked sale {id} since it settled at {} \
             (its end + the grace): run `seckill-reconciler run` first",
            format_ms(settled)
        )));
    }
    Ok(None)
}

/// Archives sale `id` for `actor` (see the module doc), with the run lock
/// held by the caller; returns the status recorded and a line for the
/// operator. Nothing is recorded for a sale MySQL does not hold.
///
/// Errors: Redis, MySQL or SQLite failures (after the MySQL decision, the
/// next run completes the rest); [`RunError::Refused`] for no such sale.
pub fn archive(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
    id: u64,
    actor: &str,
    grace: Duration,
    by_run: bool,
) -> Result<(ActionStatus, String), RunError> {
    let now = now_ms();
    let at = format_ms(now);
    let Some(s) = sale_state(db, id)? else {
        return Err(RunError::NoSuch(format!("no sale {id} in MySQL")));
    };
    if let Some(by) = &s.archived_by {
        let text = format!(
            "sale {id} was archived at {} by {by}; nothing changed",
            format_ms(s.tombstone.archived_at_ms)
        );
        review.record_archive(&at, actor, id, &text, ActionStatus::NoChange)?;
        return Ok((ActionStatus::NoChange, text));
    }
    if let Some(why) = refusal(review, redis, id, &s, now, grace, by_run)? {
        review.record_archive(&at, actor, id, &why, ActionStatus::Refused)?;
        return Ok((ActionStatus::Refused, why));
    }
    db.exec_drop(
        "UPDATE sales SET archived_at = FROM_UNIXTIME(? / 1000), archived_by = ?
         WHERE id = ? AND archived_at IS NULL",
        (now, actor, id),
    )?;
    if db.affected_rows() == 0 {
        // Another process decided first; it records its own row.
        return archive(review, redis, db, id, actor, grace, by_run);
    }
    let tombstone = Tombstone {
        archived_at_ms: now,
        ..s.tombstone
    };
    let recorded = seckill_common::buckets::recorded(db, id)?;
    let buckets = archive::remove(redis, id, recorded, &tombstone)?;
    let text = format!(
        "archived sale {id}: its Redis keys removed ({buckets} bucket(s)), a tombstone kept"
    );
    review.record_archive(&at, actor, id, &text, ActionStatus::Done)?;
    Ok((ActionStatus::Done, text))
}

/// Completes every archive MySQL decided whose `done` row is missing (an
/// interruption): the Redis step again and the row under the actor MySQL
/// kept. Returns how many. Run with the run lock held.
///
/// Errors: Redis, MySQL or SQLite failures.
pub fn complete_interrupted(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
) -> Result<usize, RunError> {
    let archived: Vec<u64> =
        db.query("SELECT id FROM sales WHERE archived_at IS NOT NULL ORDER BY id")?;
    let mut n = 0;
    for id in archived {
        if review.archive_recorded(id)? {
            continue;
        }
        let Some(s) = sale_state(db, id)? else {
            continue;
        };
        let recorded = seckill_common::buckets::recorded(db, id)?;
        let buckets = archive::remove(redis, id, recorded, &s.tombstone)?;
        let text = format!(
            "archived sale {id}: its Redis keys removed ({buckets} bucket(s)), a tombstone \
             kept (recorded after an interruption)"
        );
        let actor = s.archived_by.as_deref().unwrap_or(RECONCILER);
        if review.record_archive(&format_ms(now_ms()), actor, id, &text, ActionStatus::Done)? {
            log::warn!("{text}");
            n += 1;
        }
    }
    Ok(n)
}

/// `run`'s automatic archive of the sales it just checked (`sales`): those
/// ended at least `after` (and [`MIN_AGE`]) ago that are ready; the others
/// are left for a later run without a row. Returns how many it archived.
///
/// Errors: Redis, MySQL or SQLite failures.
pub fn archive_due(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
    sales: &[u64],
    after: Duration,
    grace: Duration,
) -> Result<usize, RunError> {
    let now = now_ms();
    let mut n = 0;
    for &id in sales {
        let Some(s) = sale_state(db, id)? else {
            continue;
        };
        let due = s.tombstone.ends_at_ms + after.max(MIN_AGE).as_millis() as u64;
        if s.archived_by.is_some()
            || now < due
            || refusal(review, redis, id, &s, now, grace, true)?.is_some()
        {
            continue;
        }
        let (status, text) = archive(review, redis, db, id, RECONCILER, grace, true)?;
        log::info!("{text}");
        n += usize::from(status == ActionStatus::Done);
    }
    Ok(n)
}
