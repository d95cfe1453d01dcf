//! Owns `seckill-reconciler dead-letter requeue|drop payments ENTRY`: an
//! operator puts a payment dead letter back on the payment queue, or
//! removes it, audited in the review store as `requeue_payment` or
//! `drop_payment` (rows that name neither a finding nor a sale).
//!
//! Written ahead as `resolve` is (`settle.rs`): the `started` row is
//! committed before the effect; under the review file's write lock the
//! effect runs and its completion row is committed. The effect is one
//! script on the `{payments}` slot ([`SETTLE_LUA`]): it removes one copy of
//! the exact entry, for a requeue pushes its message back on the queue and
//! clears its failed attempts, and records the entry under the action's
//! mark in [`payment::DEAD_LETTERS_SETTLED`]; a mark already there means
//! done already, so a repeat changes nothing. A `started` row left by a kill
//! is completed by the next of these commands or `run`: `done` when the mark
//! is there, `failed` (nothing changed) when it is not.
//!
//! A drop of a payment also removes its receipt (`seckill_common::receipt`)
//! in that script, then records the payment in MySQL as `dropped`
//! (`seckill_common::dropped_payment`), so that neither the expiry sweep at
//! the order's `pay_by` nor a redelivery applies it; a drop that finds it
//! applied already says so. A kill between the script and MySQL leaves the
//! mark: the completion then records it in MySQL before writing `done`. A
//! requeue keeps the receipt: the payment is to be applied, once, by
//! whichever of the worker and the sweep comes first.
//!
//! The entry's open `dead_letter` finding is resolved by the operator, with
//! the note, and gets an action row naming the command's; a requeued
//! payment the worker gives up on again is a new dead letter and opens its
//! finding again.

use crate::cli::{by_and_note, err, Command, Opts, UsageError};
use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::outln;
use crate::payment_dead_letters::{self, payment_entries, PaymentEntry};
use crate::review::actions::PendingPaymentAction;
use crate::review::findings::Resolution;
use crate::review::{ActionKind, ActionStatus, Review};
use crate::settle::{with_note, Outcome};
use redis::Script;
use seckill_common::now_ms;
use seckill_common::payment::{self, Queued};
use seckill_common::receipt;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// `KEYS`: dead letters, queue, attempts, settled, the payment's receipt;
/// `ARGV`: the entry, the action's mark, the settled record, `requeue` or
/// `drop`, the message, its attempts field, its receipt field (empty: not
/// a payment). Replies 2 when the mark is already there (done before),
/// 1 when the entry moved, 0 when it was not there; an error reply, with
/// nothing changed, when a key holds another type.
const SETTLE_LUA: &str = concat!(
    seckill_common::lua_expect_types!(),
    r"
local bad = expect_types({KEYS[1], 'list', KEYS[2], 'list', KEYS[3], 'hash', KEYS[4], 'hash',
  KEYS[5], 'hash'})
if bad then return bad end
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 1 then return 2 end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if ARGV[4] == 'requeue' then
  redis.call('LPUSH', KEYS[2], ARGV[5])
  redis.call('HDEL', KEYS[3], ARGV[6])
elseif ARGV[7] ~= '' then
  redis.call('HDEL', KEYS[5], ARGV[7])
end
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
return 1"
);

/// What to do with the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentDeadLetterAction {
    /// Put its message back on the payment queue.
    Requeue,
    /// Remove it (kept in the settled hash).
    Drop,
}

impl PaymentDeadLetterAction {
    fn kind(self) -> ActionKind {
        match self {
            PaymentDeadLetterAction::Requeue => ActionKind::RequeuePayment,
            PaymentDeadLetterAction::Drop => ActionKind::DropPayment,
        }
    }
}

/// Arguments of `dead-letter requeue|drop payments`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentDeadLetterArgs {
    /// Requeue or drop.
    pub action: PaymentDeadLetterAction,
    /// The entry: its 16 hex digits, or its finding's subject.
    pub entry: String,
    /// Who acts.
    pub by: String,
    /// Why (required for a drop).
    pub note: Option<String>,
    /// Print what would change; change and record nothing.
    pub dry_run: bool,
}

/// Runs the command; exit code 0 when done or nothing was left to do.
///
/// Errors: no review file, SQLite or Redis failures; [`RunError::NoSuch`]
/// (exit 2, nothing changed, nothing recorded) when no entry or more than
/// one has that name; [`RunError::Refused`] (exit 1, nothing changed,
/// nothing recorded) for a requeue of a message the worker cannot read.
pub fn run(config: &Config, a: &PaymentDeadLetterArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let mut con = connect::redis(&config.services)?;
    if !a.dry_run {
        payment_dead_letters::complete_pending(&review, &mut con, || {
            connect::mysql(&config.services)
        })?;
    }
    let e = find(&mut con, &a.entry)?;
    if a.action == PaymentDeadLetterAction::Requeue {
        if let Err(why) = Queued::parse(e.message.as_bytes()) {
            return Err(RunError::Refused(format!(
                "entry {} ({}): its message does not parse ({why}); the worker would \
                 dead-letter it again: drop it instead",
                e.entry, e.subject
            )));
        }
    }
    let what = match a.action {
        PaymentDeadLetterAction::Requeue => "requeue",
        PaymentDeadLetterAction::Drop => "drop",
    };
    let intent = format!(
        "{what} payment dead letter {} ({}; reason: {})",
        e.entry, e.subject, e.reason
    );
    if a.dry_run {
        outln!("dry run: would {intent}; nothing changed");
        return Ok(0);
    }
    // A drop's MySQL step needs the primary: reached before anything is
    // recorded, so an unreachable one changes nothing.
    let mut db = match a.action {
        PaymentDeadLetterAction::Drop => Some(connect::mysql(&config.services)?),
        PaymentDeadLetterAction::Requeue => None,
    };
    let at = format_ms(now_ms());
    let detail = with_note(&intent, a.note.as_deref());
    let kind = a.action.kind();
    let id =
        review.record_payment_action(&at, &a.by, kind, &detail, ActionStatus::Started, None)?;
    let started = PendingPaymentAction {
        id,
        at,
        actor: a.by.clone(),
        action: kind,
    };
    let outcome = review.immediate(|| -> Result<Outcome, RunError> {
        if review.is_completed(id)? {
            return Err(RunError::Refused(format!(
                "action {id} was completed by another process as interrupted before its \
                 effect; nothing done: run the command again"
            )));
        }
        let mut o = effect(&mut con, &started, &e, a.action)?;
        if let (ActionStatus::Done, Some(db)) = (o.status, db.as_mut()) {
            if let Some(more) = payment_dead_letters::record_dropped(db, &e.raw)? {
                o.text = format!("{}; {more}", o.text);
            }
        }
        let now = format_ms(now_ms());
        let text = with_note(&o.text, a.note.as_deref());
        review.record_payment_action(&now, &a.by, kind, &text, o.status, Some(id))?;
        if o.status == ActionStatus::Done {
            settle_finding(&review, &e, a, &now, &format!("action {id}: {text}"))?;
        }
        Ok(o)
    })?;
    outln!("{}: {}", outcome.status, outcome.text);
    Ok(0)
}

/// Resolves the open `dead_letter` finding of entry `e`, if there is one,
/// by the operator with their note, and appends a row naming it to the
/// finding's actions (`findings show ID`).
///
/// Errors: SQLite failures.
fn settle_finding(
    review: &Review,
    e: &PaymentEntry,
    a: &PaymentDeadLetterArgs,
    now: &str,
    detail: &str,
) -> Result<(), RunError> {
    let Some(finding) = review.open_payment_dead_letter(&e.subject)? else {
        return Ok(());
    };
    let kind = a.action.kind();
    review.set_resolved(finding, &a.by, Resolution::By(kind), a.note.as_deref(), now)?;
    review.record_action(now, &a.by, finding, kind, detail, ActionStatus::Done, None)?;
    Ok(())
}

/// The one entry named `name` (16 hex digits, or a finding's subject).
///
/// Errors: [`RunError::NoSuch`] when none or several are.
fn find(con: &mut Con, name: &str) -> Result<PaymentEntry, RunError> {
    let mut hits: Vec<PaymentEntry> = payment_entries(con)?
        .into_iter()
        .filter(|e| e.entry == name || e.subject == name)
        .collect();
    // Copies of one text are one entry (a requeue or drop moves one copy).
    hits.sort_by(|a, b| a.raw.cmp(&b.raw));
    hits.dedup_by(|a, b| a.raw == b.raw);
    match hits.len() {
        1 => Ok(hits.remove(0)),
        0 => Err(RunError::NoSuch(format!(
            "no payment dead letter {name:?}: `seckill-reconciler dead-letter list payments` \
             lists them (entry or subject)"
        ))),
        n => Err(RunError::NoSuch(format!(
            "{n} payment dead letters are {name:?}: name one by its entry (`seckill-reconciler \
             dead-letter list payments`)"
        ))),
    }
}

/// Runs the script for `started` on entry `e`.
fn effect(
    con: &mut Con,
    started: &PendingPaymentAction,
    e: &PaymentEntry,
    action: PaymentDeadLetterAction,
) -> Result<Outcome, RunError> {
    let (what, field) = match action {
        PaymentDeadLetterAction::Requeue => (
            "requeue",
            Queued::parse(e.message.as_bytes())
                .map(|m| m.attempts_field())
                .unwrap_or_default(),
        ),
        PaymentDeadLetterAction::Drop => ("drop", String::new()),
    };
    // The receipt a drop removes: (reservation, field), none but for a payment.
    let receipt_of = match Queued::parse(e.message.as_bytes()) {
        Ok(Queued::Payment(m)) => (m.reservation_id.clone(), receipt::field(&m.payment_id)),
        _ => (String::new(), String::new()),
    };
    let record = serde_json::json!({
        "entry": String::from_utf8_lossy(&e.raw),
        "action": started.action.as_str(),
        "action_id": started.id,
        "actor": started.actor,
        "at": started.at,
    })
    .to_string();
    let n: i64 = Script::new(SETTLE_LUA)
        .key(payment::DEAD_LETTERS)
        .key(payment::QUEUE)
        .key(payment::ATTEMPTS)
        .key(payment::DEAD_LETTERS_SETTLED)
        .key(receipt::key(&receipt_of.0))
        .arg(&e.raw)
        .arg(started.mark())
        .arg(record)
        .arg(what)
        .arg(&e.message)
        .arg(field)
        .arg(&receipt_of.1)
        .invoke(con)?;
    Ok(match (n, action) {
        (0, _) => Outcome::no_change(format!(
            "payment dead letter {} ({}) was no longer there; nothing changed",
            e.entry, e.subject
        )),
        (_, PaymentDeadLetterAction::Requeue) => Outcome::done(format!(
            "put {} back on {} (entry {} kept in {})",
            e.subject,
            payment::QUEUE,
            e.entry,
            payment::DEAD_LETTERS_SETTLED
        )),
        (_, PaymentDeadLetterAction::Drop) => Outcome::done(format!(
            "dropped {} (entry {} kept in {})",
            e.subject,
            e.entry,
            payment::DEAD_LETTERS_SETTLED
        )),
    })
}

/// `dead-letter requeue|drop payments ENTRY --by NAME [--note TEXT]
/// [--dry-run]`; a drop needs its note.
pub fn parse(
    action: PaymentDeadLetterAction,
    entry: &str,
    opts: &mut Opts,
) -> Result<Command, UsageError> {
    let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
    if action == PaymentDeadLetterAction::Drop && note.is_none() {
        return err("--note TEXT is required: say why the payment is not applied");
    }
    Ok(Command::PaymentDeadLetter(PaymentDeadLetterArgs {
        action,
        entry: entry.to_string(),
        by,
        note,
        dry_run: opts.take("dry-run").is_some(),
    }))
}
