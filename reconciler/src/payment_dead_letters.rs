//! Owns the payment dead-letter list as the operator sees it: each entry
//! named by its hash and its finding's subject ([`payment_entries`]), a
//! drop's MySQL step ([`record_dropped`]), and the completion of a requeue
//! or drop a killed command left `started` ([`complete_pending`]: `done`
//! when the action's mark is in [`payment::DEAD_LETTERS_SETTLED`], after
//! a drop's MySQL step; `failed` when it is not). The requeue and drop
//! themselves are `cmd/payment_dlq.rs`.

use crate::error::RunError;
use crate::redis_read::for_each_in_list;
use crate::review::{ActionKind, Review};
use crate::rules::dead_letter::fnv1a;
use crate::settle::Outcome;
use seckill_common::dropped_payment::{self, Dropped};
use seckill_common::now_ms;
use seckill_common::payment::{self, Queued};
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;

/// One payment dead letter as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentEntry {
    /// The entry's text as stored (what `LREM` must match).
    pub raw: Vec<u8>,
    /// FNV-1a of `raw`, 16 lowercase hex digits.
    pub entry: String,
    /// Its finding's subject.
    pub subject: String,
    /// The worker's reason.
    pub reason: String,
    /// The queued message, as the entry holds it.
    pub message: String,
    /// When the gateway received it (Unix ms), when the message says.
    pub received_ms: Option<u64>,
}

/// Every payment dead letter, head first.
///
/// Errors: Redis failures.
pub fn payment_entries(con: &mut Con) -> redis::RedisResult<Vec<PaymentEntry>> {
    let mut out = Vec::new();
    for_each_in_list(con, seckill_common::payment::DEAD_LETTERS, |raw| {
        out.push(payment_entry(raw))
    })?;
    Ok(out)
}

/// What `raw` is, named as its finding is.
pub fn payment_entry(raw: &[u8]) -> PaymentEntry {
    let subject = crate::rules::payment_dead_letter::observations(&[raw.to_vec()])
        .pop()
        .map(|o| o.subject)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(raw).unwrap_or_default();
    let message = v["message"].as_str().unwrap_or_default().to_string();
    let m: serde_json::Value = serde_json::from_str(&message).unwrap_or_default();
    PaymentEntry {
        raw: raw.to_vec(),
        entry: format!("{:016x}", fnv1a(raw)),
        subject,
        reason: v["reason"]
            .as_str()
            .unwrap_or("(not a dead-letter entry)")
            .to_string(),
        message,
        received_ms: m["received_ms"].as_u64(),
    }
}

/// The MySQL step of a drop of dead letter `raw` (an entry as stored): its
/// payment recorded as `dropped` (`seckill_common::dropped_payment`), so no
/// receipt or redelivery applies it. Returns what to add to the outcome;
/// `None` for a cancellation or a message that does not parse (nothing in
/// MySQL to keep from happening).
///
/// Errors: MySQL failures (nothing recorded; the action's completion does
/// it).
pub fn record_dropped(db: &mut mysql::Conn, raw: &[u8]) -> Result<Option<String>, RunError> {
    let e = payment_entry(raw);
    let Ok(Queued::Payment(m)) = Queued::parse(e.message.as_bytes()) else {
        return Ok(None);
    };
    Ok(Some(match dropped_payment::record(db, &m.payment())? {
        Dropped::Recorded => format!(
            "recorded in MySQL as dropped: neither its receipt nor a redelivery of {} applies it",
            m.payment_id
        ),
        Dropped::AppliedBefore(outcome) => format!(
            "MySQL had applied it before the drop, as {outcome}, which stands (a paid order \
             stays paid: refund it with the payment service and cancel the order if the \
             buyer is not to have it)"
        ),
    }))
}

/// Completes every `started` action on the payment queue without its
/// completion row (see the module doc); returns how many. `mysql` opens
/// the primary, for a drop's MySQL step.
///
/// Errors: SQLite, Redis or MySQL failures (nothing recorded; a later
/// attempt does it).
pub fn complete_pending(
    review: &Review,
    con: &mut Con,
    mysql: impl Fn() -> Result<mysql::Conn, RunError>,
) -> Result<usize, RunError> {
    if review.pending_payment_actions()?.is_empty() {
        return Ok(0);
    }
    review.immediate(|| -> Result<usize, RunError> {
        let pending = review.pending_payment_actions()?; // again, under the lock
        let mut db = None;
        for p in &pending {
            let settled: Option<String> = redis::cmd("HGET")
                .arg(payment::DEAD_LETTERS_SETTLED)
                .arg(p.mark())
                .query(con)?;
            let o = if let Some(record) = settled {
                let mut text = format!(
                    "recorded after an interruption: {} holds this action's mark",
                    payment::DEAD_LETTERS_SETTLED
                );
                if p.action == ActionKind::DropPayment {
                    let v: serde_json::Value = serde_json::from_str(&record).unwrap_or_default();
                    let raw = v["entry"].as_str().unwrap_or_default();
                    if db.is_none() {
                        db = Some(mysql()?);
                    }
                    if let Some(db) = db.as_mut() {
                        if let Some(more) = record_dropped(db, raw.as_bytes())? {
                            text = format!("{text}; {more}");
                        }
                    }
                }
                Outcome::done(text)
            } else {
                Outcome::failed("interrupted before its effect; nothing changed".to_string())
            };
            let now = format_ms(now_ms());
            review.record_payment_action(
                &now,
                &p.actor,
                p.action,
                &o.text,
                o.status,
                Some(p.id),
            )?;
            log::warn!(
                "action {} ({} by {}) was interrupted; recorded now as {}: {}",
                p.id,
                p.action,
                p.actor,
                o.status.as_str(),
                o.text
            );
        }
        Ok(pending.len())
    })
}
