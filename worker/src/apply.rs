//! Owns the MySQL side of the worker: one transaction per batch that turns
//! order messages into orders, stock ledger rows and one guarded stock
//! decrement, idempotently (a redelivered message changes nothing).
//!
//! Transaction, at `READ COMMITTED` (no gap locks, so fewer deadlocks):
//!
//! 1. `SELECT available_stock FROM sales WHERE id = ? FOR UPDATE` locks the
//!    sale row first. Every worker applying this sale queues here, so the
//!    orders they insert never interleave and the lock order is the same for
//!    everyone (the usual cause of deadlocks, duplicate-key S-locks taken in
//!    different orders, cannot form a cycle). No row: unknown sale.
//! 2. Read which reservation ids (or `(sale_id, user_id)` pairs) already have
//!    an order. A message whose reservation id has one is already done and
//!    left alone (idempotency). A message whose buyer holds an order of this
//!    sale from ANOTHER reservation (in MySQL, or earlier in this batch) is a
//!    [`Conflict`]: not applied, not done; the caller dead-letters it.
//! 3. `INSERT IGNORE INTO orders` for the rest (`quantity = 1`,
//!    `status = 'confirmed'`, `reserved_at = FROM_UNIXTIME(ms / 1000)`).
//! 4. `INSERT IGNORE INTO stock_ledger` one row per new order
//!    (`delta = -1`, `reason = 'order'`), the rows the reconciler reads.
//! 5. `UPDATE sales SET available_stock = available_stock - n WHERE id = ?
//!    AND available_stock >= n` with `n` = new orders. No row changed: the
//!    batch would oversell; roll back and report [`Applied::StockExhausted`].
//!
//! If step 3 or 4 inserts fewer rows than expected (someone inserted the same
//! order outside this protocol meanwhile) the transaction is rolled back and
//! reported as [`ApplyError::Transient`], so it is retried from step 1.

use crate::error::ApplyError;
use mysql::prelude::Queryable;
use mysql::{Conn, IsolationLevel, Params, TxOpts, Value};
use seckill_common::message::OrderMessage;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// A message whose buyer already holds an order of the sale made from a
/// different reservation (`orders_sale_user` allows one per buyer): the
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

/// What one application of a batch did. Every variant leaves MySQL consistent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Committed: `inserted` new orders (with as many ledger rows and units
    /// decremented); `already` messages had their order already (same
    /// reservation id); the `conflicts` were refused, nothing written for
    /// them.
    Done {
        /// Orders created by this transaction.
        inserted: usize,
        /// Messages whose order existed (redelivery, duplicate push).
        already: usize,
        /// Messages whose buyer holds an order from another reservation.
        conflicts: Vec<Conflict>,
    },
    /// `sales` has no row for the sale: nothing written.
    UnknownSale,
    /// MySQL stock cannot cover the new orders of this batch (an oversell
    /// attempt): rolled back, nothing written.
    StockExhausted,
}

/// One MySQL connection, opened lazily and dropped after a connection error.
pub struct Db {
    url: String,
    timeout: Duration,
    conn: Option<Conn>,
}

impl Db {
    /// A handle for `url` (not connected yet); `timeout` is the connect, read
    /// and write timeout (`SECKILL_MYSQL_TIMEOUT`).
    ///
    /// Errors: the URL cannot be parsed (a configuration error).
    pub fn new(url: &str, timeout: Duration) -> Result<Db, String> {
        seckill_common::schema::mysql_opts(url, timeout).map_err(|e| e.to_string())?;
        Ok(Db {
            url: url.to_string(),
            timeout,
            conn: None,
        })
    }

    fn conn(&mut self) -> Result<&mut Conn, ApplyError> {
        if self.conn.is_none() {
            let c =
                seckill_common::schema::connect(&self.url, self.timeout).map_err(|e| match e {
                    seckill_common::schema::SchemaError::Mysql(m) => ApplyError::from(m),
                    other => ApplyError::Permanent(other.to_string()),
                })?;
            self.conn = Some(c);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| ApplyError::Connection("not connected".into()))
    }

    /// Drops the connection when `r` failed with a connection error, so the
    /// next call opens a fresh one.
    fn keep_if_usable<T>(&mut self, r: Result<T, ApplyError>) -> Result<T, ApplyError> {
        if matches!(r, Err(ApplyError::Connection(_))) {
            self.conn = None;
        }
        r
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

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(",")
}

fn apply_in_transaction(
    conn: &mut Conn,
    sale_id: u64,
    msgs: &[&OrderMessage],
) -> Result<Applied, ApplyError> {
    let opts = TxOpts::default().set_isolation_level(Some(IsolationLevel::ReadCommitted));
    // Dropping `tx` without commit rolls back, so every `?` below is safe.
    let mut tx = conn.start_transaction(opts)?;
    let available: Option<i64> = tx.exec_first(
        "SELECT available_stock FROM sales WHERE id = ? FOR UPDATE",
        (sale_id,),
    )?;
    let Some(available) = available else {
        tx.rollback()?;
        return Ok(Applied::UnknownSale);
    };
    if msgs.is_empty() {
        tx.rollback()?;
        return Ok(Applied::Done {
            inserted: 0,
            already: 0,
            conflicts: Vec::new(),
        });
    }

    // Step 2: which of these are already orders, and which buyers hold one.
    let sql = format!(
        "SELECT id, reservation_id, sale_id, user_id FROM orders WHERE reservation_id IN ({}) \
         OR (sale_id = ? AND user_id IN ({}))",
        placeholders(msgs.len()),
        placeholders(msgs.len())
    );
    let mut params: Vec<Value> = msgs
        .iter()
        .map(|m| Value::from(m.reservation_id.as_str()))
        .collect();
    params.push(Value::from(sale_id));
    params.extend(msgs.iter().map(|m| Value::from(m.user_id.as_str())));
    let existing: Vec<(u64, String, u64, String)> = tx.exec(sql, Params::Positional(params))?;
    let mut seen_rids: HashSet<&str> = existing.iter().map(|(_, r, _, _)| r.as_str()).collect();
    // Buyer -> (order id, or None for an order of this batch; reservation id).
    let mut holders: HashMap<&str, (Option<u64>, &str)> = existing
        .iter()
        .filter(|(_, _, s, _)| *s == sale_id)
        .map(|(id, r, _, u)| (u.as_str(), (Some(*id), r.as_str())))
        .collect();
    let mut new: Vec<&OrderMessage> = Vec::with_capacity(msgs.len());
    let mut refused: Vec<(usize, Option<u64>, &str)> = Vec::new();
    let mut already = 0;
    for (i, m) in msgs.iter().enumerate() {
        if seen_rids.contains(m.reservation_id.as_str()) {
            // An order of this reservation exists, or a repeat in the batch.
            already += 1;
        } else if let Some((id, rid)) = holders.get(m.user_id.as_str()) {
            refused.push((i, *id, rid));
        } else {
            seen_rids.insert(m.reservation_id.as_str());
            holders.insert(m.user_id.as_str(), (None, m.reservation_id.as_str()));
            new.push(m);
        }
    }
    if new.is_empty() {
        tx.commit()?;
        return Ok(Applied::Done {
            inserted: 0,
            already,
            conflicts: conflicts(refused, &HashMap::new()),
        });
    }
    let n = new.len();
    if available < n as i64 {
        tx.rollback()?;
        return Ok(Applied::StockExhausted);
    }

    // Step 3: the orders.
    let sql = format!(
        "INSERT IGNORE INTO orders (reservation_id, sale_id, user_id, quantity, status, reserved_at) VALUES {}",
        vec!["(?, ?, ?, 1, 'confirmed', FROM_UNIXTIME(? / 1000))"; n].join(",")
    );
    let mut params = Vec::with_capacity(n * 4);
    for m in &new {
        params.push(Value::from(m.reservation_id.as_str()));
        params.push(Value::from(sale_id));
        params.push(Value::from(m.user_id.as_str()));
        params.push(Value::from(m.reserved_at_ms));
    }
    tx.exec_drop(sql, Params::Positional(params))?;
    if tx.affected_rows() != n as u64 {
        return Err(ApplyError::Transient(format!(
            "inserted {} of {n} new orders of sale {sale_id}: concurrent insert",
            tx.affected_rows()
        )));
    }

    // Step 4: the stock ledger, one row per new order.
    let sql = format!(
        "INSERT IGNORE INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason) VALUES {}",
        vec!["(?, ?, ?, -1, 'order')"; n].join(",")
    );
    let mut params = Vec::with_capacity(n * 3);
    for m in &new {
        params.push(Value::from(m.reservation_id.as_str()));
        params.push(Value::from(sale_id));
        params.push(Value::from(m.user_id.as_str()));
    }
    tx.exec_drop(sql, Params::Positional(params))?;
    if tx.affected_rows() != n as u64 {
        return Err(ApplyError::Transient(format!(
            "inserted {} of {n} ledger rows of sale {sale_id}: concurrent insert",
            tx.affected_rows()
        )));
    }

    // Step 5: the guarded decrement.
    tx.exec_drop(
        "UPDATE sales SET available_stock = available_stock - ? WHERE id = ? AND available_stock >= ?",
        (n as u64, sale_id, n as u64),
    )?;
    if tx.affected_rows() != 1 {
        tx.rollback()?;
        return Ok(Applied::StockExhausted);
    }
    // Ids of this batch's orders that a conflict points at.
    let mut ids: HashMap<String, u64> = HashMap::new();
    let wanted: Vec<&str> = refused
        .iter()
        .filter(|(_, id, _)| id.is_none())
        .map(|(_, _, rid)| *rid)
        .collect();
    if !wanted.is_empty() {
        let sql = format!(
            "SELECT reservation_id, id FROM orders WHERE reservation_id IN ({})",
            placeholders(wanted.len())
        );
        let params: Vec<Value> = wanted.iter().map(|r| Value::from(*r)).collect();
        let rows: Vec<(String, u64)> = tx.exec(sql, Params::Positional(params))?;
        ids.extend(rows);
    }
    let conflicts = conflicts(refused, &ids);
    tx.commit()?;
    Ok(Applied::Done {
        inserted: n,
        already,
        conflicts,
    })
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
