//! Owns `seckill-reconciler dead-letter drop SALE ENTRY`: an operator
//! removes a sale's dead letter that names no reservation (a message that
//! does not parse, one of another sale, anything pushed onto the list by
//! hand), which no `resolve` action can settle: the entry moves to the
//! bucket's archive (`seckill:{sale:ID}:dlq:archive`), so it leaves
//! `dead-letter list`, `queue show` and the worker's dead-letter gauge. An
//! entry naming a reservation is refused: a unit is held for it, settled
//! by `resolve ID --reorder` or `--rollback`.
//!
//! Written ahead as the other sale actions are: the `started` row (action
//! `drop_dead_letter`, naming the sale) is committed before the effect;
//! under the review file's write lock each entry moves in one script
//! (`seckill_common::dead_letter::archive_in`), wrapped with the action's
//! id, and the completion row is committed. A `started` row left by a kill
//! is completed by the next sale command or `run` ([`observe`]: `done` when
//! an archive holds an entry wrapped with the action's id, else `failed`).
//! The entry's open `dead_letter` finding is resolved by the operator with
//! the note, and gets a row naming the action.

use crate::cli::{by_and_note, err, Command, Opts, UsageError};
use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::outln;
use crate::redis_read::for_each_in_list;
use crate::review::findings::Resolution;
use crate::review::sale_actions::PendingSaleAction;
use crate::review::{ActionKind, ActionStatus, Review};
use crate::rules::dead_letter::fnv1a;
use crate::settle::{with_note, Outcome};
use seckill_common::dead_letter::{self, DeadLetter};
use seckill_common::keys::SaleKeys;
use seckill_common::now_ms;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;
use serde_json::json;

/// Arguments of `dead-letter drop SALE ENTRY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleDeadLetterDropArgs {
    /// The sale.
    pub sale_id: u64,
    /// The entry as `dead-letter list SALE` names it (`entry:HEX`, or HEX).
    pub entry: String,
    /// Who acts.
    pub by: String,
    /// Why (required).
    pub note: Option<String>,
    /// Print what would change; change and record nothing.
    pub dry_run: bool,
}

/// One entry of a bucket's dead-letter list, verbatim, with its name.
struct Found {
    keys: SaleKeys,
    raw: String,
    /// The reservation it names, if any.
    rid: Option<String>,
}

/// The name `dead-letter list SALE` and the `dead_letter` rule give `raw`:
/// its reservation id, else `entry:` and the FNV-1a of its message (of the
/// whole text for an entry that is not a dead-letter entry).
fn name_of(raw: &[u8]) -> (String, Option<String>) {
    match DeadLetter::parse(raw) {
        Some(d) => match d.reservation_id {
            Some(rid) => (rid.clone(), Some(rid)),
            None => (format!("entry:{:016x}", fnv1a(d.message.as_bytes())), None),
        },
        None => (format!("entry:{:016x}", fnv1a(raw)), None),
    }
}

/// Every entry of sale `sale_id` (all its buckets) named `name`.
///
/// Errors: Redis failures.
fn find(con: &mut Con, sale_id: u64, name: &str) -> Result<Vec<Found>, RunError> {
    let want = if name.starts_with("entry:") {
        name.to_string()
    } else {
        format!("entry:{name}")
    };
    let n = seckill_common::buckets::count(con, sale_id)?.unwrap_or(1);
    let mut out = Vec::new();
    for keys in seckill_common::buckets::all(sale_id, n) {
        for_each_in_list(con, &keys.dead_letter(), |raw| {
            let (named, rid) = name_of(raw);
            if named == want || named == name {
                out.push(Found {
                    keys,
                    raw: String::from_utf8_lossy(raw).into_owned(),
                    rid,
                });
            }
        })?;
    }
    Ok(out)
}

/// Runs the command; exit code 0 when done or nothing was left to do.
///
/// Errors: no review file, SQLite, Redis or MySQL failures;
/// [`RunError::NoSuch`] (exit 2) when the sale holds no entry of that
/// name; [`RunError::Refused`] (exit 1) for an entry naming a reservation;
/// nothing changed or recorded in either case.
pub fn run(config: &Config, a: &SaleDeadLetterDropArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let mut con = connect::redis(&config.services)?;
    if !a.dry_run {
        let mut db = connect::mysql(&config.services)?;
        crate::sale_admin_settle::complete_pending(&review, &mut con, &mut db)?;
    }
    let found = find(&mut con, a.sale_id, &a.entry)?;
    if found.is_empty() {
        return Err(RunError::NoSuch(format!(
            "no dead letter {:?} in sale {}: `seckill-reconciler dead-letter list {}` lists them",
            a.entry, a.sale_id, a.sale_id
        )));
    }
    if let Some(rid) = found.iter().find_map(|f| f.rid.as_deref()) {
        return Err(RunError::Refused(format!(
            "dead letter {} of sale {} names reservation {rid}, which holds a unit: settle it \
             with `seckill-reconciler resolve ID --reorder` or `--rollback` (its finding: \
             `seckill-reconciler findings --sale {}`)",
            a.entry, a.sale_id, a.sale_id
        )));
    }
    let name = name_of(found[0].raw.as_bytes()).0;
    let intent = format!(
        "drop {} dead letter(s) {name} of sale {}",
        found.len(),
        a.sale_id
    );
    if a.dry_run {
        outln!("dry run: would {intent}; nothing changed");
        return Ok(0);
    }
    let at = format_ms(now_ms());
    let kind = ActionKind::DropDeadLetter;
    let detail = with_note(&intent, a.note.as_deref());
    let id = review.record_sale_action(
        &at,
        &a.by,
        a.sale_id,
        kind,
        &detail,
        ActionStatus::Started,
        None,
    )?;
    let outcome = review.immediate(|| -> Result<Outcome, RunError> {
        if review.is_completed(id)? {
            return Err(RunError::Refused(format!(
                "action {id} was completed by another process as interrupted before its \
                 effect; nothing done: run the command again"
            )));
        }
        let o = effect(&mut con, &found, &name, id, &a.by, &at)?;
        let now = format_ms(now_ms());
        let text = with_note(&o.text, a.note.as_deref());
        review.record_sale_action(&now, &a.by, a.sale_id, kind, &text, o.status, Some(id))?;
        if o.status == ActionStatus::Done {
            if let Some(f) = review.open_sale_dead_letter(a.sale_id, &name)? {
                let by = a.by.as_str();
                let note = a.note.as_deref();
                review.set_resolved(f, by, Resolution::By(kind), note, &now)?;
                let row = format!("action {id}: {text}");
                review.record_action(&now, by, f, kind, &row, ActionStatus::Done, None)?;
            }
        }
        Ok(o)
    })?;
    outln!("{}: {}", outcome.status, outcome.text);
    Ok(0)
}

/// Moves each of `found` to its bucket's archive, wrapped with action `id`.
fn effect(
    con: &mut Con,
    found: &[Found],
    name: &str,
    id: i64,
    by: &str,
    at: &str,
) -> Result<Outcome, RunError> {
    let mut moved = 0;
    let mut archive = String::new();
    for f in found {
        let wrapped = json!({
            "entry": f.raw,
            "settled_by": {"action": ActionKind::DropDeadLetter.as_str(), "actor": by,
                           "action_id": id, "at": at},
        })
        .to_string();
        if dead_letter::archive_in(con, f.keys, &f.raw, &wrapped)? {
            moved += 1;
            archive = f.keys.dead_letter_archive();
        }
    }
    Ok(if moved == 0 {
        Outcome::no_change(format!(
            "dead letter {name} was no longer there; nothing changed"
        ))
    } else {
        Outcome::done(format!(
            "dropped {moved} dead letter(s) {name} (kept in {archive})"
        ))
    })
}

/// What interrupted drop `p` came to: `done` when an archive of its sale
/// holds an entry wrapped with its id, else `failed` (nothing changed).
///
/// Errors: Redis failures.
pub fn observe(con: &mut Con, p: &PendingSaleAction) -> Result<Outcome, RunError> {
    let n = seckill_common::buckets::count(con, p.sale_id)?.unwrap_or(1);
    let mut found = None;
    for keys in seckill_common::buckets::all(p.sale_id, n) {
        for_each_in_list(con, &keys.dead_letter_archive(), |raw| {
            let v: serde_json::Value = serde_json::from_slice(raw).unwrap_or_default();
            let by = &v["settled_by"];
            if by["action"] == ActionKind::DropDeadLetter.as_str() && by["action_id"] == p.id {
                found = Some(keys.dead_letter_archive());
            }
        })?;
    }
    Ok(match found {
        Some(archive) => Outcome::done(format!(
            "dropped dead letter(s) of sale {} (recorded after an interruption: {archive} \
             holds an entry of this action)",
            p.sale_id
        )),
        None => Outcome::failed("interrupted before its effect; nothing changed".to_string()),
    })
}

/// `dead-letter drop SALE ENTRY --by NAME --note TEXT [--dry-run]`.
pub fn parse(sale_id: u64, entry: &str, opts: &mut Opts) -> Result<Command, UsageError> {
    let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
    if note.is_none() {
        return err("--note TEXT is required: say why the dead letter is dropped");
    }
    Ok(Command::SaleDeadLetterDrop(SaleDeadLetterDropArgs {
        sale_id,
        entry: entry.to_string(),
        by,
        note,
        dry_run: opts.take("dry-run").is_some(),
    }))
}
