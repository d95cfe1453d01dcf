//! Owns the payments that came before their order: a payment service that
//! pays at once can reach a worker while the reservation's order message
//! is still queued, and [`crate::lifecycle::pay`] then records it
//! `unknown_reservation` (no order yet). Once the order exists, such a
//! payment is decided again exactly as if it had come then, with the time
//! the gateway received it: paid when the order is pending, the payment
//! was received at or before `pay_by` and is of the sale's price times
//! the order's quantity;
//! `late_payment`, `payment_after_cancellation` or
//! `payment_amount_mismatch` otherwise. Each one in its own transaction
//! under the `payments` row's lock, so two sweepers decide it once.
//!
//! Run by every worker's expiry sweep at the start of each pass, and for
//! the orders it closed before it expires them (`worker/src/expiry.rs`),
//! so an order paid in time is never expired for the order of two
//! messages.

use crate::lifecycle::{decide, tx_opts, LifecycleError, Payment, PaymentOutcome};
use crate::schema::placeholders;
use mysql::prelude::Queryable;
use mysql::{Conn, Params, Value};

/// A payment decided again now that its order exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The reservation (order) it paid for.
    pub reservation_id: String,
    /// Its outcome now (`Paid`: the order is paid; the caller writes the
    /// buyer's Redis status).
    pub outcome: PaymentOutcome,
}

/// Decides again up to `limit` payments recorded `unknown_reservation`
/// whose order now exists (found by `payments_sale_outcome`: such a row has
/// no sale yet), each in one transaction: the `payments` row locked and
/// still `unknown_reservation`, then [`decide`], then the row's outcome and
/// sale set. Returns what each became.
///
/// Errors: MySQL failures (the payments decided before stay decided).
pub fn apply(db: &mut Conn, limit: usize) -> Result<Vec<Decided>, LifecycleError> {
    let waiting: Vec<Waiting> = db.exec(format!("{WAITING} LIMIT ?"), (limit as u64,))?;
    decide_each(db, waiting)
}

/// [`apply`] for the payments of `reservation_ids` only, all of them: what
/// the sweep runs for the orders it closed, before it expires them (a
/// payment received in time whose receipt was forgotten once MySQL
/// recorded it `unknown_reservation`, `receipt.rs`).
///
/// Errors: as [`apply`].
pub fn apply_for(
    db: &mut Conn,
    reservation_ids: &[String],
) -> Result<Vec<Decided>, LifecycleError> {
    if reservation_ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "{WAITING} AND p.reservation_id IN ({})",
        placeholders(reservation_ids.len())
    );
    let params: Vec<Value> = reservation_ids
        .iter()
        .map(|r| Value::from(r.as_str()))
        .collect();
    let waiting: Vec<Waiting> = db.exec(sql, Params::Positional(params))?;
    decide_each(db, waiting)
}

/// Payment id, reservation id, amount, received (Unix ms).
type Waiting = (String, String, u64, u64);

const WAITING: &str = "SELECT p.payment_id, p.reservation_id, p.amount_cents,
        CAST(UNIX_TIMESTAMP(p.received_at) * 1000 AS UNSIGNED)
 FROM payments p JOIN orders o ON o.reservation_id = p.reservation_id
 WHERE p.sale_id IS NULL AND p.outcome = 'unknown_reservation'";

fn decide_each(db: &mut Conn, waiting: Vec<Waiting>) -> Result<Vec<Decided>, LifecycleError> {
    let mut out = Vec::with_capacity(waiting.len());
    for (payment_id, reservation_id, amount_cents, received_ms) in waiting {
        let mut tx = db.start_transaction(tx_opts())?;
        let still: Option<String> = tx.exec_first(
            "SELECT outcome FROM payments WHERE payment_id = ? FOR UPDATE",
            (&payment_id,),
        )?;
        if still.as_deref() != Some(PaymentOutcome::UnknownReservation.as_str()) {
            // Another sweeper decided it meanwhile.
            tx.rollback()?;
            continue;
        }
        let p = Payment {
            payment_id,
            reservation_id,
            amount_cents,
            received_ms,
        };
        let (sale_id, outcome) = decide(&mut tx, &p)?;
        tx.exec_drop(
            "UPDATE payments SET outcome = ?, sale_id = ?, applied_at = UTC_TIMESTAMP(3)
             WHERE payment_id = ?",
            (outcome.as_str(), sale_id, &p.payment_id),
        )?;
        tx.commit()?;
        log::info!(
            "payment {} of {}, received before its order existed: {}",
            p.payment_id,
            p.reservation_id,
            outcome.as_str()
        );
        out.push(Decided {
            reservation_id: p.reservation_id,
            outcome,
        });
    }
    Ok(out)
}
