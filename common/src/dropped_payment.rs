//! Owns the MySQL record of a payment an operator dropped (`seckill-reconciler
//! dead-letter drop payments`): a `payments` row of outcome `dropped`, so
//! that no later application of that `payment_id` (the expiry sweep's
//! receipt, a worker's redelivery, a restart) pays anything: `payments` is
//! keyed by `payment_id`, and [`crate::lifecycle::pay`] finds the row and
//! changes nothing ([`crate::lifecycle::Paid::Duplicate`]).
//!
//! Why MySQL decides: the expiry sweep may have taken the payment's receipt
//! from Redis a moment before the drop removed it and apply it a moment
//! after; both write the one `payments` row, so whichever commits first
//! stands and the other reads it. A drop that finds the payment applied
//! already says so ([`Dropped::AppliedBefore`]).

use crate::lifecycle::{LifecycleError, Payment, PaymentOutcome};
use mysql::prelude::Queryable;
use std::str::FromStr;

/// What [`record`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dropped {
    /// The payment is recorded as `dropped` (now, or by an earlier drop):
    /// it will never be applied.
    Recorded,
    /// The payment was applied before the drop, with this outcome (as
    /// stored): the drop changed nothing in MySQL.
    AppliedBefore(String),
}

/// Records payment `p` as dropped unless its id is in `payments` already
/// (one `INSERT IGNORE`, then reads the row back).
///
/// Errors: MySQL failures (nothing recorded: a repeat does it).
pub fn record<Q: Queryable>(db: &mut Q, p: &Payment) -> Result<Dropped, LifecycleError> {
    db.exec_drop(
        "INSERT IGNORE INTO payments
           (payment_id, reservation_id, sale_id, amount_cents, outcome, received_at)
         VALUES (?, ?, (SELECT sale_id FROM orders WHERE reservation_id = ?), ?, ?,
                 FROM_UNIXTIME(? / 1000))",
        (
            &p.payment_id,
            &p.reservation_id,
            &p.reservation_id,
            p.amount_cents,
            PaymentOutcome::Dropped.as_str(),
            p.received_ms,
        ),
    )?;
    let stored: Option<String> = db.exec_first(
        "SELECT outcome FROM payments WHERE payment_id = ?",
        (&p.payment_id,),
    )?;
    let stored =
        stored.ok_or_else(|| LifecycleError::Inconsistent("payment row vanished".into()))?;
    Ok(match PaymentOutcome::from_str(&stored) {
        Ok(PaymentOutcome::Dropped) => Dropped::Recorded,
        _ => Dropped::AppliedBefore(stored),
    })
}
