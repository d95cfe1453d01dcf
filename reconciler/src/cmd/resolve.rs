//! Owns `seckill-reconciler resolve`: an operator's action on a finding,
//! recorded in the append-only `actions` log, idempotent, and previewable
//! with `--dry-run`, which runs exactly the checks of the real action (the
//! same MySQL read, the same Redis conditions) and reports the same refusal
//! and exit code, but changes nothing, not even the log.
//!
//! - `--reorder`: queue the reservation's order message again (one atomic
//!   script: only when the flow record exists and the message is neither
//!   queued nor in a processing list; the worker's idempotency makes even a
//!   repeat harmless). Nothing is done when MySQL already holds the order.
//!   It is also the fix for an order that was confirmed and later lost in
//!   MySQL: the worker creates it again.
//! - `--rollback`: release the reservation in Redis
//!   (`seckill_common::release`), refused while MySQL holds its order, a
//!   worker holds its message, or its Redis status is `confirmed` (a worker
//!   committed it: the buyer was told the unit is theirs). A repeat finds no
//!   flow record: stock moves once.
//! - `--recreate`: make the order of a `ledger_without_order` finding again
//!   from its ledger row and flow record, without a second deduction
//!   (`recreate.rs`).
//! - `--dismiss`: close the finding with the note.
//!
//! `--reorder` and `--rollback` are refused for a reservation whose unit
//! MySQL's stock ledger deducted while it holds no order: a rollback would
//! put back on sale in Redis a unit MySQL no longer has, and a re-queued
//! message cannot become an order (the worker's batch would deduct a second
//! unit, and MySQL's stock may not cover it); `--recreate` is the fix.
//!
//! In a sale split over buckets, `--reorder` and `--rollback` act in the
//! bucket whose flow records hold the reservation
//! (`seckill_common::buckets::holding`: its buyer's home bucket), so a
//! released unit goes back to that bucket's stock and a re-queued message
//! onto that bucket's queue.
//!
//! Any action that settles a finding (done, or already done) also closes the
//! other open findings of the same reservation (e.g. its `dead_letter`
//! entry), each with its own `done` row, but never a finding about a
//! payment, which closes alone (`Kind::is_about_a_payment`); a released or re-queued
//! reservation's dead-letter entries are archived (`dead_letter_archive.rs`).
//! A reorder or rollback that gets as far as its effect is written ahead
//! (`settle.rs`): `started` before, its completion after; an interrupted one
//! is completed by the next `resolve` or `run` before they do anything else.

use crate::cli::{by_and_note, err, finding_id, Command, Opts, UsageError};
use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::output::outln;
use crate::review::findings::{Finding, Kind, Resolution};
use crate::review::{ActionKind, ActionStatus, PendingAction, Review};
use crate::settle::{self, Outcome};
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::release::{release_in, ReleaseOutcome};
use seckill_common::reorder::{self, ReorderOutcome};
use seckill_common::timefmt::format_ms;

/// What the checks before an action's effect came to.
enum Checked {
    /// The action ends here: a refusal, or nothing left to do.
    Final(Outcome),
    /// The effect may go ahead (a dry run stops here with this text).
    Go {
        /// What the effect would do, in one line.
        would: String,
        /// The reservation.
        rid: String,
        /// The bucket that holds it (the sale's own keys when not split).
        keys: SaleKeys,
        /// The registered workers (their processing lists are checked).
        workers: Vec<String>,
        /// Redis, open.
        redis: Con,
        /// MySQL, open.
        mysql: mysql::Conn,
        /// For `--recreate`: what its checks found.
        plan: Option<Box<crate::recreate::Plan>>,
    },
}

/// Runs `resolve`; exit code 0 when done or already done, 1
/// ([`crate::error::EXIT_REFUSED`]) when refused,
/// the same for `--dry-run`.
///
/// Errors: no review file ([`RunError::Review`]), Redis, MySQL or SQLite
/// failures.
pub fn run(config: &Config, args: &ResolveArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    if !args.dry_run {
        settle::complete_pending(
            &review,
            || connect::redis(&config.services),
            || connect::mysql(&config.services),
        )?;
    }
    let f = review.finding(args.finding_id)?;
    let action = action_kind(args.action);
    let checked = match args.action {
        ResolveAction::Dismiss => Checked::Final(if f.is_open() {
            Outcome::done(format!("finding {} closed: {}", f.id, f.kind))
        } else {
            Outcome::no_change(format!("finding {} is already {}", f.id, f.state))
        }),
        ResolveAction::Reorder | ResolveAction::Rollback | ResolveAction::Recreate => {
            match settled_otherwise(&f, args) {
                Some(refusal) => Checked::Final(refusal),
                None => check(config, &f, args)?,
            }
        }
    };
    let outcome = match checked {
        Checked::Final(o) if args.dry_run => o,
        Checked::Final(o) => {
            log_single(&review, &f, action, args, &o)?;
            o
        }
        Checked::Go { would, .. } if args.dry_run => Outcome::done(would),
        Checked::Go {
            would,
            rid,
            keys,
            workers,
            mut redis,
            mut mysql,
            plan,
        } => settle::written_ahead(
            &review,
            &mut redis,
            &f,
            action,
            &args.by,
            args.note.as_deref(),
            &format!("started: {would}"),
            |redis, started| {
                if let Some(plan) = &plan {
                    return crate::recreate::recreate(&mut mysql, redis, plan);
                }
                effect(
                    redis,
                    &mut mysql,
                    args.action,
                    keys,
                    &rid,
                    &workers,
                    started,
                )
            },
        )?,
    };
    if outcome.status == ActionStatus::Refused {
        eprintln!("seckill-reconciler: refused: {}", outcome.text);
        if args.dry_run {
            eprintln!("seckill-reconciler: dry run: nothing changed, nothing logged");
        }
        return Ok(EXIT_REFUSED);
    }
    if args.dry_run {
        outln!("dry run, nothing changed: {}", outcome.text);
    } else {
        outln!("{}: {}", outcome.status.as_str(), outcome.text);
    }
    Ok(0)
}

/// The audit log's name for `action`.
fn action_kind(action: ResolveAction) -> ActionKind {
    match action {
        ResolveAction::Reorder => ActionKind::Reorder,
        ResolveAction::Rollback => ActionKind::Rollback,
        ResolveAction::Recreate => ActionKind::Recreate,
        ResolveAction::Dismiss => ActionKind::Dismiss,
    }
}

/// Logs an action that has no effect outside SQLite (a dismissal, a
/// refusal, nothing left to do) in one transaction: its row, and when it
/// settles the finding, the finding and its open siblings closed.
fn log_single(
    review: &Review,
    f: &Finding,
    action: ActionKind,
    args: &ResolveArgs,
    o: &Outcome,
) -> Result<(), RunError> {
    let now = format_ms(now_ms());
    review.immediate(|| -> Result<(), RunError> {
        let detail = settle::with_note(&o.text, args.note.as_deref());
        review.record_action(&now, &args.by, f.id, action, &detail, o.status, None)?;
        if o.settles() {
            settle::settle_finding(review, f, action, &args.by, args.note.as_deref(), &now)?;
        }
        Ok(())
    })
}

/// A refusal when `f` is no longer open and was not closed by this same
/// action: acting on it now could undo what closed it (a rollback after a
/// reorder would release a unit a worker may be turning into an order; a
/// reorder after a rollback would resell a released unit). Repeating the
/// action that closed it goes on, and finds nothing left to do.
fn settled_otherwise(f: &Finding, args: &ResolveArgs) -> Option<Outcome> {
    let action = args.action.as_str();
    if f.is_open() || f.resolution == Some(Resolution::By(action_kind(args.action))) {
        return None;
    }
    Some(Outcome::refused(format!(
        "finding {} is already {} ({} by {}): --{action} now could undo that; nothing done",
        f.id,
        f.state,
        f.resolution
            .map(Resolution::as_str)
            .or(f.fix.as_deref())
            .unwrap_or("closed"),
        f.resolved_by.as_deref().unwrap_or("the reconciler"),
    )))
}

/// The checks of `--reorder` or `--rollback` of finding `f`, before any
/// write: the same for a dry run and the real action.
fn check(config: &Config, f: &Finding, args: &ResolveArgs) -> Result<Checked, RunError> {
    let rid = match applicable(f, args.action) {
        Ok(rid) => rid,
        Err(refusal) => return Ok(Checked::Final(refusal)),
    };
    let recreate = args.action == ResolveAction::Recreate;
    let sale_id = f.sale_id.max(0) as u64;
    let mut mysql = connect::mysql(&config.services)?;
    if let Some(order) = crate::mysql_read::order_of(&mut mysql, &rid)? {
        return Ok(Checked::Final(order_exists(args.action, order.id, &rid)));
    }
    // A rollback puts a unit back on sale: never for a sale MySQL no longer
    // holds (no order could ever be made of it).
    if args.action == ResolveAction::Rollback
        && seckill_common::sale_admin::settings(&mut mysql, sale_id)?.is_none()
    {
        return Ok(Checked::Final(Outcome::refused(format!(
            "MySQL holds no sale {sale_id}: a rollback would put {rid} back on sale for a sale \
             no order can be made of; --dismiss the finding (the sale_missing_in_mysql finding \
             says what to do with the sale)"
        ))));
    }
    let mut redis = connect::redis(&config.services)?;
    if recreate {
        return Ok(
            match crate::recreate::check(&mut mysql, &mut redis, sale_id, &rid)? {
                Ok(plan) => Checked::Go {
                    would: plan.would(),
                    rid,
                    keys: plan.keys,
                    workers: Vec::new(),
                    redis,
                    mysql,
                    plan: Some(Box::new(plan)),
                },
                Err(o) => Checked::Final(o),
            },
        );
    }
    if let Some(refusal) = deducted_without_order(&mut mysql, args.action, &rid)? {
        return Ok(Checked::Final(refusal));
    }
    // The bucket whose flow records hold it (a sale split over buckets: its
    // buyer's home bucket); when none does, the sale's own keys, where the
    // scripts then find nothing (released already, or never reserved).
    let keys = seckill_common::buckets::holding(&mut redis, sale_id, &rid, SaleKeys::flow)?
        .unwrap_or(SaleKeys::new(sale_id));
    let workers = crate::redis_read::set_members(&mut redis, WORKERS)?;
    let would = if args.action == ResolveAction::Reorder {
        match reorder(&mut redis, keys, &rid, &workers, None)? {
            o if o.status == ActionStatus::Done => o.text,
            o => return Ok(Checked::Final(o)),
        }
    } else {
        match check_release(&mut redis, keys, &rid, &workers)? {
            Ok(stock) => format!(
                "would release {rid}: stock {stock} -> {}, remove its flow record and \
                 purchase mark, status failed",
                stock + 1
            ),
            Err(refusal) => {
                return Ok(Checked::Final(release_outcome(
                    refusal,
                    &mut mysql,
                    args.action,
                    &rid,
                )?))
            }
        }
    };
    Ok(Checked::Go {
        would,
        rid,
        keys,
        workers,
        redis,
        mysql,
        plan: None,
    })
}

/// The reservation that `action` would fix of finding `f`, or the refusal
/// when `action` does not apply to the finding's kind (or it names no
/// reservation).
fn applicable(f: &Finding, action: ResolveAction) -> Result<String, Outcome> {
    let Some(rid) = f.reservation_id.clone() else {
        return Err(Outcome::refused(format!(
            "finding {} ({}) names no reservation; only --dismiss applies",
            f.id, f.kind
        )));
    };
    let recreate = action == ResolveAction::Recreate;
    if recreate && f.kind != Kind::LedgerWithoutOrder {
        return Err(Outcome::refused(format!(
            "finding {} is {}: --recreate applies to ledger_without_order",
            f.id, f.kind
        )));
    }
    if !recreate && !matches!(f.kind, Kind::FlowWithoutOrder | Kind::DeadLetter) {
        return Err(Outcome::refused(format!(
            "finding {} is {}: --{} applies to flow_without_order and dead_letter{}",
            f.id,
            f.kind,
            action.as_str(),
            if f.kind == Kind::LedgerWithoutOrder {
                " (a ledger_without_order is fixed by --recreate)"
            } else {
                ""
            }
        )));
    }
    Ok(rid)
}

/// The refusal of a reorder or rollback of `rid` whose unit MySQL's stock
/// ledger deducted (a deduction not given back) while MySQL holds no order
/// for it (the caller checked the order first); `None` when the ledger
/// holds no such deduction.
///
/// Errors: MySQL failures.
fn deducted_without_order(
    mysql: &mut mysql::Conn,
    action: ResolveAction,
    rid: &str,
) -> Result<Option<Outcome>, RunError> {
    let Some(d) = crate::mysql_read::deductions_of(mysql, &[rid.to_string()])?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let why = if action == ResolveAction::Rollback {
        "releasing it in Redis would put on sale a unit MySQL no longer has"
    } else {
        "a worker cannot make its order without deducting a second unit (it dead-letters the \
         message)"
    };
    Ok(Some(Outcome::refused(format!(
        "MySQL's stock ledger deducted a unit for {rid} (ledger row {}, reason {}) but holds no \
         order for it: {why}; re-create the order with --recreate on its ledger_without_order \
         finding (`run` opens it)",
        d.id, d.reason
    ))))
}

/// The effect of a reorder or rollback that passed its checks (the scripts
/// check the same conditions again, atomically).
fn effect(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    action: ResolveAction,
    keys: SaleKeys,
    rid: &str,
    workers: &[String],
    started: &PendingAction,
) -> Result<Outcome, RunError> {
    if action == ResolveAction::Reorder {
        return reorder(redis, keys, rid, workers, Some(&started.mark()));
    }
    let released = release_in(redis, keys, rid, workers)?;
    release_outcome(released, mysql, action, rid)
}

/// What a release (or its check) replying `outcome` comes to.
fn release_outcome(
    outcome: ReleaseOutcome,
    mysql: &mut mysql::Conn,
    action: ResolveAction,
    rid: &str,
) -> Result<Outcome, RunError> {
    Ok(match outcome {
        ReleaseOutcome::Released { stock_after } => Outcome::done(format!(
            "released {rid} in Redis: stock {} -> {stock_after}",
            stock_after - 1
        )),
        ReleaseOutcome::NotFound => {
            Outcome::no_change(format!("no flow record for {rid}: already released"))
        }
        ReleaseOutcome::Confirmed => {
            // The worker marks `confirmed` only after its MySQL commit, so an
            // order missing now (read after the status) was lost in MySQL.
            match crate::mysql_read::order_of(mysql, rid)? {
                Some(order) => order_exists(action, order.id, rid),
                None => Outcome::refused(format!(
                    "{rid} is confirmed in Redis but MySQL holds no order for it: the order \
                     was confirmed and later lost in MySQL; use --reorder to create it again \
                     (a rollback would resell a unit the buyer was told is theirs)"
                )),
            }
        }
        ReleaseOutcome::InFlight(list) => Outcome::refused(format!(
            "{rid} is in {list}: a worker is applying it; try again later"
        )),
    })
}

/// What `action` comes to when MySQL already holds order `order_id`.
fn order_exists(action: ResolveAction, order_id: u64, rid: &str) -> Outcome {
    let t = format!("MySQL already holds order {order_id} for reservation {rid}");
    match action {
        ResolveAction::Rollback => Outcome::refused(format!("{t}: releasing would oversell")),
        _ => Outcome::no_change(t),
    }
}

/// What a rollback would come to (`release::check`: the release script
/// stopped before its first write): `Ok(stock)` when it would go ahead,
/// `Err(outcome)` with its refusal otherwise.
fn check_release(
    redis: &mut Con,
    keys: SaleKeys,
    rid: &str,
    workers: &[String],
) -> Result<Result<i64, ReleaseOutcome>, RunError> {
    seckill_common::release::check_in(redis, keys, rid, workers).map_err(RunError::Release)
}

/// Runs the reorder script (`seckill_common::reorder`): only its checks
/// without `mark`, the reorder with it (the mark of the action's started
/// row).
fn reorder(
    redis: &mut Con,
    keys: SaleKeys,
    rid: &str,
    workers: &[String],
    mark: Option<&str>,
) -> Result<Outcome, RunError> {
    let queue = keys.queue();
    Ok(
        match reorder::reorder_in(redis, keys, rid, workers, mark)? {
            ReorderOutcome::Queued => {
                Outcome::done(format!("queued the order message of {rid} again"))
            }
            ReorderOutcome::WouldQueue => Outcome::done(format!(
                "would queue the order message of {rid} again (LPUSH onto {queue})"
            )),
            ReorderOutcome::AlreadyQueued => Outcome::no_change(format!("{rid} is already queued")),
            ReorderOutcome::InFlight => {
                Outcome::no_change(format!("{rid} is being applied by a worker"))
            }
            ReorderOutcome::NotFound => {
                Outcome::refused(format!("no flow record for {rid}: nothing to queue"))
            }
        },
    )
}

/// What `resolve` does to the reservation of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveAction {
    /// Queue the order message again.
    Reorder,
    /// Release the reservation in Redis.
    Rollback,
    /// Make the order of a stock-ledger deduction without order again.
    Recreate,
    /// Close the finding, changing nothing else.
    Dismiss,
}

impl ResolveAction {
    /// The action's name as logged in `actions`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveAction::Reorder => "reorder",
            ResolveAction::Rollback => "rollback",
            ResolveAction::Recreate => "recreate",
            ResolveAction::Dismiss => "dismiss",
        }
    }
}

/// Arguments of `resolve`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveArgs {
    /// The finding's id.
    pub finding_id: i64,
    /// Exactly one of the three actions.
    pub action: ResolveAction,
    /// Who acts: 1-64 characters of `A-Z a-z 0-9 _ . - @`.
    pub by: String,
    /// Why; at most [`MAX_NOTE`] characters.
    pub note: Option<String>,
    /// Print what would change and change nothing.
    pub dry_run: bool,
}

/// `resolve ID --reorder|--rollback|--recreate|--dismiss --by NAME [--note] [--dry-run]`.
pub fn parse(id: &str, opts: &mut Opts) -> Result<Command, UsageError> {
    let finding_id = finding_id(id)?;
    let mut actions = Vec::new();
    for (flag, action) in [
        ("reorder", ResolveAction::Reorder),
        ("rollback", ResolveAction::Rollback),
        ("recreate", ResolveAction::Recreate),
        ("dismiss", ResolveAction::Dismiss),
    ] {
        while opts.take(flag).is_some() {
            actions.push(action);
        }
    }
    let [action] = actions.as_slice() else {
        return err("resolve needs exactly one of --reorder, --rollback, --recreate, --dismiss");
    };
    let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
    let dry_run = opts.take("dry-run").is_some();
    Ok(Command::Resolve(ResolveArgs {
        finding_id,
        action: *action,
        by,
        note,
        dry_run,
    }))
}
