//! Owns the MySQL side of the worker: one transaction per batch that turns
//! order messages into orders, stock ledger rows and one guarded stock
//! decrement, idempotently (a redelivered message changes nothing).
//!
//! Transaction, at `READ COMMITTED` (no gap locks, so fewer deadlocks; set
//! once per session, so `BEGIN` is one round trip):
//!
//! 1. `SELECT available_stock FROM sales WHERE id = ? FOR UPDATE` locks the
//!    sale row first. Every worker applying this sale queues here, so the
//!    orders they insert never interleave and the lock order is the same for
//!    everyone (the usual cause of deadlocks, duplicate-key S-locks taken in
//!    different orders, cannot form a cycle). No row: unknown sale.
//! 2. Read which reservation ids (or `(sale_id, user_id)` pairs) already have
//!    an order. A message whose reservation id has one is already done and
//!    left alone (idempotency). In a sale of one unit per buyer
//!    (`sales.per_user_limit` = 1), a message whose buyer holds an order of
//!    this sale from ANOTHER reservation (in MySQL, or earlier in this batch)
//!    is a [`Conflict`]: not applied, not done; the caller dead-letters it.
//!    A sale of several units per buyer has no such conflict: a buyer may
//!    hold several orders. There the read also sums the units the batch's
//!    buyers hold (`seckill_common::buyer_units`); a message that would
//!    take its buyer over `per_user_limit` (with what they hold in MySQL
//!    and the messages before it in the batch) is [`OverLimit`]: not
//!    applied, not done; the caller dead-letters it. Redis keeps the limit
//!    for every purchase; this keeps it when Redis forgot units a buyer
//!    holds (a data loss that new purchases masked from the data-loss watch).
//! 3. `INSERT IGNORE INTO orders` for the rest (`quantity` = the message's,
//!    `multi_unit` = the sale's `per_user_limit` > 1, which makes the
//!    order's live key its reservation id, `schema.rs` migration 9;
//!    `reserved_at = FROM_UNIXTIME(ms / 1000)`; `status = 'confirmed'` when
//!    the sale has no payment window, else `pending_payment` with `pay_by`
//!    = reservation time + `sales.payment_window_ms`; a reservation that
//!    sat in the queue past its deadline gets a `pay_by` in the past, and
//!    the expiry sweep releases it like any other, `expiry.rs`). A buyer
//!    "holds" an order unless it was released (`live_user_id`).
//! 4. `INSERT IGNORE INTO stock_ledger` one row per new order
//!    (`delta` = − its quantity, `reason = 'order'`), the rows the
//!    reconciler reads.
//! 5. `UPDATE sales SET available_stock = available_stock - n WHERE id = ?
//!    AND available_stock >= n` with `n` = the units of the new orders (the
//!    sum of their quantities). No row changed: the batch would oversell;
//!    roll back and report [`Applied::StockExhausted`] (the caller then
//!    applies the batch message by message, so a message of N units that
//!    does not fit is refused alone).
//!
//! The fresh path, tried first in a sale of one unit per buyer (a sale of
//! several goes to steps 2 to 5 in the transaction of step 1, as the units
//! check needs step 2's read): most batches are new reservations, so the
//! transaction skips step 2's read (a 512-value `IN` over two indexes, ~10 %
//! of a batch's time, docs/PERFORMANCE.md) and lets the unique keys do it:
//! step 1, then step 3 for every message. When all of them went in, no
//! message had an order (`orders_reservation`) and no buyer held one
//! (`orders_sale_live_user`), which is exactly what step 2 would have
//! found; steps 4 and 5 follow as above. When fewer went in (a redelivery,
//! a conflict, a repeat within the batch), or the stock cannot cover every
//! message, it rolls back and the batch goes through steps 1 to 5 in a new
//! transaction. The fence (`batch.rs`) was read once before both.
//!
//! If step 3 or 4 inserts fewer rows than expected (someone inserted the same
//! order outside this protocol meanwhile) the transaction is rolled back and
//! reported as [`ApplyError::Transient`], so it is retried from step 1.
//!
//! Every session sets the limits of [`crate::session`] when it opens (a
//! worker frozen inside its transaction must not keep the sale row locked).

use crate::error::ApplyError;
use crate::session::set_limits;
pub use crate::session::SessionLimits;
use mysql::prelude::Queryable;
use mysql::{Conn, Params, Transaction, TxOpts, Value};
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::message::OrderMessage;
use seckill_common::order::OrderStatus;
use seckill_common::schema::placeholders;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A message whose buyer already holds an order of the sale made from a
/// different reservation (`orders_sale_live_user` allows one unreleased
/// order per buyer): the
/// message cannot become an order, and it is not "already done" either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Position of the refused message in the slice given to [`Db::apply`].
    pub index: usize,
    /// `orders.id` of the buyer's existing order.
    pub order_id: u64,
    /// The reservation id that existing order was made from.
    pub reservation_id: String,
}

/// A message that would take its buyer over the sale's limit of units per
/// buyer (`sales.per_user_limit`) in MySQL: not applied, not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverLimit {
    /// Position of the refused message in the slice given to [`Db::apply`].
    pub index: usize,
    /// Units the buyer holds in MySQL (orders not released), with the
    /// messages before it in the batch that became orders.
    pub held: u64,
    /// The units the message asks for.
    pub quantity: u32,
    /// `sales.per_user_limit`.
    pub limit: u64,
}

/// What one application of a batch did. Every variant leaves MySQL consistent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Committed: `inserted` new orders (with as many ledger rows, and
    /// their units decremented); `already` messages had their order already (same
    /// reservation id); the `conflicts` and `over_limit` were refused,
    /// nothing written for them.
    Done {
        /// Orders created by this transaction.
        inserted: usize,
        /// Messages whose order existed (redelivery, duplicate push).
        already: usize,
        /// Messages whose buyer holds an order from another reservation.
        conflicts: Vec<Conflict>,
        /// Messages that would take their buyer over the sale's limit.
        over_limit: Vec<OverLimit>,
        /// The sale's payment window (`sales.payment_window_ms`): the
        /// orders' `pay_by` is each reservation time + it; `None` when
        /// orders are final at creation.
        window_ms: Option<u64>,
    },
    /// `sales` has no row for the sale: nothing written.
    UnknownSale,
    /// MySQL stock cannot cover the new orders of this batch (an oversell
    /// attempt): rolled back, nothing written.
    StockExhausted,
}

impl Applied {
    /// `Done` with nothing inserted, nothing already done, no conflict.
    pub fn nothing() -> Applied {
        Applied::Done {
            inserted: 0,
            already: 0,
            conflicts: Vec::new(),
            over_limit: Vec::new(),
            window_ms: None,
        }
    }
}

/// One MySQL connection, opened lazily and dropped after a connection error.
pub struct Db {
    url: String,
    /// The server the connection reached (password hidden), named in the
    /// errors of its statements.
    at: String,
    timeout: Duration,
    limits: SessionLimits,
    /// Counted open while held (`seckill_common::connections`).
    conn: Option<Held<Conn>>,
    slot: Slot,
}

impl Db {
    /// A handle for `url` (not connected yet); `timeout` is the connect, read
    /// and write timeout (`SECKILL_MYSQL_TIMEOUT`); `limits` are set on
    /// every session it opens.
    ///
    /// Errors: the URL cannot be parsed (a configuration error).
    pub fn new(url: &str, timeout: Duration, limits: SessionLimits) -> Result<Db, String> {
        seckill_common::schema::mysql_opts(url, timeout).map_err(|e| e.to_string())?;
        Ok(Db {
            url: url.to_string(),
            at: seckill_common::redact::redacted(url),
            timeout,
            limits,
            conn: None,
            slot: Slot::new(Store::Mysql),
        })
    }

    fn conn(&mut self) -> Result<&mut Conn, ApplyError> {
        if self.conn.is_none() {
            let (mut c, at) = seckill_common::schema::connect_at(&self.url, self.timeout).map_err(
                |e| match e {
                    seckill_common::schema::SchemaError::Mysql(m) => ApplyError::from(m),
                    other => ApplyError::Permanent(other.to_string()),
                },
            )?;
            self.at = at;
            set_limits(&mut c, self.limits)?;
            self.conn = Some(self.slot.hold(c));
        }
        self.conn
            .as_deref_mut()
            .ok_or_else(|| ApplyError::Connection("not connected".into()))
    }

    /// Drops the connection when `r` failed with a connection error, so the
    /// next call opens a fresh one.
    /// A live connection's error names its server.
    fn keep_if_usable<T>(&mut self, r: Result<T, ApplyError>) -> Result<T, ApplyError> {
        match r {
            Err(ApplyError::Connection(d)) if self.conn.take().is_some() => {
                Err(ApplyError::Connection(format!("{}: {d}", self.at)))
            }
            r => r,
        }
    }

    /// Opens the connection if there is none (no round trip when there is),
    /// so that the next [`Db::apply`] starts with `BEGIN` at once.
    ///
    /// Errors: as [`ApplyError`].
    pub fn connect(&mut self) -> Result<(), ApplyError> {
        let r = self.conn().map(|_| ());
        self.keep_if_usable(r)
    }

    /// Checks that MySQL answers (`SELECT 1`), connecting if needed.
    ///
    /// Errors: as [`ApplyError`].
    pub fn ping(&mut self) -> Result<(), ApplyError> {
        let r = self
            .conn()
            .and_then(|c| c.query_drop("SELECT 1").map_err(ApplyError::from));
        self.keep_if_usable(r)
    }

    /// Applies `msgs` (all of sale `sale_id`, distinct reservation ids not
    /// required) in one transaction; see the module documentation.
    ///
    /// Errors: [`ApplyError`]; after any error nothing was committed, except
    /// that a connection lost during `COMMIT` leaves the outcome unknown,
    /// which a redelivery resolves harmlessly.
    pub fn apply(&mut self, sale_id: u64, msgs: &[&OrderMessage]) -> Result<Applied, ApplyError> {
        let r = self
            .conn()
            .and_then(|c| apply_in_transaction(c, sale_id, msgs));
        self.keep_if_usable(r)
    }
}

/// Step 1, then for a sale of several units per buyer steps 2 to 5 in the
/// same transaction; for a sale of one, the fresh path and, when it
/// declines, steps 1 to 5 (module documentation).
fn apply_in_transaction(
    conn: &mut Conn,
    sale_id: u64,
    msgs: &[&OrderMessage],
) -> Result<Applied, ApplyError> {
    let Some((tx, available, terms)) = lock_sale(conn, sale_id)? else {
        return Ok(Applied::UnknownSale);
    };
    if terms.multi_unit {
        return apply_checked_in(tx, available, &terms, msgs);
    }
    match apply_fresh(tx, available, &terms, msgs)? {
        Some(applied) => Ok(applied),
        None => apply_checked(conn, sale_id, msgs),
    }
}

/// Step 1: `BEGIN` and the sale row locked; `None` (rolled back) when the
/// sale has no row. Returns the transaction, `available_stock` and the
/// terms the rows are written with. Dropping the transaction without
/// commit rolls it back, so every `?` after this is safe.
///
/// Errors: MySQL failures.
fn lock_sale(
    conn: &mut Conn,
    sale_id: u64,
) -> Result<Option<(Transaction<'_>, i64, Terms)>, ApplyError> {
    let mut tx = conn.start_transaction(TxOpts::default())?;
    let sale: Option<(i64, Option<u64>, u64)> = tx.exec_first(
        "SELECT available_stock, payment_window_ms, per_user_limit FROM sales
         WHERE id = ? FOR UPDATE",
        (sale_id,),
    )?;
    match sale {
        Some((available, window_ms, per_user_limit)) => Ok(Some((
            tx,
            available,
            Terms {
                sale_id,
                window_ms,
                multi_unit: per_user_limit > 1,
                per_user_limit,
            },
        ))),
        None => {
            tx.rollback()?;
            Ok(None)
        }
    }
}

/// The fresh path (module documentation), in `tx` that holds the sale row
/// (`available` its stock): `Some` with the answer when every message
/// became an order (or there is nothing to do); `None`, rolled back, when
/// the checked path must decide.
///
/// Errors: MySQL failures.
fn apply_fresh(
    mut tx: Transaction<'_>,
    available: i64,
    terms: &Terms,
    msgs: &[&OrderMessage],
) -> Result<Option<Applied>, ApplyError> {
    let window_ms = terms.window_ms;
    let n = msgs.len();
    if n == 0 {
        tx.rollback()?;
        return Ok(Some(Applied::nothing()));
    }
    if available < units(msgs) as i64 {
        tx.rollback()?;
        return Ok(None);
    }
    if insert_rows(&mut tx, &ORDERS, terms, msgs)? != n as u64 {
        tx.rollback()?;
        return Ok(None);
    }
    if !ledger_and_decrement(&mut tx, terms, msgs)? {
        tx.rollback()?;
        return Ok(Some(Applied::StockExhausted));
    }
    tx.commit()?;
    Ok(Some(Applied::Done {
        inserted: n,
        already: 0,
        conflicts: Vec::new(),
        over_limit: Vec::new(),
        window_ms,
    }))
}

/// Steps 4 and 5 after step 3 inserted an order for each of `new`; `false`
/// when the guarded decrement changed no row (the caller rolls back).
///
/// Errors: MySQL failures; [`ApplyError::Transient`] as [`insert_all`].
fn ledger_and_decrement(
    tx: &mut Transaction<'_>,
    terms: &Terms,
    new: &[&OrderMessage],
) -> Result<bool, ApplyError> {
    insert_all(tx, &LEDGER, terms, new)?;
    let n = units(new);
    // Step 5: the guarded decrement.
    tx.exec_drop(
        "UPDATE sales SET available_stock = available_stock - ? WHERE id = ? AND available_stock >= ?",
        (n, terms.sale_id, n),
    )?;
    Ok(tx.affected_rows() == 1)
}

/// Steps 1 to 5 of the module documentation, step 2's read included.
///
/// Errors: MySQL failures.
fn apply_checked(
    conn: &mut Conn,
    sale_id: u64,
    msgs: &[&OrderMessage],
) -> Result<Applied, ApplyError> {
    let Some((tx, available, terms)) = lock_sale(conn, sale_id)? else {
        return Ok(Applied::UnknownSale);
    };
    apply_checked_in(tx, available, &terms, msgs)
}

/// Steps 2 to 5 in `tx`, which holds the sale row (step 1; `available`
/// its stock).
///
/// Errors: MySQL failures.
fn apply_checked_in(
    mut tx: Transaction<'_>,
    available: i64,
    terms: &Terms,
    msgs: &[&OrderMessage],
) -> Result<Applied, ApplyError> {
    let (sale_id, window_ms) = (terms.sale_id, terms.window_ms);
    if msgs.is_empty() {
        tx.rollback()?;
        return Ok(Applied::nothing());
    }
    let existing = existing_orders(&mut tx, sale_id, msgs)?;
    let held = if terms.multi_unit {
        let users: Vec<&str> = msgs.iter().map(|m| m.user_id.as_str()).collect();
        seckill_common::buyer_units::held_units(&mut tx, sale_id, &users)?
    } else {
        HashMap::new()
    };
    let plan = Plan::sort(terms, msgs, &existing, held);
    if plan.new.is_empty() {
        tx.commit()?;
        return Ok(Applied::Done {
            inserted: 0,
            already: plan.already,
            conflicts: conflicts(plan.refused, &HashMap::new()),
            over_limit: plan.over_limit,
            window_ms,
        });
    }
    let n = plan.new.len();
    if available < units(&plan.new) as i64 {
        tx.rollback()?;
        return Ok(Applied::StockExhausted);
    }
    insert_all(&mut tx, &ORDERS, terms, &plan.new)?;
    if !ledger_and_decrement(&mut tx, terms, &plan.new)? {
        tx.rollback()?;
        return Ok(Applied::StockExhausted);
    }
    let ids = batch_order_ids(&mut tx, &plan.refused)?;
    let conflicts = conflicts(plan.refused, &ids);
    tx.commit()?;
    Ok(Applied::Done {
        inserted: n,
        already: plan.already,
        conflicts,
        over_limit: plan.over_limit,
        window_ms,
    })
}

/// The units of `msgs`: the sum of their quantities.
fn units(msgs: &[&OrderMessage]) -> u64 {
    msgs.iter().map(|m| u64::from(m.quantity)).sum()
}

/// An order row read by step 2: `(id, reservation_id, sale_id,
/// live_user_id)` (`None` once the order was released).
type OrderRow = (u64, String, u64, Option<String>);

/// Step 2's read: the orders of these reservation ids, and the orders of
/// sale `sale_id` held by these buyers.
///
/// Errors: MySQL failures.
fn existing_orders(
    tx: &mut Transaction<'_>,
    sale_id: u64,
    msgs: &[&OrderMessage],
) -> Result<Vec<OrderRow>, ApplyError> {
    let sql = format!(
        "SELECT id, reservation_id, sale_id, live_user_id FROM orders WHERE reservation_id IN ({}) \
         OR (sale_id = ? AND live_user_id IN ({}))",
        placeholders(msgs.len()),
        placeholders(msgs.len())
    );
    let mut params: Vec<Value> = msgs
        .iter()
        .map(|m| Value::from(m.reservation_id.as_str()))
        .collect();
    params.push(Value::from(sale_id));
    params.extend(msgs.iter().map(|m| Value::from(m.user_id.as_str())));
    Ok(tx.exec(sql, Params::Positional(params))?)
}

/// Step 2's verdict on each message of a batch.
struct Plan<'m> {
    /// The messages that become orders, in batch order.
    new: Vec<&'m OrderMessage>,
    /// `(position, order id or None for an order of this batch,
    /// reservation id of that order)` of each message whose buyer holds an
    /// order from another reservation.
    refused: Vec<(usize, Option<u64>, &'m str)>,
    /// Messages whose reservation id has an order (or repeats one of the
    /// batch).
    already: usize,
    /// Messages that would take their buyer over the sale's limit.
    over_limit: Vec<OverLimit>,
}

impl<'m> Plan<'m> {
    /// Sorts `msgs` given the `existing` orders of step 2 and, in a sale of
    /// several units per buyer (no buyer conflicts there), `held`: the
    /// units each buyer holds in MySQL.
    fn sort(
        terms: &Terms,
        msgs: &[&'m OrderMessage],
        existing: &'m [OrderRow],
        mut held: HashMap<String, u64>,
    ) -> Plan<'m> {
        let (sale_id, multi_unit) = (terms.sale_id, terms.multi_unit);
        let mut seen_rids: HashSet<&str> = existing.iter().map(|(_, r, _, _)| r.as_str()).collect();
        // Buyer -> (order id, or None for an order of this batch; reservation id).
        let mut holders: HashMap<&str, (Option<u64>, &str)> = existing
            .iter()
            .filter(|(_, _, s, _)| *s == sale_id && !multi_unit)
            .filter_map(|(id, r, _, u)| Some((u.as_deref()?, (Some(*id), r.as_str()))))
            .collect();
        let mut plan = Plan {
            new: Vec::with_capacity(msgs.len()),
            refused: Vec::new(),
            already: 0,
            over_limit: Vec::new(),
        };
        for (i, m) in msgs.iter().copied().enumerate() {
            if seen_rids.contains(m.reservation_id.as_str()) {
                // An order of this reservation exists, or a repeat in the batch.
                plan.already += 1;
            } else if let Some((id, rid)) = holders.get(m.user_id.as_str()) {
                plan.refused.push((i, *id, rid));
            } else if multi_unit {
                let units = held.entry(m.user_id.clone()).or_insert(0);
                if *units + u64::from(m.quantity) > terms.per_user_limit {
                    plan.over_limit.push(OverLimit {
                        index: i,
                        held: *units,
                        quantity: m.quantity,
                        limit: terms.per_user_limit,
                    });
                } else {
                    *units += u64::from(m.quantity);
                    seen_rids.insert(m.reservation_id.as_str());
                    plan.new.push(m);
                }
            } else {
                seen_rids.insert(m.reservation_id.as_str());
                holders.insert(m.user_id.as_str(), (None, m.reservation_id.as_str()));
                plan.new.push(m);
            }
        }
        plan
    }
}

/// One multi-row `INSERT IGNORE` of steps 3 and 4: a row per new order.
struct MultiInsert {
    /// `INSERT IGNORE INTO table (columns) VALUES`.
    head: &'static str,
    /// One row's `(...)`; its placeholders take [`MultiInsert::values`].
    row: &'static str,
    /// The values of one message's row, in the order of `row`'s placeholders.
    values: fn(&Terms, &OrderMessage) -> Vec<Value>,
    /// What the rows are, for the error text.
    what: &'static str,
}

/// The sale's terms the rows of a batch are written with.
struct Terms {
    /// The sale.
    sale_id: u64,
    /// `sales.payment_window_ms`: `None` when orders are final at creation.
    window_ms: Option<u64>,
    /// `sales.per_user_limit` > 1: the orders' `multi_unit`.
    multi_unit: bool,
    /// `sales.per_user_limit`: the most units a buyer holds at once.
    per_user_limit: u64,
}

/// Step 3: the orders (the message's quantity; `confirmed`, or
/// `pending_payment` with its `pay_by` when the sale has a payment window).
const ORDERS: MultiInsert = MultiInsert {
    head: "INSERT IGNORE INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status, reserved_at, pay_by) VALUES",
    row: "(?, ?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000))",
    values: |t, m| {
        let status = match t.window_ms {
            None => OrderStatus::Confirmed,
            Some(_) => OrderStatus::PendingPayment,
        };
        vec![
            Value::from(m.reservation_id.as_str()),
            Value::from(t.sale_id),
            Value::from(m.user_id.as_str()),
            Value::from(m.quantity),
            Value::from(t.multi_unit),
            Value::from(status.as_str()),
            Value::from(m.reserved_at_ms),
            Value::from(t.window_ms.map(|w| m.reserved_at_ms.saturating_add(w))),
        ]
    },
    what: "new orders",
};

/// Step 4: the stock ledger, one row per new order (delta − its quantity).
const LEDGER: MultiInsert = MultiInsert {
    head:
        "INSERT IGNORE INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason) VALUES",
    row: "(?, ?, ?, ?, 'order')",
    values: |t, m| {
        vec![
            Value::from(m.reservation_id.as_str()),
            Value::from(t.sale_id),
            Value::from(m.user_id.as_str()),
            Value::from(-i64::from(m.quantity)),
        ]
    },
    what: "ledger rows",
};

/// Inserts one `spec` row per message of `new`, in one statement; returns
/// how many went in (the others were ignored).
///
/// Errors: MySQL failures.
fn insert_rows(
    tx: &mut Transaction<'_>,
    spec: &MultiInsert,
    terms: &Terms,
    new: &[&OrderMessage],
) -> Result<u64, ApplyError> {
    let sql = format!("{} {}", spec.head, vec![spec.row; new.len()].join(","));
    let params: Vec<Value> = new.iter().flat_map(|m| (spec.values)(terms, m)).collect();
    tx.exec_drop(sql, Params::Positional(params))?;
    Ok(tx.affected_rows())
}

/// [`insert_rows`], all of them or an error.
///
/// Errors: MySQL failures; [`ApplyError::Transient`] when fewer rows went
/// in than asked (a concurrent insert outside this protocol).
fn insert_all(
    tx: &mut Transaction<'_>,
    spec: &MultiInsert,
    terms: &Terms,
    new: &[&OrderMessage],
) -> Result<(), ApplyError> {
    let (n, sale_id) = (new.len(), terms.sale_id);
    if insert_rows(tx, spec, terms, new)? != n as u64 {
        return Err(ApplyError::Transient(format!(
            "inserted {} of {n} {} of sale {sale_id}: concurrent insert",
            tx.affected_rows(),
            spec.what
        )));
    }
    Ok(())
}

/// The ids of this batch's orders that conflicts point at (the refusals
/// whose order id is `None`), by reservation id.
///
/// Errors: MySQL failures.
fn batch_order_ids(
    tx: &mut Transaction<'_>,
    refused: &[(usize, Option<u64>, &str)],
) -> Result<HashMap<String, u64>, ApplyError> {
    let wanted: Vec<&str> = refused
        .iter()
        .filter(|(_, id, _)| id.is_none())
        .map(|(_, _, rid)| *rid)
        .collect();
    if wanted.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = format!(
        "SELECT reservation_id, id FROM orders WHERE reservation_id IN ({})",
        placeholders(wanted.len())
    );
    let params: Vec<Value> = wanted.iter().map(|r| Value::from(*r)).collect();
    let rows: Vec<(String, u64)> = tx.exec(sql, Params::Positional(params))?;
    Ok(rows.into_iter().collect())
}

/// Turns the refused messages into [`Conflict`]s; `ids` gives the order id of
/// an order inserted by this transaction (0 if absent, which cannot happen
/// after a successful insert).
fn conflicts(
    refused: Vec<(usize, Option<u64>, &str)>,
    ids: &HashMap<String, u64>,
) -> Vec<Conflict> {
    refused
        .into_iter()
        .map(|(index, id, rid)| Conflict {
            index,
            order_id: id.or_else(|| ids.get(rid).copied()).unwrap_or(0),
            reservation_id: rid.to_string(),
        })
        .collect()
}
