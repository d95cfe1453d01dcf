//! Owns the write-ahead audit of operator actions with an effect outside
//! SQLite (`resolve --rollback`: a Redis release; `--reorder`: a message
//! queued again; `--recreate`: an order made again in MySQL; `sale
//! repair`: a paused sale rebuilt from MySQL), and their completion after
//! an interruption.
//!
//! An action is written ahead: its `started` row (who, what, on which
//! finding) is committed before the effect. Then, holding the review file's
//! write lock (`BEGIN IMMEDIATE`), the effect runs and its completion row
//! (`done`, `no_change` or `refused`, with `completes` = the started row) is
//! committed together with the finding's new state, its siblings' closing
//! (one `done` row each) and after the reservation's dead-letter entries were
//! archived (`dead_letter_archive.rs`): only those read just before the
//! effect, so an entry the effect itself causes (a re-queued message
//! dead-lettered again at once) stays in the list and is reported by the
//! next run. A kill at any moment leaves either no
//! row (nothing happened), a `started` row without completion (the effect may
//! or may not have happened), or the whole record.
//!
//! A `started` row without completion is completed by the next `resolve`
//! (any finding) or `run`, before they act or read, under the same write
//! lock: no action is then between its lock and its commit, so the effect
//! either happened or never will (a process still between its started row
//! and its lock finds its row completed and stops without acting). The
//! outcome is read from Redis: a rollback happened iff the reservation's flow
//! record is gone (the release script removes it atomically with the stock
//! increment); a reorder happened iff `seckill:{sale:ID}:reordered` holds the
//! action's mark, which the reorder script writes atomically with the push;
//! a repair happened iff the sale's meta hash holds the action's mark
//! (`repaired_by`), written in the repair's `MULTI`; a re-creation happened
//! iff MySQL holds the reservation's order (`recreate.rs`: no worker can
//! make it while the deduction it is made from stands), whose status is
//! then written to Redis. The dead-letter entries it settles are those
//! dead-lettered before its `started` row.
//! It is recorded under the original actor as `done` (effect present) or
//! `failed` (nothing changed), so every effect has exactly one `done` row
//! naming who asked for it.
//!
//! A finding gets a `done` row only when that row closes it (open →
//! resolved); a completion for a finding already closed meanwhile is
//! recorded as `no_change`. So however often an action is repeated or
//! recovered, each closing of a finding has exactly one `done` row.

use crate::dead_letter_archive::{archive_entries_of, entries_of, Existing, SettledBy};
use crate::error::RunError;
use crate::review::findings::{Finding, Resolution};
use crate::review::{ActionKind, ActionStatus, PendingAction, Review};
use redis::Commands;
use seckill_common::keys::SaleKeys;
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// What an action came to, as logged and printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The status of the row that records it (never `Started`).
    pub status: ActionStatus,
    /// What happened, in one line.
    pub text: String,
}

impl Outcome {
    /// It changed what it set out to change.
    pub fn done(text: String) -> Outcome {
        Outcome {
            status: ActionStatus::Done,
            text,
        }
    }
    /// Nothing was left to change.
    pub fn no_change(text: String) -> Outcome {
        Outcome {
            status: ActionStatus::NoChange,
            text,
        }
    }
    /// Not allowed; nothing changed.
    pub fn refused(text: String) -> Outcome {
        Outcome {
            status: ActionStatus::Refused,
            text,
        }
    }
    /// Did not happen; nothing changed.
    pub fn failed(text: String) -> Outcome {
        Outcome {
            status: ActionStatus::Failed,
            text,
        }
    }
    /// Whether the action settles its finding (and the finding's siblings).
    pub fn settles(&self) -> bool {
        matches!(self.status, ActionStatus::Done | ActionStatus::NoChange)
    }
}

/// Runs `effect` on finding `f` written ahead (see the module doc): the
/// `started` row (`intent`, `note`) is committed first; the effect, the
/// archive of the reservation's dead letters, the completion row and the
/// findings' states follow under the write lock. Returns the outcome as
/// recorded.
///
/// Errors: SQLite, or what `effect` returns (the started row then stays
/// without completion, for the next `resolve` or `run` to complete);
/// [`RunError::Refused`] when another process completed the started row
/// first (as interrupted): nothing was done.
#[allow(clippy::too_many_arguments)] // the action's who, what, why and how
pub fn written_ahead(
    review: &Review,
    redis: &mut Con,
    f: &Finding,
    action: ActionKind,
    actor: &str,
    note: Option<&str>,
    intent: &str,
    effect: impl FnOnce(&mut Con, &PendingAction) -> Result<Outcome, RunError>,
) -> Result<Outcome, RunError> {
    let at = format_ms(now_ms());
    let detail = with_note(intent, note);
    let id = review.record_action(
        &at,
        actor,
        f.id,
        action,
        &detail,
        ActionStatus::Started,
        None,
    )?;
    let started = PendingAction {
        id,
        at,
        actor: actor.to_string(),
        finding_id: f.id,
        action,
    };
    review.immediate(|| -> Result<Outcome, RunError> {
        if review.is_completed(id)? {
            return Err(RunError::Refused(format!(
                "action {id} was completed by another process as interrupted before its \
                 effect; nothing done: run the command again"
            )));
        }
        let existing = match f.reservation_id.as_deref() {
            Some(rid) => Existing::Entries(entries_of(redis, f.sale_id.max(0) as u64, rid)?),
            None => Existing::All,
        };
        let outcome = effect(redis, &started)?;
        complete(review, redis, &started, &outcome, note, &existing)
    })
}

/// Completes every `started` action without completion (see the module
/// doc), connecting to Redis only when there is one, and to MySQL only for
/// an interrupted `--recreate`. Returns how many.
///
/// Errors: SQLite, Redis or MySQL failures (nothing is then recorded; a
/// later attempt does it).
pub fn complete_pending(
    review: &Review,
    connect: impl FnOnce() -> Result<Con, RunError>,
    mut connect_mysql: impl FnMut() -> Result<mysql::Conn, RunError>,
) -> Result<usize, RunError> {
    if review.pending_actions()?.is_empty() {
        return Ok(0);
    }
    let mut redis = connect()?;
    let mut mysql: Option<mysql::Conn> = None;
    review.immediate(|| -> Result<usize, RunError> {
        let pending = review.pending_actions()?; // again, under the lock
        for p in &pending {
            let f = review.finding(p.finding_id)?;
            let observed = if p.action == ActionKind::Recreate {
                observe_recreate(&mut redis, &mut mysql, &mut connect_mysql, &f)?
            } else {
                observe(&mut redis, p, &f)?
            };
            // The entries dead-lettered before its `started` row.
            let started_ms = seckill_common::timefmt::parse_time_ms(&p.at, 0).unwrap_or(0);
            let existing = Existing::Before(started_ms);
            let o = complete(review, &mut redis, p, &observed, None, &existing)?;
            log::warn!(
                "action {} ({} of finding {} by {}) was interrupted; recorded now as {}: {}",
                p.id,
                p.action,
                p.finding_id,
                p.actor,
                o.status.as_str(),
                o.text
            );
        }
        Ok(pending.len())
    })
}

/// What an interrupted action `p` on finding `f` came to, read from Redis.
fn observe(redis: &mut Con, p: &PendingAction, f: &Finding) -> Result<Outcome, RunError> {
    if p.action == ActionKind::Repair {
        return observe_repair(redis, p, f);
    }
    let Some(rid) = f.reservation_id.as_deref() else {
        return Ok(Outcome::failed(
            "interrupted; the finding names no reservation: nothing changed".to_string(),
        ));
    };
    let sale_id = f.sale_id.max(0) as u64;
    // In whichever bucket holds it (a sale split over buckets).
    let holding = |redis: &mut Con, hash: fn(&SaleKeys) -> String| {
        seckill_common::buckets::holding(redis, sale_id, rid, hash)
    };
    Ok(match p.action {
        ActionKind::Rollback => {
            let held = holding(redis, SaleKeys::flow)?.is_some();
            if held {
                Outcome::failed(format!(
                    "interrupted before its effect: {rid} is still reserved; nothing changed"
                ))
            } else {
                Outcome::done(format!(
                    "released {rid} in Redis (recorded after an interruption: its flow \
                     record is gone)"
                ))
            }
        }
        ActionKind::Reorder => {
            let k = holding(redis, SaleKeys::reorder_marks)?.unwrap_or(SaleKeys::new(sale_id));
            let mark: Option<String> = redis.hget(k.reorder_marks(), rid)?;
            if mark.as_deref() == Some(p.mark().as_str()) {
                Outcome::done(format!(
                    "queued the order message of {rid} again (recorded after an \
                     interruption: {} holds this action's mark)",
                    k.reorder_marks()
                ))
            } else {
                Outcome::failed(format!(
                    "interrupted before its effect: {rid} was not queued again; nothing changed"
                ))
            }
        }
        _ => Outcome::failed("interrupted; it has no effect outside SQLite".to_string()),
    })
}

/// What an interrupted `resolve --recreate` on finding `f` came to, read
/// from MySQL (`recreate::observe`), connecting to it on first use.
fn observe_recreate(
    redis: &mut Con,
    mysql: &mut Option<mysql::Conn>,
    connect: &mut impl FnMut() -> Result<mysql::Conn, RunError>,
    f: &Finding,
) -> Result<Outcome, RunError> {
    let Some(rid) = f.reservation_id.as_deref() else {
        return Ok(Outcome::failed(
            "interrupted; the finding names no reservation: nothing changed".to_string(),
        ));
    };
    let db = match mysql {
        Some(db) => db,
        None => mysql.insert(connect()?),
    };
    crate::recreate::observe(db, redis, f.sale_id.max(0) as u64, rid)
}

/// What an interrupted `sale repair` came to: done exactly when its
/// `MULTI` ran, which leaves the action's mark in the meta hash.
fn observe_repair(redis: &mut Con, p: &PendingAction, f: &Finding) -> Result<Outcome, RunError> {
    let k = SaleKeys::new(f.sale_id.max(0) as u64);
    let mark: Option<String> = redis.hget(k.meta(), crate::repair_rebuild::REPAIRED_BY)?;
    Ok(if mark.as_deref() == Some(p.mark().as_str()) {
        Outcome::done(format!(
            "repaired sale {} (recorded after an interruption: its meta hash holds this \
             action's mark)",
            f.sale_id
        ))
    } else {
        Outcome::failed("interrupted before its effect: the sale was not rebuilt".to_string())
    })
}

/// Records the completion of `started` with `outcome`, inside the caller's
/// transaction: archives the reservation's dead letters that existed when
/// it started (`existing`) when the action settles it, appends the completion row (`no_change` instead of `done`
/// when the finding was closed meanwhile), closes the finding and its open
/// siblings. Returns the outcome as recorded.
fn complete(
    review: &Review,
    redis: &mut Con,
    started: &PendingAction,
    outcome: &Outcome,
    note: Option<&str>,
    existing: &Existing,
) -> Result<Outcome, RunError> {
    let now = format_ms(now_ms());
    let f = review.finding(started.finding_id)?;
    let action = started.action;
    if outcome.settles() {
        if let Some(rid) = f.reservation_id.as_deref() {
            let by = SettledBy {
                action: action.as_str(),
                actor: &started.actor,
                finding_id: f.id,
                action_id: started.id,
                at: &now,
            };
            archive_entries_of(redis, f.sale_id.max(0) as u64, rid, existing, &by)?;
        }
    }
    let mut recorded = outcome.clone();
    if recorded.status == ActionStatus::Done && !f.is_open() {
        recorded.status = ActionStatus::NoChange;
        recorded.text.push_str("; the finding was already closed");
    }
    review.record_action(
        &now,
        &started.actor,
        f.id,
        action,
        &with_note(&recorded.text, note),
        recorded.status,
        Some(started.id),
    )?;
    if recorded.settles() {
        settle_finding(review, &f, action, &started.actor, note, &now)?;
    }
    Ok(recorded)
}

/// Closes finding `f` by `action` of `actor` and every open sibling (the
/// other findings of its reservation), each sibling with its own `done` row.
///
/// Errors: SQLite failures.
pub fn settle_finding(
    review: &Review,
    f: &Finding,
    action: ActionKind,
    actor: &str,
    note: Option<&str>,
    now: &str,
) -> Result<(), RunError> {
    review.set_resolved(f.id, actor, Resolution::By(action), note, now)?;
    for id in review.open_siblings(f)? {
        review.set_resolved(id, actor, Resolution::By(action), note, now)?;
        let why = format!("settled with finding {} ({})", f.id, action.as_str());
        review.record_action(now, actor, id, action, &why, ActionStatus::Done, None)?;
    }
    Ok(())
}

/// `text`, with `; note: NOTE` when there is one.
pub fn with_note(text: &str, note: Option<&str>) -> String {
    match note {
        Some(n) => format!("{text}; note: {n}"),
        None => text.to_string(),
    }
}
