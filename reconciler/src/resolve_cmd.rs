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
//! - `--dismiss`: close the finding with the note.
//!
//! A done or already-done reorder or rollback also closes the other open
//! findings of the same reservation (e.g. its `dead_letter` entry).

use crate::cli::{ResolveAction, ResolveArgs};
use crate::error::RunError;
use crate::output::outln;
use crate::review::Review;
use crate::review_findings::Finding;
use crate::run_cmd::redis_connect;
use redis::{FromRedisValue, Script, Value};
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::release::{release, ReleaseError, ReleaseOutcome};
use seckill_common::timefmt::format_ms;
use seckill_common::{now_ms, Config};

/// `KEYS`: flow, status, queue, attempts, then every processing list of the
/// sale; `ARGV`: reservation id, then `check` for a dry run (stop before any
/// write). Replies `queued` (`would_queue` in a dry run), `already_queued`,
/// `in_flight` or `not_found`.
const REORDER_LUA: &str = r"
local msg = redis.call('HGET', KEYS[1], ARGV[1])
if not msg then return 'not_found' end
if redis.call('LPOS', KEYS[3], msg) then return 'already_queued' end
for i = 5, #KEYS do
  if redis.call('LPOS', KEYS[i], msg) then return 'in_flight' end
end
if ARGV[2] == 'check' then return 'would_queue' end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], 'queued')
redis.call('LPUSH', KEYS[3], msg)
return 'queued'";

/// The refusals of `seckill_common::release::RELEASE_LUA`, in its order,
/// without its writes: what a rollback would come to. `KEYS`: flow, status,
/// stock, then every processing list of the sale; `ARGV`: reservation id.
/// Replies `{'not_found'}`, `{'confirmed'}`, `{'in_flight', processing_key}`
/// or `{'clear', stock}`. A real rollback runs this check first and then the
/// release script, which checks the same conditions again atomically.
const RELEASE_CHECK_LUA: &str = r"
local msg = redis.call('HGET', KEYS[1], ARGV[1])
if not msg then return {'not_found'} end
if redis.call('HGET', KEYS[2], ARGV[1]) == 'confirmed' then return {'confirmed'} end
for i = 4, #KEYS do
  if redis.call('LPOS', KEYS[i], msg) then return {'in_flight', KEYS[i]} end
end
return {'clear', redis.call('GET', KEYS[3]) or '0'}";

/// The outcome of an action, as logged.
enum Outcome {
    Done(String),
    NoChange(String),
    Refused(String),
}

/// Runs `resolve`; exit code 0 when done or already done, 2 when refused,
/// the same for `--dry-run`.
///
/// Errors: no review file ([`RunError::Review`]), Redis, MySQL or SQLite
/// failures.
pub fn resolve(config: &Config, args: &ResolveArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let f = review.finding(args.finding_id)?;
    let outcome = match args.action {
        ResolveAction::Dismiss => {
            if f.state == "resolved" {
                Outcome::NoChange(format!("finding {} is already resolved", f.id))
            } else {
                Outcome::Done(format!("finding {} closed: {}", f.id, f.kind))
            }
        }
        ResolveAction::Reorder | ResolveAction::Rollback => match settled_otherwise(&f, args) {
            Some(refusal) => refusal,
            None => act_on_reservation(config, &f, args)?,
        },
    };
    let (result, text) = match &outcome {
        Outcome::Done(t) => ("done", t),
        Outcome::NoChange(t) => ("no_change", t),
        Outcome::Refused(t) => ("refused", t),
    };
    if args.dry_run {
        if let Outcome::Refused(t) = &outcome {
            eprintln!("seckill-reconciler: refused: {t}");
            eprintln!("seckill-reconciler: dry run: nothing changed, nothing logged");
            return Ok(2);
        }
        outln!("dry run, nothing changed: {text}");
        return Ok(0);
    }
    let now = format_ms(now_ms());
    review.db.execute_batch("BEGIN IMMEDIATE")?;
    let logged = (|| -> Result<(), RunError> {
        let detail = match &args.note {
            Some(n) => format!("{text}; note: {n}"),
            None => text.clone(),
        };
        review.record_action(&now, &args.by, f.id, args.action.as_str(), &detail, result)?;
        if result != "refused" {
            let action = args.action.as_str();
            review.set_resolved(f.id, &args.by, action, args.note.as_deref(), &now)?;
            if args.action != ResolveAction::Dismiss {
                for id in review.open_siblings(&f)? {
                    review.set_resolved(id, &args.by, action, args.note.as_deref(), &now)?;
                    let why = format!("settled with finding {} ({action})", f.id);
                    review.record_action(&now, &args.by, id, action, &why, "done")?;
                }
            }
        }
        Ok(())
    })();
    match logged {
        Ok(()) => review.db.execute_batch("COMMIT")?,
        Err(e) => {
            let _ = review.db.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    match outcome {
        Outcome::Refused(t) => {
            eprintln!("seckill-reconciler: refused: {t}");
            Ok(2)
        }
        Outcome::Done(t) | Outcome::NoChange(t) => {
            outln!("{result}: {t}");
            Ok(0)
        }
    }
}

/// A refusal when `f` is no longer open and was not closed by this same
/// action: acting on it now could undo what closed it (a rollback after a
/// reorder would release a unit a worker may be turning into an order; a
/// reorder after a rollback would resell a released unit). Repeating the
/// action that closed it goes on, and finds nothing left to do.
fn settled_otherwise(f: &Finding, args: &ResolveArgs) -> Option<Outcome> {
    let action = args.action.as_str();
    if f.state == "open" || f.resolution.as_deref() == Some(action) {
        return None;
    }
    Some(Outcome::Refused(format!(
        "finding {} is already {} ({} by {}): --{action} now could undo that; nothing done",
        f.id,
        f.state,
        f.resolution
            .as_deref()
            .or(f.fix.as_deref())
            .unwrap_or("closed"),
        f.resolved_by.as_deref().unwrap_or("the reconciler"),
    )))
}

/// `--reorder` or `--rollback` of finding `f`; with `args.dry_run` the same
/// checks, stopping before the first write.
fn act_on_reservation(
    config: &Config,
    f: &Finding,
    args: &ResolveArgs,
) -> Result<Outcome, RunError> {
    let action = args.action.as_str();
    let Some(rid) = f.reservation_id.clone() else {
        return Ok(Outcome::Refused(format!(
            "finding {} ({}) names no reservation; only --dismiss applies",
            f.id, f.kind
        )));
    };
    if !matches!(f.kind.as_str(), "flow_without_order" | "dead_letter") {
        return Ok(Outcome::Refused(format!(
            "finding {} is {}: --{action} applies to flow_without_order and dead_letter",
            f.id, f.kind
        )));
    }
    let sale_id = f.sale_id.max(0) as u64;
    let mut mysql = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    if let Some(order) = crate::mysql_read::order_of(&mut mysql, &rid)? {
        return Ok(order_exists(args.action, order.id, &rid));
    }
    let mut redis = redis_connect(config)?;
    let workers = crate::redis_read::set_members(&mut redis, WORKERS)?;
    if args.action == ResolveAction::Reorder {
        return reorder(&mut redis, sale_id, &rid, &workers, args.dry_run);
    }
    let outcome = match check_release(&mut redis, sale_id, &rid, &workers)? {
        Ok(stock) if args.dry_run => {
            return Ok(Outcome::Done(format!(
                "would release {rid}: stock {stock} -> {}, remove its flow record and \
                 purchase mark, status failed",
                stock + 1
            )))
        }
        // The release script checks the same conditions again, atomically.
        Ok(_) => release(&mut redis, sale_id, &rid, &workers)?,
        Err(refusal) => refusal,
    };
    Ok(match outcome {
        ReleaseOutcome::Released { stock_after } => Outcome::Done(format!(
            "released {rid} in Redis: stock {} -> {stock_after}",
            stock_after - 1
        )),
        ReleaseOutcome::NotFound => {
            Outcome::NoChange(format!("no flow record for {rid}: already released"))
        }
        ReleaseOutcome::Confirmed => {
            // The worker marks `confirmed` only after its MySQL commit, so an
            // order missing now (read after the status) was lost in MySQL.
            match crate::mysql_read::order_of(&mut mysql, &rid)? {
                Some(order) => order_exists(args.action, order.id, &rid),
                None => Outcome::Refused(format!(
                    "{rid} is confirmed in Redis but MySQL holds no order for it: the order \
                     was confirmed and later lost in MySQL; use --reorder to create it again \
                     (a rollback would resell a unit the buyer was told is theirs)"
                )),
            }
        }
        ReleaseOutcome::InFlight(list) => Outcome::Refused(format!(
            "{rid} is in {list}: a worker is applying it; try again later"
        )),
    })
}

/// What `action` comes to when MySQL already holds order `order_id`.
fn order_exists(action: ResolveAction, order_id: u64, rid: &str) -> Outcome {
    let t = format!("MySQL already holds order {order_id} for reservation {rid}");
    match action {
        ResolveAction::Rollback => Outcome::Refused(format!("{t}: releasing would oversell")),
        _ => Outcome::NoChange(t),
    }
}

/// Runs [`RELEASE_CHECK_LUA`]: `Ok(stock)` when a release would go ahead,
/// `Err(outcome)` with the release's refusal (or `NotFound`) otherwise.
fn check_release(
    redis: &mut redis::Connection,
    sale_id: u64,
    rid: &str,
    workers: &[String],
) -> Result<Result<i64, ReleaseOutcome>, RunError> {
    if !seckill_common::ids::is_valid_reservation_id(rid) {
        return Err(RunError::Release(ReleaseError::InvalidReservationId));
    }
    let k = SaleKeys::new(sale_id);
    let script = Script::new(RELEASE_CHECK_LUA);
    let mut inv = script.prepare_invoke();
    inv.key(k.flow()).key(k.status()).key(k.stock());
    for w in workers {
        inv.key(k.processing(w));
    }
    let reply: Value = inv.arg(rid).invoke(redis)?;
    let parts: Vec<String> = Vec::<String>::from_redis_value(reply.clone())
        .map_err(|_| RunError::Release(ReleaseError::UnexpectedReply(format!("{reply:?}"))))?;
    let unexpected = || RunError::Release(ReleaseError::UnexpectedReply(format!("{parts:?}")));
    Ok(match parts.first().map(String::as_str) {
        Some("clear") => Ok(parts
            .get(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(unexpected)?),
        Some("not_found") => Err(ReleaseOutcome::NotFound),
        Some("confirmed") => Err(ReleaseOutcome::Confirmed),
        Some("in_flight") => Err(ReleaseOutcome::InFlight(
            parts.get(1).cloned().ok_or_else(unexpected)?,
        )),
        _ => return Err(unexpected()),
    })
}

/// Runs [`REORDER_LUA`] (only its checks when `dry_run`).
fn reorder(
    redis: &mut redis::Connection,
    sale_id: u64,
    rid: &str,
    workers: &[String],
    dry_run: bool,
) -> Result<Outcome, RunError> {
    let k = SaleKeys::new(sale_id);
    let script = Script::new(REORDER_LUA);
    let mut inv = script.prepare_invoke();
    inv.key(k.flow())
        .key(k.status())
        .key(k.queue())
        .key(k.attempts());
    for w in workers {
        inv.key(k.processing(w));
    }
    inv.arg(rid);
    if dry_run {
        inv.arg("check");
    }
    let reply: String = inv.invoke(redis)?;
    Ok(match reply.as_str() {
        "queued" => Outcome::Done(format!("queued the order message of {rid} again")),
        "would_queue" => Outcome::Done(format!(
            "would queue the order message of {rid} again (LPUSH onto {})",
            k.queue()
        )),
        "already_queued" => Outcome::NoChange(format!("{rid} is already queued")),
        "in_flight" => Outcome::NoChange(format!("{rid} is being applied by a worker")),
        _ => Outcome::Refused(format!("no flow record for {rid}: nothing to queue")),
    })
}
