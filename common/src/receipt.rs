//! Owns the payment receipt: the Redis record, written by the same script
//! that queues a payment, of each payment received for a reservation and
//! when (Redis's clock); and the expiry sweep's closing of a reservation
//! past its deadline, which the receipts make exact.
//!
//! The rule: the moment the payment was received decides. A payment
//! received at or before `pay_by` makes its order `paid`; one received
//! after is late. "Received" is Redis's `TIME` inside [`receive`]'s script
//! (the one clock every gateway shares; `pay_by` is Redis's clock too:
//! the reservation's `reserved_at_ms` plus the window), in Unix ms.
//!
//! Why a record: a worker applies a payment some milliseconds after the
//! gateway received it, and the sweep may reach the order's deadline in
//! between. The two meet in one Redis hash per reservation,
//! [`key`] (`seckill:{payments}:receipt:RESERVATION`, the payment queue's
//! hash tag, so on a Redis Cluster the queue and every receipt share one
//! slot and each script stays on one master):
//!
//! - [`receive`] (the gateway): reads `TIME`; if the reservation is
//!   closed, the payment's time becomes one past the closing (so it is
//!   late whatever the clock says after a failover); otherwise it stores
//!   the queued message in field `p:PAYMENT_ID` (the first receipt of a
//!   payment id stands, and a replay of the same payment queues that same
//!   message again, with its first time). Then it `LPUSH`es the message.
//! - [`close`] (the sweep, for an order MySQL says is due): refuses while
//!   Redis's clock is not past `pay_by` ([`Closing::Open`]); otherwise sets
//!   field `closed` (once) and returns every receipt stored. The sweep
//!   applies those payments in MySQL before it expires the order.
//! - [`forget`] (after MySQL committed a payment, by the payment thread or
//!   the sweep): removes that receipt, only if it is the same message.
//! - An operator's drop of the payment's dead letter removes its [`field`]
//!   in the script that removes the entry, and records the payment in
//!   MySQL as `dropped` (`dropped_payment.rs`): MySQL then decides, so a
//!   sweep that took the receipt a moment before changes nothing either.
//!
//! Why exact: both scripts run atomically on one master, so a payment is
//! either received before the closing (its receipt is returned by
//! [`close`], or was forgotten only after MySQL committed it: then MySQL
//! holds it, as `paid`, late, or `unknown_reservation`, which the sweep
//! decides again before expiring) or after it (its time is past the
//! closing, which is past `pay_by`: late). No receipt received in time is
//! missed, and no order is both paid and expired: MySQL's guarded
//! `UPDATE`s decide that.
//!
//! Memory: a receipt lives until its payment is committed (then
//! [`forget`]), at most [`RECEIPT_TTL_MS`] (7 days: a payment not applied
//! within a week of its receipt loses the protection; the queue would be a
//! week behind). A closed reservation without receipts keeps its mark for
//! [`CLOSED_TTL_MS`] (1 h): long enough that a later payment's own time is
//! past the deadline unless Redis's clock went back by more than an hour.

use crate::payment::{PaymentMessage, QUEUE};
use redis::{ConnectionLike, Script, Value};
use std::sync::OnceLock;

/// How long a receipt is kept at most, ms (7 days).
pub const RECEIPT_TTL_MS: u64 = 7 * 24 * 3_600_000;
/// How long a closed reservation without receipts keeps its mark, ms (1 h).
pub const CLOSED_TTL_MS: u64 = 3_600_000;

/// The receipt hash of reservation `reservation_id`.
pub fn key(reservation_id: &str) -> String {
    format!("seckill:{{payments}}:receipt:{reservation_id}")
}

/// The field of a payment id's receipt (a drop of its dead letter removes
/// it: `seckill-reconciler dead-letter drop payments`).
pub fn field(payment_id: &str) -> String {
    format!("p:{payment_id}")
}

fn unexpected(reply: &[Value]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "payment receipt script",
        format!("{reply:?}"),
    ))
}

/// `KEYS`: queue, receipt. `ARGV`: the message's JSON up to and including
/// `"received_ms":`, the receipt field, the receipt TTL ms. Replies the
/// queued message. (No cap on the receipts of one reservation: only the
/// payment service, which signs, can add one.)
const RECEIVE_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'list', KEYS[2], 'hash'})
if bad then return bad end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local closed = tonumber(redis.call('HGET', KEYS[2], 'closed') or '')
local msg
if closed then
  if now <= closed then now = closed + 1 end
  msg = ARGV[1] .. string.format('%d', now) .. '}'
else
  local first = redis.call('HGET', KEYS[2], ARGV[2])
  if first and string.sub(first, 1, #ARGV[1]) == ARGV[1] then
    msg = first
  else
    msg = ARGV[1] .. string.format('%d', now) .. '}'
    if not first then
      redis.call('HSET', KEYS[2], ARGV[2], msg)
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
  end
end
redis.call('LPUSH', KEYS[1], msg)
return {'queued', msg}
"#
);

/// `KEYS`: receipt. `ARGV`: `pay_by` ms, the closed TTL ms.
const CLOSE_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash'})
if bad then return bad end
if not redis.call('HGET', KEYS[1], 'closed') then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now <= tonumber(ARGV[1]) then return {'open'} end
  redis.call('HSET', KEYS[1], 'closed', string.format('%d', now))
  if redis.call('HLEN', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
end
local out = {'closed'}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'p:' then out[#out + 1] = all[i + 1] end
end
return out
"#
);

/// `KEYS`: receipt. `ARGV`: field, the message, the closed TTL ms.
const FORGET_LUA: &str = r#"
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[1], 'closed') == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"#;

fn script(cell: &'static OnceLock<Script>, src: &'static str) -> &'static Script {
    cell.get_or_init(|| Script::new(src))
}

static RECEIVE: OnceLock<Script> = OnceLock::new();
static CLOSE: OnceLock<Script> = OnceLock::new();
static FORGET: OnceLock<Script> = OnceLock::new();

/// The message's JSON up to `"received_ms":` (the script appends the
/// time and the closing brace): the fields in [`PaymentMessage`]'s order.
fn prefix(m: &PaymentMessage) -> String {
    let json = m.to_json();
    match json.rfind("\"received_ms\":") {
        Some(at) => json[..at + "\"received_ms\":".len()].to_string(),
        None => json,
    }
}

/// Receives payment `m` (its `received_ms` is replaced by Redis's clock,
/// see the module doc): records the receipt and queues it, in one script.
/// Returns the message as queued.
///
/// Errors: Redis failures, or a reply of another shape (nothing queued, or
/// unknown on a broken connection: a repeat is the same payment id,
/// applied once).
pub fn receive<C: ConnectionLike>(
    con: &mut C,
    m: &PaymentMessage,
) -> redis::RedisResult<PaymentMessage> {
    let reply: Vec<Value> = script(&RECEIVE, RECEIVE_LUA)
        .key(QUEUE)
        .key(key(&m.reservation_id))
        .arg(prefix(m))
        .arg(field(&m.payment_id))
        .arg(RECEIPT_TTL_MS)
        .invoke(con)?;
    let parts = strings(&reply);
    match parts.as_slice() {
        [s, msg] if s == "queued" => {
            PaymentMessage::parse(msg.as_bytes()).map_err(|_| unexpected(&reply))
        }
        _ => Err(unexpected(&reply)),
    }
}

/// What [`close`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// Redis's clock is not past `pay_by` yet: nothing changed; the order
    /// may still be paid in time.
    Open,
    /// Closed (now or before): every payment received after this is late.
    /// Holds the payments received before, not yet forgotten, each to be
    /// applied before the order is expired.
    Closed(Vec<PaymentMessage>),
}

/// Closes reservation `reservation_id`, due at `pay_by_ms` (see the module
/// doc). A stored receipt that does not parse is logged and skipped (only
/// [`receive`] writes them).
///
/// Errors: Redis failures, or a reply of another shape (nothing closed,
/// or closed: a repeat is harmless).
pub fn close<C: ConnectionLike>(
    con: &mut C,
    reservation_id: &str,
    pay_by_ms: u64,
) -> redis::RedisResult<Closing> {
    let reply: Vec<Value> = script(&CLOSE, CLOSE_LUA)
        .key(key(reservation_id))
        .arg(pay_by_ms)
        .arg(CLOSED_TTL_MS)
        .invoke(con)?;
    let parts = strings(&reply);
    match parts.split_first() {
        Some((s, [])) if s == "open" => Ok(Closing::Open),
        Some((s, rest)) if s == "closed" => Ok(Closing::Closed(
            rest.iter()
                .filter_map(|raw| match PaymentMessage::parse(raw.as_bytes()) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        log::warn!("receipt of {reservation_id} does not parse ({e}): {raw}");
                        None
                    }
                })
                .collect(),
        )),
        _ => Err(unexpected(&reply)),
    }
}

/// Removes the receipt of `m` once MySQL committed it (only when the
/// stored receipt is this very message: a delivery of the same payment id
/// with other fields does not remove the first's).
///
/// Errors: Redis failures (the receipt stays; removed by the next
/// application of the same message, or at its TTL).
pub fn forget<C: ConnectionLike>(con: &mut C, m: &PaymentMessage) -> redis::RedisResult<()> {
    script(&FORGET, FORGET_LUA)
        .key(key(&m.reservation_id))
        .arg(field(&m.payment_id))
        .arg(m.to_json())
        .arg(CLOSED_TTL_MS)
        .invoke::<i64>(con)?;
    Ok(())
}

fn strings(reply: &[Value]) -> Vec<String> {
    reply
        .iter()
        .map(|v| match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_ends_where_the_script_writes_the_time() {
        let m = PaymentMessage {
            v: 1,
            reservation_id: "0123456789abcdef0123456789abcdef".into(),
            payment_id: "p-1".into(),
            amount_cents: 1999,
            received_ms: 1_764_400_000_000,
        };
        let p = prefix(&m);
        assert!(p.ends_with("\"received_ms\":"), "{p}");
        let again = format!("{p}1764400000123}}");
        let parsed = PaymentMessage::parse(again.as_bytes()).unwrap();
        assert_eq!(parsed.received_ms, 1_764_400_000_123);
        assert_eq!(parsed.to_json(), again);
    }
}
