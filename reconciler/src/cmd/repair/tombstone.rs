//! Owns `sale repair` of an archived sale: its tombstone, which Redis lost
//! (late buyers would hear 404 instead of 403 `sale_ended`), written again
//! from MySQL's row (`sale_archive::tombstone_again`), audited as a sale
//! action written ahead (`started`, the effect, `done`); an interrupted one
//! is completed by the next sale command or `run`
//! (`sale_admin_settle::complete_pending`: the write is repeatable).

use super::RepairArgs;
use crate::error::RunError;
use crate::output::outln;
use crate::review::{ActionKind, ActionStatus, Review};
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// What the repair of an archived sale says it did.
pub const WRITTEN: &str =
    "is archived and Redis had lost its tombstone: written again (late buyers hear 403 sale_ended)";

/// Repairs archived sale `args.sale_id`: writes its tombstone again when
/// Redis lost it; nothing (and no row) when Redis holds it. Exit 0.
///
/// Errors: Redis, MySQL or SQLite failures.
pub fn run(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
    args: &RepairArgs,
) -> Result<u8, RunError> {
    let id = args.sale_id;
    if !args.dry_run {
        crate::sale_admin_settle::complete_pending(review, redis, db)?;
    }
    let kept: bool = redis::cmd("HEXISTS")
        .arg(seckill_common::keys::SaleKeys::new(id).meta())
        .arg(seckill_common::archive::ARCHIVED_FIELD)
        .query(redis)?;
    if kept {
        outln!("sale {id} is archived and its tombstone is in Redis; nothing to repair");
        return Ok(0);
    }
    if args.dry_run {
        outln!("dry run, nothing changed: write archived sale {id}'s tombstone again");
        return Ok(0);
    }
    let intent = format!("started: write archived sale {id}'s tombstone again");
    let at = format_ms(now_ms());
    let started = review.record_sale_action(
        &at,
        &args.by,
        id,
        ActionKind::Repair,
        &crate::settle::with_note(&intent, args.note.as_deref()),
        ActionStatus::Started,
        None,
    )?;
    let text = review.immediate(|| -> Result<String, RunError> {
        if review.is_completed(started)? {
            return Err(RunError::Refused(format!(
                "action {started} was completed by another process; run the command again"
            )));
        }
        crate::sale_archive::tombstone_again(redis, db, id)?;
        let text = format!("sale {id} {WRITTEN}");
        let now = format_ms(now_ms());
        let detail = crate::settle::with_note(&text, args.note.as_deref());
        review.record_sale_action(
            &now,
            &args.by,
            id,
            ActionKind::Repair,
            &detail,
            ActionStatus::Done,
            Some(started),
        )?;
        Ok(text)
    })?;
    outln!("done: {text}");
    Ok(0)
}
