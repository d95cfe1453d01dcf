//! Owns what the reconciler reads from MySQL: the sales to check, a sale's
//! snapshot (its totals, the orders and the stock ledger streamed row by
//! row, never loaded whole, in one consistent snapshot), and point look-ups
//! for the few reservations that need a closer look.
//!
//! Reservation ids travel as `u128` (32 hex digits decoded): 16 bytes per
//! order instead of a 56-byte `String`, and they sort and binary-search fast.

use mysql::prelude::Queryable;
use mysql::Conn;
use seckill_common::order::{OrderStatus, RELEASED_SQL};
use std::time::Duration;

/// Most ids in one `IN (...)` look-up.
pub const LOOKUP_CHUNK: usize = 500;

/// Decodes a reservation id (32 lowercase hex digits) into a `u128`;
/// `None` for anything else.
pub fn rid_to_u128(s: &[u8]) -> Option<u128> {
    if s.len() != 32 {
        return None;
    }
    let mut v: u128 = 0;
    for &b in s {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u128::from(d);
    }
    Some(v)
}

/// The reservation id text of `v` (inverse of [`rid_to_u128`]).
pub fn u128_to_rid(v: u128) -> String {
    format!("{v:032x}")
}

/// A sale's MySQL totals, read in one consistent snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Books {
    /// `sales.total_stock`.
    pub total_stock: i64,
    /// `sales.available_stock`.
    pub available_stock: i64,
    /// Units deducted by the ledger: `-SUM(delta)` over every row of the
    /// sale but its `add_stock` ones (`sale add-stock`: counted in
    /// `total_stock`).
    pub ledger_deductions: i64,
    /// Units held by the orders of the sale that hold units (confirmed,
    /// pending, paid: not the released ones): the sum of their quantities.
    pub orders: i64,
    /// Of those, the units of the orders `paid`.
    pub paid: i64,
    /// `sales.per_user_limit`: the units one buyer may hold (`L`).
    pub per_user_limit: i64,
}

impl Books {
    /// Whether `total_stock − ledger deductions = available_stock`.
    pub fn balanced(&self) -> bool {
        self.total_stock - self.ledger_deductions == self.available_stock
    }
}

/// One order, for the evidence of a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderDetail {
    /// `orders.id`.
    pub id: u64,
    /// `orders.reservation_id`.
    pub reservation_id: String,
    /// `orders.user_id`.
    pub user_id: String,
    /// `orders.reserved_at` as Unix ms (0 when NULL).
    pub reserved_at_ms: u64,
    /// `orders.quantity`: its units.
    pub quantity: u32,
}

/// Ids of the sales to reconcile: those that end after `now − lookback`
/// (active, upcoming, or ended within the lookback), by MySQL's clock.
pub fn sales_to_check(db: &mut Conn, lookback: Duration) -> mysql::Result<Vec<u64>> {
    db.exec(
        "SELECT id FROM sales WHERE ends_at >= UTC_TIMESTAMP(3) - INTERVAL ? SECOND ORDER BY id",
        (lookback.as_secs(),),
    )
}

/// What one consistent snapshot of a sale's MySQL side holds
/// ([`snapshot`]).
#[derive(Debug)]
pub struct Snapshot {
    /// The totals.
    pub books: Books,
    /// The reservation ids of the stock deductions (ledger rows with
    /// reason `order` or `compensation`), sorted; ids that are not 32 hex
    /// digits are skipped (no order can match them either).
    pub deducted: Vec<u128>,
    /// The reservation ids of the ledger's releases (rows with reason
    /// `release`: the unit of an expired or cancelled order given back),
    /// sorted.
    pub released: Vec<u128>,
}

/// Reads sale `sale_id`'s MySQL side in one consistent snapshot, each table
/// once: the sale row, the reservation ids of its orders that hold a unit
/// (not the released ones, whose flow record Redis keeps in `released`),
/// streamed into `on_order` one at a time (the raw bytes of
/// `orders.reservation_id`) and their units counted (the `paid` ones too), then its ledger rows, streamed,
/// summed and the deductions' ids kept. `None` when MySQL has no such
/// sale. A worker's commit is either wholly in it or wholly out. The
/// totals come from the same streams, not from `COUNT(*)` and `SUM`
/// queries that would read both tables a second time (docs/PERFORMANCE.md,
/// reconciler).
///
/// Errors: MySQL failures.
pub fn snapshot(
    db: &mut Conn,
    sale_id: u64,
    mut on_order: impl FnMut(&[u8]),
) -> mysql::Result<Option<Snapshot>> {
    db.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")?;
    let result = (|| {
        let sale: Option<(i64, i64, i64)> = db.exec_first(
            "SELECT total_stock, available_stock, per_user_limit FROM sales WHERE id = ?",
            (sale_id,),
        )?;
        let Some((total_stock, available_stock, per_user_limit)) = sale else {
            return Ok(None);
        };
        let mut orders = 0i64;
        let mut paid = 0i64;
        let rows = db.exec_iter(
            format!(
                "SELECT reservation_id, status = '{}', quantity FROM orders WHERE sale_id = ? AND status NOT IN {RELEASED_SQL}",
                OrderStatus::Paid.as_str()
            ),
            (sale_id,),
        )?;
        for row in rows {
            let mut row = row?;
            let units = row.take_opt::<i64, _>(2).and_then(Result::ok).unwrap_or(1);
            orders += units;
            if row.take_opt::<i64, _>(1).and_then(Result::ok) == Some(1) {
                paid += units;
            }
            if let Some(Ok(id)) = row.take_opt::<Vec<u8>, _>(0) {
                on_order(&id);
            }
        }
        let (deducted, released, ledger_deductions) = ledger(db, sale_id)?;
        Ok(Some(Snapshot {
            books: Books {
                total_stock,
                available_stock,
                ledger_deductions,
                orders,
                paid,
                per_user_limit,
            },
            deducted,
            released,
        }))
    })();
    db.query_drop("COMMIT")?;
    result
}

/// Streams every ledger row of the sale: the sorted ids of its deductions
/// (reason `order` or `compensation`), the sorted ids of its releases
/// (reason `release`) and the units the whole ledger deducts
/// (`-SUM(delta)` but over `add_stock` rows, whose units `total_stock`
/// holds; as `seckill_common::schema::ledger_deductions`).
fn ledger(db: &mut Conn, sale_id: u64) -> mysql::Result<(Vec<u128>, Vec<u128>, i64)> {
    let mut ids = Vec::new();
    let mut released = Vec::new();
    let mut deducted = 0i64;
    let rows = db.exec_iter(
        "SELECT reservation_id, delta,
                CASE WHEN reason IN ('order', 'compensation') THEN 1
                     WHEN reason = 'release' THEN 2 ELSE 0 END
         FROM stock_ledger WHERE sale_id = ? AND reason <> 'add_stock'",
        (sale_id,),
    )?;
    for row in rows {
        let mut row = row?;
        deducted -= row.take_opt::<i64, _>(1).and_then(Result::ok).unwrap_or(0);
        let into = match row.take_opt::<i64, _>(2).and_then(Result::ok) {
            Some(1) => &mut ids,
            Some(2) => &mut released,
            _ => continue,
        };
        if let Some(Ok(id)) = row.take_opt::<Vec<u8>, _>(0) {
            if let Some(v) = rid_to_u128(&id) {
                into.push(v);
            }
        }
    }
    ids.sort_unstable();
    released.sort_unstable();
    Ok((ids, released, deducted))
}

/// One stock-ledger deduction, for the evidence of a
/// `ledger_without_order` finding and the fix that re-creates its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deduction {
    /// `stock_ledger.id`.
    pub id: u64,
    /// `stock_ledger.reservation_id`.
    pub reservation_id: String,
    /// `stock_ledger.sale_id`.
    pub sale_id: u64,
    /// `stock_ledger.user_id`.
    pub user_id: String,
    /// `stock_ledger.reason`: `order` or `compensation`.
    pub reason: String,
    /// `stock_ledger.delta`: − the units deducted.
    pub delta: i64,
    /// `stock_ledger.created_at`, Unix ms.
    pub created_ms: u64,
}

/// The deduction of each of `rids` (any number; [`LOOKUP_CHUNK`] at a time)
/// that MySQL has not given back (no `release` row of the same
/// reservation); at most one per reservation (the first).
///
/// Errors: MySQL failures.
pub fn deductions_of<Q: Queryable>(db: &mut Q, rids: &[String]) -> mysql::Result<Vec<Deduction>> {
    let mut out: Vec<Deduction> = Vec::new();
    for chunk in rids.chunks(LOOKUP_CHUNK) {
        let sql = format!(
            "SELECT l.id, l.reservation_id, l.sale_id, l.user_id, l.reason,
                    CAST(UNIX_TIMESTAMP(l.created_at) * 1000 AS SIGNED), l.delta
             FROM stock_ledger l
             WHERE l.reservation_id IN ({}) AND l.reason IN ('order', 'compensation')
               AND NOT EXISTS (SELECT 1 FROM stock_ledger r
                               WHERE r.reservation_id = l.reservation_id
                                 AND r.reason = 'release')
             ORDER BY l.reservation_id, l.id",
            seckill_common::schema::placeholders(chunk.len())
        );
        type Row = (u64, String, u64, String, String, i64, i64);
        let rows: Vec<Row> = db.exec(sql, chunk.to_vec())?;
        for (id, reservation_id, sale_id, user_id, reason, at, delta) in rows {
            if out.last().map(|d| &d.reservation_id) == Some(&reservation_id) {
                continue;
            }
            out.push(Deduction {
                id,
                reservation_id,
                sale_id,
                user_id,
                reason,
                delta,
                created_ms: at.max(0) as u64,
            });
        }
    }
    Ok(out)
}

/// The orders among `rids` (any number; looked up [`LOOKUP_CHUNK`] at a time).
pub fn order_details(db: &mut Conn, rids: &[String]) -> mysql::Result<Vec<OrderDetail>> {
    let mut out = Vec::new();
    for chunk in rids.chunks(LOOKUP_CHUNK) {
        let sql = format!(
            "SELECT id, reservation_id, user_id,
                    CAST(COALESCE(UNIX_TIMESTAMP(reserved_at) * 1000, 0) AS SIGNED), quantity
             FROM orders WHERE reservation_id IN ({})",
            seckill_common::schema::placeholders(chunk.len())
        );
        let rows: Vec<(u64, String, String, i64, u32)> = db.exec(sql, chunk.to_vec())?;
        out.extend(rows.into_iter().map(|(id, r, u, at, q)| OrderDetail {
            id,
            reservation_id: r,
            user_id: u,
            reserved_at_ms: at.max(0) as u64,
            quantity: q,
        }));
    }
    Ok(out)
}

/// A payment the worker did not apply as `paid`, or a delivery of a
/// `payment_id` applied before that conflicts with it: what the payment
/// findings are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OddPayment {
    /// `payments.payment_id`.
    pub payment_id: String,
    /// The reservation it was for.
    pub reservation_id: String,
    /// Amount paid, cents.
    pub amount_cents: u64,
    /// `payments.outcome` (of the first payment, for a conflict).
    pub outcome: String,
    /// When the gateway received it, Unix ms (Redis's clock).
    pub received_ms: u64,
    /// For a row of `payment_conflicts`: the first payment of this id, the
    /// one that stands (its reservation and amount).
    pub conflicts_with: Option<(String, u64)>,
    /// The buyer of the reservation's order, when MySQL holds one (not
    /// read for a conflict).
    pub user_id: Option<String>,
    /// What the order is due, cents: the sale's price times the order's
    /// quantity, when MySQL holds the order (not read for a conflict).
    pub expected_cents: Option<u64>,
}

/// The payments of sale `sale_id` (or, with `None`, of no known sale)
/// whose outcome is not `paid`, then the conflicting deliveries of the
/// sale's payment ids (`payment_conflicts`, of the sale of the payment
/// that stands), each ordered by payment id.
///
/// Errors: MySQL failures.
pub fn odd_payments(db: &mut Conn, sale_id: Option<u64>) -> mysql::Result<Vec<OddPayment>> {
    type Row = (
        String,
        String,
        u64,
        String,
        i64,
        Option<String>,
        Option<u64>,
        Option<String>,
        Option<u64>,
    );
    let rows: Vec<Row> = db.exec(
        "SELECT p.payment_id, p.reservation_id, p.amount_cents, p.outcome,
                CAST(UNIX_TIMESTAMP(p.received_at) * 1000 AS SIGNED), NULL, NULL,
                o.user_id, s.price_cents * o.quantity
         FROM payments p
         LEFT JOIN orders o ON o.reservation_id = p.reservation_id
         LEFT JOIN sales s ON s.id = o.sale_id
         WHERE p.sale_id <=> ? AND p.outcome <> 'paid'
         UNION ALL
         SELECT c.payment_id, c.reservation_id, c.amount_cents, p.outcome,
                CAST(UNIX_TIMESTAMP(c.received_at) * 1000 AS SIGNED),
                p.reservation_id, p.amount_cents, NULL, NULL
         FROM payment_conflicts c JOIN payments p ON p.payment_id = c.payment_id
         WHERE p.sale_id <=> ?
         ORDER BY 1, 2, 3",
        (sale_id, sale_id),
    )?;
    Ok(rows
        .into_iter()
        .map(
            |(
                payment_id,
                reservation_id,
                amount_cents,
                outcome,
                at,
                first_rid,
                first_amount,
                user_id,
                expected_cents,
            )| {
                OddPayment {
                    payment_id,
                    reservation_id,
                    amount_cents,
                    outcome,
                    received_ms: at.max(0) as u64,
                    conflicts_with: first_rid.zip(first_amount),
                    user_id,
                    expected_cents,
                }
            },
        )
        .collect())
}

/// The order of reservation `rid`, if MySQL holds one.
pub fn order_of(db: &mut Conn, rid: &str) -> mysql::Result<Option<OrderDetail>> {
    Ok(order_details(db, &[rid.to_string()])?.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_ids_round_trip_through_u128() {
        let id = "0123456789abcdef0123456789abcdef";
        let v = rid_to_u128(id.as_bytes()).unwrap();
        assert_eq!(u128_to_rid(v), id);
        assert_eq!(rid_to_u128(b"0123456789ABCDEF0123456789abcdef"), None);
        assert_eq!(rid_to_u128(b"short"), None);
        let zero = "0".repeat(32);
        assert_eq!(rid_to_u128(zero.as_bytes()), Some(0));
    }
}
