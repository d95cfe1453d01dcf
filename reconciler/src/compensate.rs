//! Owns compensation: the one automatic fix. For an order that has no stock
//! deduction in the ledger, insert the ledger row (`reason = 'compensation'`,
//! `delta` = − the order's quantity) and decrement `sales.available_stock`
//! by as many units, in one MySQL
//! transaction, keyed by the reservation id through the ledger's
//! `UNIQUE(reservation_id, reason)`: two runs (or a run repeated after a
//! crash) can never deduct twice.
//!
//! The design note's rule (point 5; the note is not part of this repository): an order
//! whose stock was not deducted is deducted by the job and logged for audit.

use mysql::prelude::Queryable;
use mysql::{Conn, TxOpts};

/// What one compensation came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compensation {
    /// Done: the new ledger row's id, the units deducted and
    /// `available_stock` after the decrement.
    Done {
        /// The order's quantity: the units deducted.
        units: u64,
        /// `stock_ledger.id` of the compensation row.
        ledger_id: u64,
        /// `sales.available_stock` after the decrement.
        available_after: i64,
    },
    /// A deduction (`order` or `compensation` row) already exists, or the
    /// order is gone: nothing to do, nothing changed.
    NotNeeded,
    /// `available_stock` cannot cover the order's units: a decrement would
    /// break `CHECK (available_stock >= 0)`. Nothing changed; a person decides.
    NoStockLeft,
}

/// MySQL's duplicate-key error: another run committed the same compensation.
const ER_DUP_ENTRY: u16 = 1062;

/// Compensates reservation `rid` of sale `sale_id` (see the module doc).
///
/// Errors: MySQL failures other than the duplicate key, which means
/// [`Compensation::NotNeeded`]. On any error the transaction is rolled back.
pub fn compensate(db: &mut Conn, sale_id: u64, rid: &str) -> mysql::Result<Compensation> {
    let mut tx = db.start_transaction(TxOpts::default())?;
    let inserted = tx.exec_drop(
        "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason)
         SELECT o.reservation_id, o.sale_id, o.user_id, -CAST(o.quantity AS SIGNED), 'compensation'
         FROM orders o
         WHERE o.reservation_id = ? AND o.sale_id = ?
           AND NOT EXISTS (SELECT 1 FROM stock_ledger l
                           WHERE l.reservation_id = o.reservation_id
                             AND l.reason IN ('order', 'compensation'))",
        (rid, sale_id),
    );
    match inserted {
        Ok(()) => {}
        Err(mysql::Error::MySqlError(e)) if e.code == ER_DUP_ENTRY => {
            tx.rollback()?;
            return Ok(Compensation::NotNeeded);
        }
        Err(e) => return Err(e),
    }
    if tx.affected_rows() == 0 {
        tx.rollback()?;
        return Ok(Compensation::NotNeeded);
    }
    let ledger_id = tx.last_insert_id().unwrap_or(0);
    let units: u64 = tx
        .exec_first(
            "SELECT quantity FROM orders WHERE reservation_id = ?",
            (rid,),
        )?
        .unwrap_or(1);
    tx.exec_drop(
        "UPDATE sales SET available_stock = available_stock - ?
         WHERE id = ? AND available_stock >= ?",
        (units, sale_id, units),
    )?;
    if tx.affected_rows() == 0 {
        tx.rollback()?;
        return Ok(Compensation::NoStockLeft);
    }
    let after: Option<i64> =
        tx.exec_first("SELECT available_stock FROM sales WHERE id = ?", (sale_id,))?;
    tx.commit()?;
    Ok(Compensation::Done {
        units,
        ledger_id,
        available_after: after.unwrap_or(0),
    })
}
