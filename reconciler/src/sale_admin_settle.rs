//! Owns the write-ahead audit of an operator's change to a sale (`sale
//! pause | resume | end | extend | add-stock`, `cmd/sale_admin.rs`) and the
//! completion of a change a killed command left without its completion
//! row. The change itself (MySQL decides, Redis follows) is
//! `seckill_common::sale_admin`.
//!
//! Write-ahead, as `settle.rs` does for a finding: the `started` row (who,
//! what, which sale) is committed first; then, holding the review file's
//! write lock, MySQL's decision (keyed by the started row,
//! `PendingSaleAction::key`), Redis's step in every bucket and the `done`
//! row.
//!
//! A `started` row without completion is completed by the next of these
//! commands or `run` (one of `sale repair` of an archived sale too: its
//! tombstone written again, which is repeatable), before they act, under the same write lock (so no
//! command is then between its lock and its commit): MySQL's
//! `sale_changes` row of the action says whether the change was decided.
//! Decided: Redis's step is repeated (it follows MySQL's row, and an
//! add-stock's units go in once by the action's mark in each bucket) and
//! the row is `done` under the original actor. Not decided: `failed`,
//! nothing changed. A command still between its started row and its lock
//! finds its row completed and stops without acting.

use crate::error::RunError;
use crate::review::sale_actions::{action_key, PendingSaleAction};
use crate::review::{ActionKind, ActionStatus, Review};
use crate::sale_admin_cli::SaleAdminArgs;
use crate::settle::Outcome;
use seckill_common::keys::SaleKeys;
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::sale_admin::{self, Added, Change};
use seckill_common::timefmt::format_ms;

/// Runs `change` written ahead (see the module doc); returns the outcome
/// as recorded.
#[allow(clippy::too_many_arguments)] // the action's who, what and where
pub fn written_ahead(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
    a: &SaleAdminArgs,
    action: ActionKind,
    buckets: u32,
    change: &Change,
    would: &str,
) -> Result<Outcome, RunError> {
    let at = format_ms(now_ms());
    let intent = format!("started: {would}");
    let id = review.record_sale_action(
        &at,
        &a.by,
        a.sale_id,
        action,
        &intent,
        ActionStatus::Started,
        None,
    )?;
    let key = action_key(id, &at);
    review.immediate(|| -> Result<Outcome, RunError> {
        if review.is_completed(id)? {
            return Err(RunError::Refused(format!(
                "action {id} was completed by another process as interrupted before its \
                 effect; nothing done: run the command again"
            )));
        }
        sale_admin::decide(db, a.sale_id, &key, &a.by, change, would)?;
        let text = follow(redis, db, a.sale_id, buckets, &key)?;
        let o = Outcome::done(format!("{would}; {text}"));
        let now = format_ms(now_ms());
        review.record_sale_action(&now, &a.by, a.sale_id, action, &o.text, o.status, Some(id))?;
        Ok(o)
    })
}

/// Redis's step of action `key` on sale `sale_id`: its window end and
/// operator pause from MySQL, and an add-stock's units (once, by the
/// action's mark); says what it did.
fn follow(
    redis: &mut Con,
    db: &mut mysql::Conn,
    sale_id: u64,
    buckets: u32,
    key: &str,
) -> Result<String, RunError> {
    let Some(settings) = sale_admin::settings(db, sale_id)? else {
        return Ok("MySQL no longer holds the sale; Redis unchanged".into());
    };
    let followed = sale_admin::follow(redis, sale_id, buckets, &settings)?;
    let mut text = match followed.held {
        0 => "Redis does not hold the sale: `sale load` puts it there as MySQL says".to_string(),
        n => format!("Redis follows in {n} bucket(s)"),
    };
    for (b, ms) in &followed.late {
        log::warn!(
            "sale {sale_id}: bucket {b} took its end {ms} ms after it had passed; \
             `seckill-reconciler run` reports each order it took meanwhile (order_outside_window)"
        );
        text = format!(
            "{text}; bucket {b} written {ms} ms after the end: `run` reports each order it took \
             meanwhile (order_outside_window)"
        );
    }
    let Some(d) = sale_admin::decided(db, key)? else {
        return Ok(text);
    };
    if let (Some(units), Some(before)) = (d.units, d.total_before) {
        let mut added = 0;
        for b in 0..buckets.max(1) {
            let n = sale_admin::added_to_bucket(before, units, buckets, b);
            let k = SaleKeys::bucket(sale_id, b);
            if sale_admin::add_to_bucket(redis, &k, key, n)? != Added::NotLoaded {
                added += n;
            }
        }
        text = format!("{text}; {added} of {units} unit(s) in Redis's stock");
    }
    Ok(text)
}

/// Completes every sale action a killed command left `started` (see the
/// module doc); returns how many.
///
/// Errors: SQLite, MySQL or Redis failures (nothing recorded then; a later
/// command or run does it).
pub fn complete_pending(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
) -> Result<usize, RunError> {
    if review.pending_sale_actions()?.is_empty() {
        return Ok(0);
    }
    review.immediate(|| -> Result<usize, RunError> {
        let pending = review.pending_sale_actions()?; // again, under the lock
        for p in &pending {
            let o = if p.action == ActionKind::DropDeadLetter {
                crate::cmd::sale_dlq::observe(redis, p)?
            } else {
                observe(redis, db, p)?
            };
            let now = format_ms(now_ms());
            review.record_sale_action(
                &now,
                &p.actor,
                p.sale_id,
                p.action,
                &o.text,
                o.status,
                Some(p.id),
            )?;
            log::warn!(
                "action {} ({} of sale {} by {}) was interrupted; recorded now as {}: {}",
                p.id,
                p.action,
                p.sale_id,
                p.actor,
                o.status.as_str(),
                o.text
            );
        }
        Ok(pending.len())
    })
}

/// What interrupted action `p` came to: MySQL's decision, and Redis's
/// step completed when it was decided.
fn observe(
    redis: &mut Con,
    db: &mut mysql::Conn,
    p: &PendingSaleAction,
) -> Result<Outcome, RunError> {
    if p.action == ActionKind::Repair {
        // `sale repair` of an archived sale: writing its tombstone again
        // is repeatable, so it is done now if it was not then.
        crate::sale_archive::tombstone_again(redis, db, p.sale_id)?;
        return Ok(Outcome::done(format!(
            "sale {} {} (recorded after an interruption)",
            p.sale_id,
            crate::cmd::repair::TOMBSTONE_WRITTEN
        )));
    }
    let key = p.key();
    if sale_admin::decided(db, &key)?.is_none() {
        return Ok(Outcome::failed(format!(
            "interrupted before its effect: MySQL holds no change of action {}; nothing changed",
            p.id
        )));
    }
    let buckets = seckill_common::data_loss::bucket_count(redis, db, p.sale_id)?;
    let text = follow(redis, db, p.sale_id, buckets, &key)?;
    Ok(Outcome::done(format!(
        "{} of sale {} (recorded after an interruption: MySQL holds its change); {text}",
        p.action, p.sale_id
    )))
}
