//! Owns `seckill-reconciler resolve`: an operator's action on a finding,
//! recorded in the append-only `actions` log, idempotent, and previewable
//! with `--dry-run` (which reads but changes nothing, not even the log).
//!
//! - `--reorder`: queue the reservation's order message again (one atomic
//!   script: only when the flow record exists and the message is neither
//!   queued nor in a processing list; the worker's idempotency makes even a
//!   repeat harmless). Nothing is done when MySQL already holds the order.
//! - `--rollback`: release the reservation in Redis
//!   (`seckill_common::release`), refused while MySQL holds its order or a
//!   worker holds its message. A repeat finds no flow record: stock moves once.
//! - `--dismiss`: close the finding with the note.
//!
//! A done or already-done reorder or rollback also closes the other open
//! findings of the same reservation (e.g. its `dead_letter` entry).

use crate::cli::{ResolveAction, ResolveArgs};
use crate::error::RunError;
use crate::review::Review;
use crate::review_findings::Finding;
use crate::run_cmd::redis_connect;
use redis::{Commands, Script};
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::release::{release, ReleaseOutcome};
use seckill_common::timefmt::format_ms;
use seckill_common::{now_ms, Config};

/// `KEYS`: flow, status, queue, attempts, then every processing list of the
/// sale; `ARGV`: reservation id. Replies `queued`, `already_queued`,
/// `in_flight` or `not_found`.
const REORDER_LUA: &str = r"
local msg = redis.call('HGET', KEYS[1], ARGV[1])
if not msg then return 'not_found' end
if redis.call('LPOS', KEYS[3], msg) then return 'already_queued' end
for i = 5, #KEYS do
  if redis.call('LPOS', KEYS[i], msg) then return 'in_flight' end
end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], 'queued')
redis.call('LPUSH', KEYS[3], msg)
return 'queued'";

/// The outcome of an action, as logged.
enum Outcome {
    Done(String),
    NoChange(String),
    Refused(String),
}

/// Runs `resolve`; exit code 0 when done or already done, 2 when refused.
pub fn resolve(config: &Config, args: &ResolveArgs) -> Result<u8, RunError> {
    let review = Review::open(&config.review_db)?;
    let f = review.finding(args.finding_id)?;
    let outcome = match args.action {
        ResolveAction::Dismiss => {
            if f.state == "resolved" {
                Outcome::NoChange(format!("finding {} is already resolved", f.id))
            } else {
                Outcome::Done(format!("finding {} closed: {}", f.id, f.kind))
            }
        }
        ResolveAction::Reorder | ResolveAction::Rollback => act_on_reservation(config, &f, args)?,
    };
    let (result, text) = match &outcome {
        Outcome::Done(t) => ("done", t),
        Outcome::NoChange(t) => ("no_change", t),
        Outcome::Refused(t) => ("refused", t),
    };
    if args.dry_run {
        println!("dry run, nothing changed: {text}");
        return Ok(if result == "refused" { 2 } else { 0 });
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
            println!("{result}: {t}");
            Ok(0)
        }
    }
}

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
        let t = format!(
            "MySQL already holds order {} for reservation {rid}",
            order.id
        );
        return Ok(match args.action {
            ResolveAction::Rollback => Outcome::Refused(format!("{t}: releasing would oversell")),
            _ => Outcome::NoChange(t),
        });
    }
    let mut redis = redis_connect(config)?;
    let k = SaleKeys::new(sale_id);
    let workers = crate::redis_read::set_members(&mut redis, WORKERS)?;
    if args.dry_run {
        let flow: Option<String> = redis.hget(k.flow(), &rid)?;
        let stock: Option<i64> = redis.get(k.stock())?;
        let Some(flow) = flow else {
            return Ok(Outcome::NoChange(format!(
                "no flow record for {rid}: nothing to {action}"
            )));
        };
        return Ok(Outcome::Done(match args.action {
            ResolveAction::Reorder => format!("would LPUSH {flow} onto {}", k.queue()),
            _ => format!(
                "would release {rid}: stock {} -> {}, remove its flow record and purchase mark, \
                 status failed",
                stock.unwrap_or(0),
                stock.unwrap_or(0) + 1
            ),
        }));
    }
    if args.action == ResolveAction::Rollback {
        return Ok(match release(&mut redis, sale_id, &rid, &workers)? {
            ReleaseOutcome::Released { stock_after } => Outcome::Done(format!(
                "released {rid} in Redis: stock {} -> {stock_after}",
                stock_after - 1
            )),
            ReleaseOutcome::NotFound => {
                Outcome::NoChange(format!("no flow record for {rid}: already released"))
            }
            ReleaseOutcome::Confirmed => Outcome::Refused(format!(
                "{rid} is confirmed by a worker: its order is being committed"
            )),
            ReleaseOutcome::InFlight(list) => Outcome::Refused(format!(
                "{rid} is in {list}: a worker is applying it; try again later"
            )),
        });
    }
    let script = Script::new(REORDER_LUA);
    let mut inv = script.prepare_invoke();
    inv.key(k.flow())
        .key(k.status())
        .key(k.queue())
        .key(k.attempts());
    for w in &workers {
        inv.key(k.processing(w));
    }
    let reply: String = inv.arg(&rid).invoke(&mut redis)?;
    Ok(match reply.as_str() {
        "queued" => Outcome::Done(format!("queued the order message of {rid} again")),
        "already_queued" => Outcome::NoChange(format!("{rid} is already queued")),
        "in_flight" => Outcome::NoChange(format!("{rid} is being applied by a worker")),
        _ => Outcome::Refused(format!("no flow record for {rid}: nothing to queue")),
    })
}
