//! Owns the order lifecycle's transitions (`order.rs` has the states): the
//! expiry of pending orders past their deadline, the buyer's cancellation,
//! the payment, each decided in MySQL by one guarded `UPDATE ... WHERE
//! status = 'pending_payment'`; and the Redis step that follows a release.
//!
//! A release (expiry or cancellation) is two steps:
//!
//! 1. **MySQL, the decision** — one transaction per sale: lock the sale row
//!    first (`FOR UPDATE`, the lock order of the worker's batches, so no
//!    deadlock cycle), lock the still-pending orders, set them `expired` /
//!    `cancelled` with `released_at`, insert one stock ledger row each
//!    (reason `release`, delta + the order's quantity; the key
//!    `(reservation_id, reason)` makes a second one impossible) and add
//!    their units to `available_stock`. A second
//!    sweeper waiting on the same rows finds them no longer pending and
//!    skips them.
//! 2. **Redis, following it** — the lifecycle mode of the release script
//!    (`release::release_order`: stock + N and `releases` + N for an order
//!    of N units, in one script, the flow record moved to the `released` hash), idempotent by
//!    reservation id, in the bucket that holds the reservation (the
//!    buyer's home bucket, [`ReleasedOrder::keys`]: for a sale split over
//!    buckets, its user id hashed over the K MySQL keeps, `sales.buckets`;
//!    the unit goes back to the bucket it was reserved in, whose buyers
//!    buy it again there or pull it to theirs), then
//!    `orders.redis_released_at` is set. A crash
//!    between the two leaves `redis_released_at` NULL: the next
//!    [`complete_releases`] (every sweep) does the Redis step, which the
//!    `released` hash turns into a no-op if it had happened already. So a
//!    unit returns to Redis exactly once.
//!
//! A payment ([`pay`]) is one transaction (the amount due is the sale's
//! price times the order's quantity): the `payments` row keyed by
//! `payment_id` (a repeat finds it and changes nothing; a repeat for
//! another reservation or amount changes nothing either but is recorded in
//! `payment_conflicts`: the first payment stands), then the guarded
//! `UPDATE` to `paid`, which only succeeds while the order is pending and
//! the payment was received at or before `pay_by` (both Redis's clock:
//! `receipt.rs` has the rule and why the sweep never expires an order
//! whose payment was received in time).

use crate::buckets::home_bucket;
use crate::keys::SaleKeys;
use crate::order::{OrderStatus, Release, LEDGER_RELEASE, RELEASED_SQL};
use crate::release::{release_order, OrderRelease, ReleaseError};
use crate::schema::placeholders;
use mysql::prelude::Queryable;
use mysql::{Conn, IsolationLevel, Params, TxOpts, Value};
use redis::ConnectionLike;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Why a transition could not be made. After an error nothing was committed
/// (a connection lost during `COMMIT` leaves it unknown; repeating the
/// transition is safe either way).
#[derive(Debug)]
#[non_exhaustive]
pub enum LifecycleError {
    /// MySQL refused or failed a statement.
    Mysql(mysql::Error),
    /// The Redis step failed; MySQL's decision stands and the next sweep
    /// does the Redis step again.
    Redis(ReleaseError),
    /// MySQL's books would break (a release beyond `total_stock`, a ledger
    /// row of the release existing already): rolled back; holds why.
    Inconsistent(String),
}

impl fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifecycleError::Mysql(e) => write!(f, "lifecycle: mysql: {e}"),
            LifecycleError::Redis(e) => write!(f, "lifecycle: {e}"),
            LifecycleError::Inconsistent(m) => write!(f, "lifecycle: refused: {m}"),
        }
    }
}

impl std::error::Error for LifecycleError {}

impl From<mysql::Error> for LifecycleError {
    fn from(e: mysql::Error) -> Self {
        LifecycleError::Mysql(e)
    }
}

impl From<ReleaseError> for LifecycleError {
    fn from(e: ReleaseError) -> Self {
        LifecycleError::Redis(e)
    }
}

pub(crate) fn tx_opts() -> TxOpts {
    TxOpts::default().set_isolation_level(Some(IsolationLevel::ReadCommitted))
}

/// A pending order past its deadline, as the sweep finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// `orders.id`.
    pub id: u64,
    /// Its sale.
    pub sale_id: u64,
    /// Its reservation id (the payment receipts' key, `receipt::key`).
    pub reservation_id: String,
    /// Its deadline, Unix ms (Redis's clock: `reserved_at_ms` + window).
    pub pay_by_ms: u64,
}

/// Up to `limit` pending orders whose `pay_by` has passed (MySQL's clock),
/// found by the index (`status`, `pay_by`), oldest deadline first. The
/// sweep closes each in Redis (`receipt::close`), applies the payments
/// received before, then expires the closed ones ([`expire`]).
///
/// Errors: MySQL failures.
pub fn due_orders(db: &mut Conn, limit: usize) -> Result<Vec<Due>, LifecycleError> {
    let rows: Vec<(u64, u64, String, u64)> = db.exec(
        "SELECT id, sale_id, reservation_id, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS UNSIGNED)
         FROM orders
         WHERE status = 'pending_payment' AND pay_by <= UTC_TIMESTAMP(3)
         ORDER BY pay_by LIMIT ?",
        (limit as u64,),
    )?;
    Ok(rows
        .into_iter()
        .map(|(id, sale_id, reservation_id, pay_by_ms)| Due {
            id,
            sale_id,
            reservation_id,
            pay_by_ms,
        })
        .collect())
}

/// Expires `orders` (closed by the sweep: every payment received before
/// their closing applied), those still pending and past their deadline;
/// one transaction per sale. Returns how many this call expired (orders
/// paid meanwhile, or taken by another sweeper, are not counted). Their
/// Redis step is left to [`complete_releases`].
///
/// Errors: [`LifecycleError::Mysql`], [`LifecycleError::Inconsistent`]
/// (that sale's transaction rolled back; the others stand).
pub fn expire(db: &mut Conn, orders: &[Due]) -> Result<usize, LifecycleError> {
    let mut by_sale: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for o in orders {
        by_sale.entry(o.sale_id).or_default().push(o.id);
    }
    let mut n = 0;
    for (sale, ids) in by_sale {
        n += release_in_mysql(db, sale, &ids, Release::Expire)?.len();
    }
    Ok(n)
}

/// What a buyer's cancellation came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// The order was pending and is cancelled now (MySQL step); holds its
    /// reservation id. The Redis step follows in [`complete_releases`].
    Done(String),
    /// The buyer holds no order of the sale (yet: the reservation may still
    /// be queued).
    NoOrder,
    /// The buyer's order is not pending (paid, final, expired meanwhile);
    /// holds its state. Nothing changed.
    NotPending(OrderStatus),
}

/// Cancels the pending order of `user_id` in sale `sale_id` (the MySQL
/// step; see the module doc). In a sale of several units per buyer, where
/// a buyer may hold several orders, that is their oldest pending one (else
/// their oldest live one, to say why nothing was cancelled);
/// [`cancel_named`] names the order.
///
/// Errors: as [`expire`].
pub fn cancel(db: &mut Conn, sale_id: u64, user_id: &str) -> Result<Cancelled, LifecycleError> {
    cancel_named(db, sale_id, user_id, None)
}

/// [`cancel`], of reservation `reservation_id` when the sale sells several
/// units per buyer (the buyer's order of that reservation); a sale of one
/// unit per buyer cancels the buyer's one order, as [`cancel`].
///
/// Errors: as [`expire`].
pub fn cancel_named(
    db: &mut Conn,
    sale_id: u64,
    user_id: &str,
    reservation_id: Option<&str>,
) -> Result<Cancelled, LifecycleError> {
    // `multi_unit = 0`: an order of several units per buyer has its
    // reservation id as live key, and a user id may have that shape (32
    // hex digits): only a one-unit order's live key is its buyer.
    let mut row: Option<(u64, String, String)> = db.exec_first(
        "SELECT id, reservation_id, status FROM orders
         WHERE sale_id = ? AND live_user_id = ? AND multi_unit = 0",
        (sale_id, user_id),
    )?;
    if row.is_none() {
        row = match reservation_id {
            Some(rid) => db.exec_first(
                "SELECT id, reservation_id, status FROM orders
                 WHERE reservation_id = ? AND sale_id = ? AND user_id = ? AND multi_unit = 1",
                (rid, sale_id, user_id),
            )?,
            None => db.exec_first(
                "SELECT id, reservation_id, status FROM orders
                 WHERE sale_id = ? AND user_id = ? AND multi_unit = 1
                   AND live_user_id IS NOT NULL
                 ORDER BY status <> 'pending_payment', id LIMIT 1",
                (sale_id, user_id),
            )?,
        };
    }
    cancel_row(db, sale_id, row)
}

/// [`cancel`] of the order `row` found (`id, reservation id, status`).
fn cancel_row(
    db: &mut Conn,
    sale_id: u64,
    row: Option<(u64, String, String)>,
) -> Result<Cancelled, LifecycleError> {
    let Some((id, rid, status)) = row else {
        return Ok(Cancelled::NoOrder);
    };
    let status =
        OrderStatus::from_str(&status).map_err(|e| LifecycleError::Inconsistent(e.to_string()))?;
    if status != OrderStatus::PendingPayment {
        return Ok(Cancelled::NotPending(status));
    }
    if release_in_mysql(db, sale_id, &[id], Release::Cancel)?.is_empty() {
        // Paid or expired between the read and the lock.
        let now: Option<String> = db.exec_first("SELECT status FROM orders WHERE id = ?", (id,))?;
        let st = now
            .as_deref()
            .and_then(|s| OrderStatus::from_str(s).ok())
            .unwrap_or(OrderStatus::Expired);
        return Ok(Cancelled::NotPending(st));
    }
    Ok(Cancelled::Done(rid))
}

/// The MySQL step of releasing `ids` of sale `sale_id` (see the module
/// doc); returns the ids this call released (those still pending, and for
/// an expiry past their deadline).
fn release_in_mysql(
    db: &mut Conn,
    sale_id: u64,
    ids: &[u64],
    kind: Release,
) -> Result<Vec<u64>, LifecycleError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = db.start_transaction(tx_opts())?;
    let sale: Option<u64> = tx.exec_first(
        "SELECT total_stock FROM sales WHERE id = ? FOR UPDATE",
        (sale_id,),
    )?;
    if sale.is_none() {
        tx.rollback()?;
        return Ok(Vec::new());
    }
    let deadline = match kind {
        Release::Expire => " AND pay_by <= UTC_TIMESTAMP(3)",
        Release::Cancel => "",
    };
    let sql = format!(
        "SELECT id, reservation_id, user_id, quantity FROM orders
         WHERE id IN ({}) AND sale_id = ? AND status = 'pending_payment'{deadline} FOR UPDATE",
        placeholders(ids.len())
    );
    let mut params: Vec<Value> = ids.iter().map(|i| Value::from(*i)).collect();
    params.push(Value::from(sale_id));
    let rows: Vec<(u64, String, String, u64)> = tx.exec(sql, Params::Positional(params))?;
    if rows.is_empty() {
        tx.rollback()?;
        return Ok(Vec::new());
    }
    let n = rows.len();
    let sql = format!(
        "UPDATE orders SET status = ?, released_at = UTC_TIMESTAMP(3)
         WHERE id IN ({}) AND status = 'pending_payment'",
        placeholders(n)
    );
    let mut params: Vec<Value> = vec![Value::from(kind.status().as_str())];
    params.extend(rows.iter().map(|(id, _, _, _)| Value::from(*id)));
    tx.exec_drop(sql, Params::Positional(params))?;
    if tx.affected_rows() != n as u64 {
        return Err(LifecycleError::Inconsistent(format!(
            "released {} of {n} locked orders of sale {sale_id}",
            tx.affected_rows()
        )));
    }
    let sql = format!(
        "INSERT INTO stock_ledger (reservation_id, sale_id, user_id, delta, reason) VALUES {}",
        vec!["(?, ?, ?, ?, ?)"; n].join(",")
    );
    let mut params = Vec::with_capacity(n * 5);
    for (_, rid, user, quantity) in &rows {
        params.push(Value::from(rid.as_str()));
        params.push(Value::from(sale_id));
        params.push(Value::from(user.as_str()));
        params.push(Value::from(*quantity));
        params.push(Value::from(LEDGER_RELEASE));
    }
    let units: u64 = rows.iter().map(|r| r.3).sum();
    if let Err(e) = tx.exec_drop(sql, Params::Positional(params)) {
        return Err(match e {
            mysql::Error::MySqlError(m) if m.code == 1062 => LifecycleError::Inconsistent(format!(
                "a release ledger row of sale {sale_id} exists already: {}",
                m.message
            )),
            e => e.into(),
        });
    }
    tx.exec_drop(
        "UPDATE sales SET available_stock = available_stock + ?
         WHERE id = ? AND available_stock + ? <= total_stock",
        (units, sale_id, units),
    )?;
    if tx.affected_rows() != 1 {
        return Err(LifecycleError::Inconsistent(format!(
            "releasing {units} units of sale {sale_id} would exceed its total stock"
        )));
    }
    tx.commit()?;
    Ok(rows.into_iter().map(|(id, _, _, _)| id).collect())
}

/// An order released in MySQL, for its Redis step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedOrder {
    /// `orders.id`.
    pub id: u64,
    /// Its sale.
    pub sale_id: u64,
    /// Its reservation id.
    pub reservation_id: String,
    /// Expired or cancelled.
    pub kind: Release,
    /// The sale's `rebuy_after_release`: the buyer mark goes too.
    pub rebuy: bool,
    /// The bucket that holds its flow record and its buyer's mark: the
    /// buyer's home bucket (`buckets::home_bucket` of the order's user id
    /// over the sale's `sales.buckets`, 0 for a sale of one bucket).
    pub bucket: u32,
}

impl ReleasedOrder {
    /// The keys of the bucket that holds the reservation.
    pub fn keys(&self) -> SaleKeys {
        SaleKeys::bucket(self.sale_id, self.bucket)
    }
}

/// The keys of the bucket that holds the reservation of order `reservation_id`
/// (its buyer's home bucket over the sale's `sales.buckets`, see
/// [`ReleasedOrder::bucket`]); `None` when MySQL has no such order, or its
/// sale is archived (its Redis keys are gone on purpose: nothing may bring
/// one back, `seckill-reconciler sale archive`).
///
/// Errors: MySQL failures.
pub fn order_keys<Q: Queryable>(
    db: &mut Q,
    reservation_id: &str,
) -> Result<Option<SaleKeys>, mysql::Error> {
    let row: Option<(u64, String, u32)> = db.exec_first(
        "SELECT o.sale_id, o.user_id, COALESCE(s.buckets, 1)
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.reservation_id = ? AND s.archived_at IS NULL",
        (reservation_id,),
    )?;
    Ok(row.map(|(sale, user, k)| SaleKeys::bucket(sale, home_bucket(&user, k))))
}

/// What one [`complete_releases`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completed {
    /// Units put back on sale in Redis now.
    pub released: usize,
    /// Redis steps found done already (a crash after the script, before
    /// the MySQL mark; or another sweeper).
    pub already: usize,
    /// Orders whose flow record Redis does not hold (it lost it): marked
    /// done, logged; the reconciler's stock rules report the unit.
    pub not_found: usize,
}

/// The orders released in MySQL whose Redis step is not marked done, up to
/// `limit`, with what the Redis step needs; `sale` narrows to one sale.
///
/// Errors: MySQL failures.
pub fn pending_redis_steps(
    db: &mut Conn,
    sale: Option<u64>,
    limit: usize,
) -> Result<Vec<ReleasedOrder>, LifecycleError> {
    released(db, sale, true, limit)
}

/// Every order of sale `sale_id` released in MySQL, marked done in Redis
/// or not (what the reconciler checks against Redis).
///
/// Errors: MySQL failures.
pub fn released_orders(db: &mut Conn, sale_id: u64) -> Result<Vec<ReleasedOrder>, LifecycleError> {
    released(db, Some(sale_id), false, usize::MAX)
}

fn released(
    db: &mut Conn,
    sale: Option<u64>,
    only_undone: bool,
    limit: usize,
) -> Result<Vec<ReleasedOrder>, LifecycleError> {
    let sql = format!(
        "SELECT o.id, o.sale_id, o.reservation_id, o.status, s.rebuy_after_release,
                o.user_id, COALESCE(s.buckets, 1)
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.status IN {RELEASED_SQL}{}{}
         ORDER BY o.id LIMIT ?",
        if only_undone {
            " AND o.redis_released_at IS NULL"
        } else {
            ""
        },
        if sale.is_some() {
            " AND o.sale_id = ?"
        } else {
            ""
        }
    );
    let mut params: Vec<Value> = sale.into_iter().map(Value::from).collect();
    params.push(Value::from(limit as u64));
    type Row = (u64, u64, String, String, bool, String, u32);
    let rows: Vec<Row> = db.exec(sql, Params::Positional(params))?;
    Ok(rows
        .into_iter()
        .map(
            |(id, sale_id, reservation_id, status, rebuy, user, k)| ReleasedOrder {
                id,
                sale_id,
                reservation_id,
                kind: if status == OrderStatus::Cancelled.as_str() {
                    Release::Cancel
                } else {
                    Release::Expire
                },
                rebuy,
                bucket: home_bucket(&user, k),
            },
        )
        .collect())
}

/// The Redis step of one released order, then its MySQL mark
/// (`redis_released_at`). `between` runs after the script and before the
/// mark (the crash tests' hook; pass `|| {}`).
///
/// Errors: Redis (nothing marked: the next sweep repeats it) or MySQL (the
/// mark is missing: the repeat replies `already`).
pub fn redis_step<C: ConnectionLike>(
    db: &mut Conn,
    con: &mut C,
    o: &ReleasedOrder,
    between: &mut dyn FnMut(),
) -> Result<OrderRelease, LifecycleError> {
    let r = release_order(con, o.keys(), &o.reservation_id, o.kind, o.rebuy)?;
    between();
    db.exec_drop(
        "UPDATE orders SET redis_released_at = UTC_TIMESTAMP(3) WHERE id = ? AND redis_released_at IS NULL",
        (o.id,),
    )?;
    Ok(r)
}

/// Does the Redis step ([`redis_step`]) of up to `limit` orders released
/// in MySQL and not marked done: what completes a release interrupted by a
/// crash, and the second half of every sweep.
///
/// Errors: as [`redis_step`]; the orders before the failing one are done.
pub fn complete_releases<C: ConnectionLike>(
    db: &mut Conn,
    con: &mut C,
    limit: usize,
    between: &mut dyn FnMut(),
) -> Result<Completed, LifecycleError> {
    let mut c = Completed::default();
    for o in pending_redis_steps(db, None, limit)? {
        match redis_step(db, con, &o, between)? {
            OrderRelease::Released { .. } => c.released += 1,
            OrderRelease::Already => c.already += 1,
            OrderRelease::NotFound => {
                log::warn!(
                    "sale {}: released order {} ({}) has no flow record in Redis: unit not returned there",
                    o.sale_id,
                    o.id,
                    o.reservation_id
                );
                c.not_found += 1;
            }
        }
    }
    Ok(c)
}

/// What a payment came to; stored by name in `payments.outcome`. Every
/// outcome but `paid` leaves the order as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentOutcome {
    /// The pending order is paid now (`paid`).
    Paid,
    /// The amount is not the sale's price times the order's quantity
    /// (`payment_amount_mismatch`): the
    /// order stays pending; a finding for a person.
    AmountMismatch,
    /// Received after the deadline (`late_payment`): the order stays as it
    /// is (pending until the sweep expires it, or expired); a finding
    /// (refund, or re-create the order by hand if stock allows).
    Late,
    /// The buyer cancelled the order before the payment was applied
    /// (`payment_after_cancellation`), whenever it was received: the order
    /// stays cancelled; a finding (refund).
    AfterCancellation,
    /// No order has this reservation id (`unknown_reservation`).
    UnknownReservation,
    /// The order is paid already by another payment id, or is final without
    /// a payment (`not_payable`): a finding (refund).
    NotPayable,
    /// An operator dropped its dead letter (`dead-letter drop payments`,
    /// `dropped_payment.rs`): never applied, whoever delivers it again;
    /// the order goes its way without it. Written only by the drop, never
    /// decided by [`pay`].
    Dropped,
}

impl PaymentOutcome {
    /// The stored word (the finding kind of the reconciler for those that
    /// are findings).
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentOutcome::Paid => "paid",
            PaymentOutcome::AmountMismatch => "payment_amount_mismatch",
            PaymentOutcome::Late => "late_payment",
            PaymentOutcome::AfterCancellation => "payment_after_cancellation",
            PaymentOutcome::UnknownReservation => "unknown_reservation",
            PaymentOutcome::NotPayable => "not_payable",
            PaymentOutcome::Dropped => "dropped",
        }
    }
}

impl FromStr for PaymentOutcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            PaymentOutcome::Paid,
            PaymentOutcome::AmountMismatch,
            PaymentOutcome::Late,
            PaymentOutcome::AfterCancellation,
            PaymentOutcome::UnknownReservation,
            PaymentOutcome::NotPayable,
            PaymentOutcome::Dropped,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| format!("unknown payment outcome {s:?}"))
    }
}

/// A payment as the payment service reported it (`POST /v1/payments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    /// The payment service's id: the idempotency key.
    pub payment_id: String,
    /// The reservation (order) paid for.
    pub reservation_id: String,
    /// Amount paid, integer cents.
    pub amount_cents: u64,
    /// When the gateway received it, Unix ms: compared with `pay_by`.
    pub received_ms: u64,
}

/// What [`pay`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paid {
    /// Applied now, with this outcome.
    Applied(PaymentOutcome),
    /// This `payment_id` was applied before, with this outcome: nothing changed.
    Duplicate(PaymentOutcome),
    /// This `payment_id` was applied before (with this outcome) for another
    /// reservation or amount: the first payment stands, and this delivery
    /// is one row of `payment_conflicts` (a finding `payment_conflict`).
    Conflict(PaymentOutcome),
}

/// Applies one payment in one transaction (see the module doc).
///
/// Errors: MySQL failures (nothing committed; the payment is retried).
pub fn pay(db: &mut Conn, p: &Payment) -> Result<Paid, LifecycleError> {
    let mut tx = db.start_transaction(tx_opts())?;
    if let Some(seen) = seen_before(&mut tx, p, true)? {
        tx.commit()?;
        return Ok(seen);
    }
    let (sale_id, outcome) = decide(&mut tx, p)?;
    let inserted = tx.exec_drop(
        "INSERT INTO payments (payment_id, reservation_id, sale_id, amount_cents, outcome, received_at)
         VALUES (?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000))",
        (
            &p.payment_id,
            &p.reservation_id,
            sale_id,
            p.amount_cents,
            outcome.as_str(),
            p.received_ms,
        ),
    );
    match inserted {
        // The same payment applied concurrently by another worker, which
        // committed first: ours rolls back (it changed nothing else, the
        // order being paid by then) and reads that one's outcome.
        Err(mysql::Error::MySqlError(e)) if e.code == 1062 => {
            tx.rollback()?;
            let mut tx = db.start_transaction(tx_opts())?;
            let seen = seen_before(&mut tx, p, false)?
                .ok_or_else(|| LifecycleError::Inconsistent("payment row vanished".into()))?;
            tx.commit()?;
            Ok(seen)
        }
        Err(e) => Err(e.into()),
        Ok(()) => {
            tx.commit()?;
            Ok(Paid::Applied(outcome))
        }
    }
}

/// Locks the order of `p.reservation_id` (`FOR UPDATE`) and decides the
/// payment: paid when pending, received at or before `pay_by` and of the
/// sale's price times the order's quantity (the guarded `UPDATE` done here), else the outcome that says why.
/// Returns the order's sale (none without an order) and the outcome; the
/// caller records it in `payments` in the same transaction.
///
/// Errors: MySQL failures; a status this build does not know.
pub(crate) fn decide(
    tx: &mut mysql::Transaction<'_>,
    p: &Payment,
) -> Result<(Option<u64>, PaymentOutcome), LifecycleError> {
    let order: Option<(u64, u64, String, u64, bool)> = tx.exec_first(
        "SELECT o.id, o.sale_id, o.status, s.price_cents * o.quantity,
                COALESCE(o.pay_by >= FROM_UNIXTIME(? / 1000), 0)
         FROM orders o JOIN sales s ON s.id = o.sale_id
         WHERE o.reservation_id = ? FOR UPDATE",
        (p.received_ms, &p.reservation_id),
    )?;
    Ok(match order {
        None => (None, PaymentOutcome::UnknownReservation),
        Some((id, sale, status, price, in_time)) => {
            let status = OrderStatus::from_str(&status)
                .map_err(|e| LifecycleError::Inconsistent(e.to_string()))?;
            let outcome = match status {
                OrderStatus::PendingPayment if !in_time => PaymentOutcome::Late,
                OrderStatus::PendingPayment if p.amount_cents != price => {
                    PaymentOutcome::AmountMismatch
                }
                OrderStatus::PendingPayment => {
                    tx.exec_drop(
                        "UPDATE orders SET status = 'paid', paid_at = UTC_TIMESTAMP(3), payment_id = ?
                         WHERE id = ? AND status = 'pending_payment'",
                        (&p.payment_id, id),
                    )?;
                    if tx.affected_rows() == 1 {
                        PaymentOutcome::Paid
                    } else {
                        PaymentOutcome::Late
                    }
                }
                OrderStatus::Expired => PaymentOutcome::Late,
                OrderStatus::Cancelled => PaymentOutcome::AfterCancellation,
                OrderStatus::Paid | OrderStatus::Confirmed => PaymentOutcome::NotPayable,
            };
            (Some(sale), outcome)
        }
    })
}

/// What the `payments` row of `p.payment_id` says of `p`, if there is one:
/// the same reservation and amount is a [`Paid::Duplicate`]; another is a
/// [`Paid::Conflict`], recorded in `payment_conflicts` (`INSERT IGNORE`: a
/// redelivery of the same conflicting message is one row). `lock`: read
/// the row `FOR UPDATE` (before this transaction decides anything).
///
/// Errors: MySQL failures; an outcome this build does not know.
fn seen_before(
    tx: &mut mysql::Transaction<'_>,
    p: &Payment,
    lock: bool,
) -> Result<Option<Paid>, LifecycleError> {
    let sql = format!(
        "SELECT outcome, reservation_id, amount_cents FROM payments WHERE payment_id = ?{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let seen: Option<(String, String, u64)> = tx.exec_first(sql, (&p.payment_id,))?;
    let Some((o, rid, amount)) = seen else {
        return Ok(None);
    };
    let o = PaymentOutcome::from_str(&o).map_err(LifecycleError::Inconsistent)?;
    if rid == p.reservation_id && amount == p.amount_cents {
        return Ok(Some(Paid::Duplicate(o)));
    }
    tx.exec_drop(
        "INSERT IGNORE INTO payment_conflicts (payment_id, reservation_id, amount_cents, received_at)
         VALUES (?, ?, ?, FROM_UNIXTIME(? / 1000))",
        (&p.payment_id, &p.reservation_id, p.amount_cents, p.received_ms),
    )?;
    Ok(Some(Paid::Conflict(o)))
}

/// Units of sale `sale_id` held by orders (confirmed, pending or paid),
/// the sum of their quantities: what the sale's Redis stock is loaded from
/// (`total − held`).
///
/// Errors: MySQL failures.
pub fn held_units<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<u64, mysql::Error> {
    let n: Option<u64> = db.exec_first(
        format!(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS UNSIGNED) FROM orders
             WHERE sale_id = ? AND status NOT IN {RELEASED_SQL}"
        ),
        (sale_id,),
    )?;
    Ok(n.unwrap_or(0))
}
