//! Owns `resolve --recreate`, the fix of a `ledger_without_order` finding:
//! the order of a reservation whose stock-ledger deduction MySQL kept when
//! it lost the order is made again from what MySQL and Redis hold, without
//! a second deduction.
//!
//! Checks, the same for a dry run and the real action ([`check`]): MySQL
//! holds no order for the reservation (else nothing to do); its ledger
//! deduction is there and not given back (a `release` row); Redis holds its
//! flow record (the order message: the buyer and the reservation time; no
//! flow record means Redis no longer holds the unit, and an order now could
//! sell it twice); the message is neither queued nor in a processing list
//! (a worker would dead-letter it meanwhile and mark it `on_hold`); in a sale
//! of one unit per buyer, the buyer holds no other one-unit order of the
//! sale (`multi_unit = 0`: the live key of an order of several units is its
//! reservation id, which a user id may equal); in a sale of several, the
//! units the buyer's orders hold plus the message's stay within
//! `sales.per_user_limit` (`seckill_common::buyer_units`). The
//! order carries the message's quantity, which must be the deduction's
//! units.
//!
//! Effect ([`recreate`]), one MySQL transaction in the worker's lock order:
//! the sale row `FOR UPDATE`, the checks again (the buyer's units
//! included), then one `INSERT INTO
//! orders` with the terms the worker would have used (`confirmed`, or
//! `pending_payment` with `pay_by` = reservation time + the sale's payment
//! window; `paid` when MySQL holds a `paid` payment of the reservation). No
//! ledger row, no change to `available_stock`: the deduction is the one
//! already there. Then Redis: the reservation's status becomes the order's
//! (and its `pay_by`), only while the flow record is held (a release since
//! wrote its own status). A worker that applies the same message later
//! finds the order and changes nothing.
//!
//! Whether an interrupted re-creation happened is read from MySQL: the
//! order exists ([`observe`]), and the status write is done then.

use crate::error::RunError;
use crate::mysql_read::{self, Deduction};
use crate::redis_read;
use crate::settle::Outcome;
use mysql::prelude::Queryable;
use mysql::{Conn, TxOpts};
use redis::Script;
use seckill_common::in_flight::still_in_flight;
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::message::OrderMessage;
use seckill_common::order::OrderStatus;
use seckill_common::redis_target::Con;
use std::sync::OnceLock;

/// What the checks found: the re-creation may go ahead.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The bucket whose flow records hold the reservation.
    pub keys: SaleKeys,
    /// The order message (the flow record).
    pub message: OrderMessage,
    /// The ledger row that keeps the unit deducted.
    pub deduction: Deduction,
}

impl Plan {
    /// What the effect would do, in one line.
    pub fn would(&self) -> String {
        format!(
            "would re-create the order of {} for buyer {} from ledger row {} (reason {}) and \
             its flow record: no second deduction, available_stock unchanged",
            self.message.reservation_id,
            self.message.user_id,
            self.deduction.id,
            self.deduction.reason
        )
    }
}

/// MySQL's duplicate-key error.
const ER_DUP_ENTRY: u16 = 1062;

/// The checks of the module doc for reservation `rid` of sale `sale_id`:
/// `Ok(plan)` when the re-creation may go ahead, `Err(outcome)` (a refusal,
/// or nothing to do) otherwise.
///
/// Errors: Redis or MySQL failures.
pub fn check(
    mysql: &mut Conn,
    redis: &mut Con,
    sale_id: u64,
    rid: &str,
) -> Result<Result<Plan, Outcome>, RunError> {
    if let Some(order) = mysql_read::order_of(mysql, rid)? {
        return Ok(Err(Outcome::no_change(format!(
            "MySQL already holds order {} for reservation {rid}",
            order.id
        ))));
    }
    let Some(deduction) = mysql_read::deductions_of(mysql, &[rid.to_string()])?
        .into_iter()
        .next()
    else {
        return Ok(Err(Outcome::refused(format!(
            "MySQL's stock ledger holds no deduction of {rid} that was not given back: there \
             is no unit to re-create an order for; run the reconciler again"
        ))));
    };
    if deduction.sale_id != sale_id {
        return Ok(Err(Outcome::refused(format!(
            "the ledger row {} of {rid} belongs to sale {}, not sale {sale_id}",
            deduction.id, deduction.sale_id
        ))));
    }
    let Some(keys) = seckill_common::buckets::holding(redis, sale_id, rid, SaleKeys::flow)? else {
        return Ok(Err(Outcome::refused(format!(
            "Redis holds no flow record for {rid}: Redis no longer counts its unit as taken \
             (released, or lost with Redis data), so an order re-created now could sell it \
             twice; compare `sale show {sale_id}` and settle the stock by hand, then --dismiss"
        ))));
    };
    let text = redis_read::hash_values(redis, &keys.flow(), &[rid.to_string()])?
        .pop()
        .flatten()
        .unwrap_or_default();
    let Ok(message) = OrderMessage::parse(text.as_bytes()) else {
        return Ok(Err(Outcome::refused(format!(
            "the flow record of {rid} in {} is not an order message: nothing to re-create \
             the order from",
            keys.flow()
        ))));
    };
    if message.user_id != deduction.user_id {
        return Ok(Err(Outcome::refused(format!(
            "the flow record of {rid} names buyer {} but ledger row {} names {}: settle by hand",
            message.user_id, deduction.id, deduction.user_id
        ))));
    }
    if deduction.delta != -i64::from(message.quantity) {
        return Ok(Err(Outcome::refused(format!(
            "the flow record of {rid} carries {} unit(s) but ledger row {} deducted {}: settle \
             by hand",
            message.quantity, deduction.id, -deduction.delta
        ))));
    }
    let mut lists = vec![keys.queue()];
    for w in redis_read::set_members(redis, WORKERS)? {
        lists.push(keys.processing(&w));
    }
    match still_in_flight(redis, &lists, &[text.as_str()])? {
        Some(found) if !found.first().copied().unwrap_or(false) => {}
        Some(_) => {
            return Ok(Err(Outcome::refused(format!(
                "the order message of {rid} is queued or in a worker's processing list: the \
                 worker will dead-letter it (MySQL counts its unit already); try again once it has"
            ))))
        }
        None => {
            return Ok(Err(Outcome::refused(format!(
                "the sale's queue and processing lists are too long to look for the order \
                 message of {rid} without holding Redis: try again once the backlog has drained"
            ))))
        }
    }
    if let Some(why) = buyer_refusal(mysql, sale_id, &message)? {
        return Ok(Err(Outcome::refused(why)));
    }
    Ok(Ok(Plan {
        keys,
        message,
        deduction,
    }))
}

/// The one-unit order (id, reservation id) of sale `sale_id` that buyer
/// `user` holds, if any (`multi_unit = 0`, as `lifecycle::cancel_named`:
/// only a one-unit order's live key is its buyer).
fn held_by_buyer<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    user: &str,
) -> mysql::Result<Option<(u64, String)>> {
    db.exec_first(
        "SELECT id, reservation_id FROM orders
         WHERE sale_id = ? AND live_user_id = ? AND multi_unit = 0",
        (sale_id, user),
    )
}

/// Why the order of message `m` may not be made for its buyer, if it may
/// not: in a sale of one unit per buyer they hold another order; in a sale
/// of several, their orders hold too many units for `m`'s to fit within
/// `sales.per_user_limit`. No sale row: `None` (the effect reports it).
///
/// Errors: MySQL failures.
fn buyer_refusal<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    m: &OrderMessage,
) -> mysql::Result<Option<String>> {
    let limit: Option<u64> =
        db.exec_first("SELECT per_user_limit FROM sales WHERE id = ?", (sale_id,))?;
    let Some(limit) = limit else {
        return Ok(None);
    };
    let user = m.user_id.as_str();
    if limit <= 1 {
        return Ok(held_by_buyer(db, sale_id, user)?.map(|(id, rid)| {
            format!(
                "buyer {user} holds order {id} of sale {sale_id} from reservation {rid}: one \
                 order per buyer; settle by hand"
            )
        }));
    }
    let held = seckill_common::buyer_units::held_units(db, sale_id, &[user])?
        .get(user)
        .copied()
        .unwrap_or(0);
    Ok((held + u64::from(m.quantity) > limit).then(|| {
        format!(
            "buyer {user} holds {held} unit(s) of sale {sale_id} in MySQL; the order of {} \
             would add {}, over its limit of {limit} per buyer; settle by hand",
            m.reservation_id, m.quantity
        )
    }))
}

/// The effect of the module doc, for a `plan` that passed [`check`].
///
/// Errors: Redis or MySQL failures (after a MySQL commit, a Redis failure
/// leaves the status write to the next `resolve` or `run`, which complete
/// the action from MySQL).
pub fn recreate(mysql: &mut Conn, redis: &mut Con, plan: &Plan) -> Result<Outcome, RunError> {
    let rid = plan.message.reservation_id.as_str();
    let sale_id = plan.deduction.sale_id;
    let mut tx = mysql.start_transaction(TxOpts::default())?;
    let sale: Option<(Option<u64>, bool)> = tx.exec_first(
        "SELECT payment_window_ms, per_user_limit > 1 FROM sales WHERE id = ? FOR UPDATE",
        (sale_id,),
    )?;
    let Some((window, multi_unit)) = sale else {
        tx.rollback()?;
        return Ok(Outcome::refused(format!("MySQL has no sale {sale_id}")));
    };
    let existing: Option<u64> =
        tx.exec_first("SELECT id FROM orders WHERE reservation_id = ?", (rid,))?;
    if let Some(id) = existing {
        tx.rollback()?;
        return Ok(Outcome::no_change(format!(
            "MySQL already holds order {id} for reservation {rid}"
        )));
    }
    if mysql_read::deductions_of(&mut tx, &[rid.to_string()])?.is_empty() {
        tx.rollback()?;
        return Ok(Outcome::refused(format!(
            "MySQL's stock ledger no longer holds a deduction of {rid}; nothing done"
        )));
    }
    if multi_unit {
        if let Some(why) = buyer_refusal(&mut tx, sale_id, &plan.message)? {
            tx.rollback()?;
            return Ok(Outcome::refused(format!("{why}; nothing done")));
        }
    }
    let paid: Option<String> = tx.exec_first(
        "SELECT payment_id FROM payments WHERE reservation_id = ? AND outcome = 'paid' LIMIT 1",
        (rid,),
    )?;
    let m = &plan.message;
    let pay_by = window.map(|w| m.reserved_at_ms.saturating_add(w));
    let status = match (&paid, window) {
        (Some(_), _) => OrderStatus::Paid,
        (None, Some(_)) => OrderStatus::PendingPayment,
        (None, None) => OrderStatus::Confirmed,
    };
    let inserted = tx.exec_drop(
        "INSERT INTO orders (reservation_id, sale_id, user_id, quantity, multi_unit, status,
                             reserved_at, pay_by, paid_at, payment_id)
         SELECT ?, ?, ?, ?, ?, ?, FROM_UNIXTIME(? / 1000), FROM_UNIXTIME(? / 1000),
                (SELECT applied_at FROM payments WHERE payment_id = ?), ?",
        (
            rid,
            sale_id,
            m.user_id.as_str(),
            m.quantity,
            multi_unit,
            status.as_str(),
            m.reserved_at_ms,
            pay_by,
            paid.as_deref(),
            paid.as_deref(),
        ),
    );
    match inserted {
        Ok(()) => {}
        Err(mysql::Error::MySqlError(e)) if e.code == ER_DUP_ENTRY => {
            tx.rollback()?;
            return Ok(Outcome::refused(format!(
                "MySQL refused the order of {rid}: {}; nothing done",
                e.message
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let order_id = tx.last_insert_id().unwrap_or(0);
    let available: Option<i64> =
        tx.exec_first("SELECT available_stock FROM sales WHERE id = ?", (sale_id,))?;
    tx.commit()?;
    let wrote = write_status(redis, plan.keys, rid, status, pay_by)?;
    Ok(Outcome::done(format!(
        "re-created order {order_id} of {rid} for buyer {} ({status}) from ledger row {}: no \
         second deduction, available_stock stays {}; {}",
        m.user_id,
        plan.deduction.id,
        available.unwrap_or(0),
        status_text(wrote, status)
    )))
}

/// What an interrupted re-creation of `rid` (sale `sale_id`) came to: done
/// exactly when MySQL holds its order, whose status is then written to
/// Redis (the step the interruption may have cut).
///
/// Errors: Redis or MySQL failures.
pub fn observe(
    mysql: &mut Conn,
    redis: &mut Con,
    sale_id: u64,
    rid: &str,
) -> Result<Outcome, RunError> {
    let row: Option<(u64, String, Option<i64>)> = mysql.exec_first(
        "SELECT id, status, CAST(UNIX_TIMESTAMP(pay_by) * 1000 AS SIGNED)
         FROM orders WHERE reservation_id = ?",
        (rid,),
    )?;
    let Some((id, status, pay_by)) = row else {
        return Ok(Outcome::failed(format!(
            "interrupted before its effect: MySQL holds no order of {rid}; nothing changed"
        )));
    };
    let status = match status.parse::<OrderStatus>() {
        Ok(s) => s,
        Err(_) => {
            return Ok(Outcome::done(format!(
                "re-created order {id} of {rid} (recorded after an interruption: MySQL holds \
                 it, status {status:?} not written to Redis)"
            )))
        }
    };
    let keys = seckill_common::buckets::holding(redis, sale_id, rid, SaleKeys::flow)?
        .unwrap_or(SaleKeys::new(sale_id));
    let wrote = write_status(redis, keys, rid, status, pay_by.map(|p| p.max(0) as u64))?;
    Ok(Outcome::done(format!(
        "re-created order {id} of {rid} (recorded after an interruption: MySQL holds it); {}",
        status_text(wrote, status)
    )))
}

/// The status write's result, in words.
fn status_text(wrote: bool, status: OrderStatus) -> String {
    if wrote {
        format!("Redis status {status}")
    } else {
        "Redis status left as it is (its flow record was released meanwhile)".to_string()
    }
}

/// `KEYS`: flow, status, pay_by. `ARGV`: reservation id, status, deadline
/// (Unix ms, `''` for none). Writes the status (and deadline) only while the
/// flow record is held; replies 1 when it wrote, 0 otherwise; an error
/// reply, with nothing written, when a key holds the wrong type.
const STATUS_LUA: &str = concat!(
    seckill_common::lua_expect_types!(),
    r"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'hash', KEYS[3], 'hash'})
if bad then return bad end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[3]) end
return 1"
);

/// Writes `status` (and `pay_by` for a pending order) of `rid` in bucket
/// `k`, only while its flow record is held; returns whether it wrote.
fn write_status(
    redis: &mut Con,
    k: SaleKeys,
    rid: &str,
    status: OrderStatus,
    pay_by: Option<u64>,
) -> Result<bool, RunError> {
    static S: OnceLock<Script> = OnceLock::new();
    let deadline = match status {
        OrderStatus::PendingPayment => pay_by.map(|p| p.to_string()).unwrap_or_default(),
        _ => String::new(),
    };
    let n: i64 = S
        .get_or_init(|| Script::new(STATUS_LUA))
        .key(k.flow())
        .key(k.status())
        .key(k.pay_by())
        .arg(rid)
        .arg(status.as_str())
        .arg(deadline)
        .invoke(redis)?;
    Ok(n == 1)
}
