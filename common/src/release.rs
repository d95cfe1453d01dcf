//! Owns the release of a reservation (the operator's "rollback", and the
//! lifecycle's expiry and cancellation): one atomic Lua script that puts a
//! reserved unit back on sale in Redis.
//!
//! A release is the exact inverse of the reservation script
//! (`reservation.rs`): the flow record and the user's purchase mark are
//! removed (the mark's reservation id is kept in the sale's
//! `buyers:released` hash, which the status route reads for a buyer who
//! holds no mark), the stock counter goes up by the reservation's units
//! (its message's `quantity`, 1 when absent; and the meta field `releases`
//! by as many, so the reservation sequence, which counts units, never goes
//! back), the status becomes `failed`,
//! and a copy of the order message still waiting in the sale's queue is
//! removed so no worker turns it into an order afterwards. It refuses, and
//! changes nothing, while the unit may already be an order: when the status
//! is `confirmed`, `pending_payment` or `paid` (the worker marks it after its MySQL commit, before it
//! removes the message from its processing list) or when the message sits in
//! a processing list. Repeating a release finds no flow record and changes
//! nothing, so stock goes up exactly once however often it is run.
//!
//! A release writes nothing to MySQL: the caller checks first that MySQL holds
//! no order for the reservation.
//!
//! The lifecycle mode ([`release_order`]) is the Redis step of an order that
//! MySQL has already expired or cancelled (`lifecycle.rs`: MySQL decides,
//! Redis follows). It skips the `confirmed` and in-flight refusals (the
//! order exists: that is the point), moves the flow record into the sale's
//! `released` hash instead of deleting it (so `stock + flow records =
//! total` still holds, and the evidence stays), removes the buyer mark only
//! when the sale lets a released buyer buy again (keeping it in
//! `buyers:released` as above), and sets the status
//! `expired` or `cancelled`. The `released` entry makes it happen once:
//! a repeat replies `already` and changes nothing.
//!
//! In a sale of several units per buyer (meta `max_per_buyer` above 1) the
//! buyer's mark is their list of held reservations (`allowance::Held`):
//! removing the mark takes the reservation's `RID:Q` entry out of the list,
//! and the field goes when the list is empty.

use crate::keys::SaleKeys;
use redis::{ConnectionLike, FromRedisValue, Script, Value};
use std::fmt;
use std::sync::OnceLock;

/// The release script. `KEYS`: flow, buyers, stock, status, queue, meta,
/// released, released buyers, then the sale's processing list of every
/// known worker (any number, may be none); it counts itself in the meta field `releases`, which keeps the
/// sale's reservation sequence (`reservation::sequence`) from going back;
/// `ARGV`: the reservation id. Replies `{'released', stock_after}`,
/// `{'not_found'}`, `{'confirmed'}` or `{'in_flight', processing_key}`;
/// an error reply, with nothing changed, when a key it writes holds the
/// wrong type or the stock is not an integer (see `lua.rs`). With `ARGV[2]`
/// = `check` it stops before its first write and replies `{'clear',
/// stock}` where it would release: what a rollback would come to. With
/// `ARGV[2]` = `expired` or `cancelled` (the lifecycle mode, see the module
/// doc; `ARGV[3]` = `1` removes the buyer mark) it replies `{'released',
/// stock_after}`, `{'already'}` (released before) or `{'not_found'}`.
pub const RELEASE_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'hash', KEYS[3], 'string',
  KEYS[4], 'hash', KEYS[5], 'list', KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'hash'})
if bad then return bad end
local left = redis.call('GET', KEYS[3])
if left and not string.find(left, '^-?%d+$') then
  return redis.error_reply('ERR ' .. KEYS[3] .. ' is not an integer')
end
local releases = redis.call('HGET', KEYS[6], 'releases')
if releases and not string.find(releases, '^%d+$') then
  return redis.error_reply('ERR ' .. KEYS[6] .. ' field releases is not an integer')
end
local lifecycle = ARGV[2] == 'expired' or ARGV[2] == 'cancelled'
if lifecycle and redis.call('HEXISTS', KEYS[7], ARGV[1]) == 1 then return {'already'} end
local msg = redis.call('HGET', KEYS[1], ARGV[1])
if not msg then return {'not_found'} end
local units = tonumber(string.match(msg, ',"quantity":(%d+)}$') or '1')
local multi = (tonumber(redis.call('HGET', KEYS[6], 'max_per_buyer') or '1') or 1) > 1
local function unmark(user)
  if not user then return end
  if not multi then
    if redis.call('HGET', KEYS[2], user) ~= ARGV[1] then return end
    redis.call('HDEL', KEYS[2], user)
  else
    local held = redis.call('HGET', KEYS[2], user)
    if not held then return end
    local keep, found = {}, false
    for e in string.gmatch(held, '[^,]+') do
      if string.sub(e, 1, 33) == ARGV[1] .. ':' then found = true else keep[#keep + 1] = e end
    end
    if not found then return end
    if #keep == 0 then redis.call('HDEL', KEYS[2], user)
    else redis.call('HSET', KEYS[2], user, table.concat(keep, ',')) end
  end
  redis.call('HSET', KEYS[8], user, ARGV[1])
end
if lifecycle then
  local user = string.match(msg, '"user_id":"([^"]*)"')
  redis.call('LREM', KEYS[5], 0, msg)
  redis.call('HSET', KEYS[7], ARGV[1], msg)
  redis.call('HDEL', KEYS[1], ARGV[1])
  if ARGV[3] == '1' then unmark(user) end
  local stock = redis.call('INCRBY', KEYS[3], units)
  redis.call('HINCRBY', KEYS[6], 'releases', units)
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
  return {'released', tostring(stock)}
end
local st = redis.call('HGET', KEYS[4], ARGV[1])
if st == 'confirmed' or st == 'pending_payment' or st == 'paid' then return {'confirmed'} end
for i = 9, #KEYS do
  if redis.call('LPOS', KEYS[i], msg) then return {'in_flight', KEYS[i]} end
end
if ARGV[2] == 'check' then return {'clear', left or '0'} end
local user = string.match(msg, '"user_id":"([^"]*)"')
redis.call('LREM', KEYS[5], 0, msg)
redis.call('HDEL', KEYS[1], ARGV[1])
unmark(user)
local stock = redis.call('INCRBY', KEYS[3], units)
redis.call('HINCRBY', KEYS[6], 'releases', units)
redis.call('HSET', KEYS[4], ARGV[1], 'failed')
return {'released', tostring(stock)}
"#
);
fn release_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    S.get_or_init(|| Script::new(RELEASE_LUA))
}

/// What a release came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The unit is back on sale; holds the stock counter after the increment.
    Released {
        /// Units left to reserve after the release.
        stock_after: i64,
    },
    /// No flow record for the reservation: never reserved, or already
    /// released. Nothing changed.
    NotFound,
    /// The worker has confirmed the reservation (an order exists or is being
    /// committed). Nothing changed.
    Confirmed,
    /// The order message sits in this processing list: a worker is applying
    /// it right now. Nothing changed; try again later.
    InFlight(String),
}

/// Why a release could not be attempted or understood.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReleaseError {
    /// The reservation id is not 32 lowercase hex digits; checked before any
    /// Redis call.
    InvalidReservationId,
    /// Redis could not be reached or answered with an error.
    Redis(redis::RedisError),
    /// Redis answered with a reply this build does not understand.
    UnexpectedReply(String),
    /// The script refused to run and changed nothing (a key of the wrong
    /// type, a stock that is not an integer, Redis out of memory); holds
    /// Redis's message, which names the key.
    Refused(String),
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReleaseError::InvalidReservationId => write!(f, "release: invalid reservation id"),
            ReleaseError::Redis(e) => write!(f, "release: redis: {e}"),
            ReleaseError::UnexpectedReply(r) => write!(f, "release: unexpected reply: {r}"),
            ReleaseError::Refused(m) => write!(f, "release refused by Redis: {m}"),
        }
    }
}

impl std::error::Error for ReleaseError {}

impl From<redis::RedisError> for ReleaseError {
    fn from(e: redis::RedisError) -> Self {
        if crate::is_error_reply(&e) {
            return ReleaseError::Refused(e.to_string());
        }
        ReleaseError::Redis(e)
    }
}

/// Releases reservation `reservation_id` of sale `sale_id` in one atomic
/// script. `worker_ids` are the members of [`crate::keys::WORKERS`]: their
/// processing lists for this sale are checked for the message.
///
/// Errors: [`ReleaseError::InvalidReservationId`] before any call, Redis
/// failures, or a reply of another shape.
pub fn release<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    reservation_id: &str,
    worker_ids: &[String],
) -> Result<ReleaseOutcome, ReleaseError> {
    release_in(con, SaleKeys::new(sale_id), reservation_id, worker_ids)
}

/// [`release`] in bucket `k` of a sale split over buckets (the bucket that
/// holds the reservation: `buckets::holding`); its stock gets the unit.
///
/// Errors: as [`release`].
pub fn release_in<C: ConnectionLike>(
    con: &mut C,
    k: SaleKeys,
    reservation_id: &str,
    worker_ids: &[String],
) -> Result<ReleaseOutcome, ReleaseError> {
    let parts = run_mode(con, k, reservation_id, worker_ids, "release", false)?;
    let unexpected = || ReleaseError::UnexpectedReply(format!("{parts:?}"));
    match parts.first().map(String::as_str) {
        Some("released") => {
            let stock_after = parts
                .get(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(unexpected)?;
            Ok(ReleaseOutcome::Released { stock_after })
        }
        _ => refusal(&parts).ok_or_else(unexpected),
    }
}

/// What a release of `reservation_id` would come to, changing nothing (the
/// same script, stopped before its first write): `Ok(stock)` (units left
/// now) when it would release, `Err(outcome)` with its refusal otherwise.
///
/// Errors: as [`release`].
pub fn check<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    reservation_id: &str,
    worker_ids: &[String],
) -> Result<Result<i64, ReleaseOutcome>, ReleaseError> {
    check_in(con, SaleKeys::new(sale_id), reservation_id, worker_ids)
}

/// [`check`] in bucket `k` (see [`release_in`]).
///
/// Errors: as [`release`].
pub fn check_in<C: ConnectionLike>(
    con: &mut C,
    k: SaleKeys,
    reservation_id: &str,
    worker_ids: &[String],
) -> Result<Result<i64, ReleaseOutcome>, ReleaseError> {
    let parts = run_mode(con, k, reservation_id, worker_ids, "check", false)?;
    let unexpected = || ReleaseError::UnexpectedReply(format!("{parts:?}"));
    match parts.first().map(String::as_str) {
        Some("clear") => Ok(Ok(parts
            .get(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(unexpected)?)),
        _ => Ok(Err(refusal(&parts).ok_or_else(unexpected)?)),
    }
}

/// What the lifecycle mode of a release came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderRelease {
    /// The unit is back on sale now; holds the stock counter after it.
    Released {
        /// Units left to reserve after the release.
        stock_after: i64,
    },
    /// Released before (the `released` hash holds it): nothing changed.
    Already,
    /// Redis holds no flow record for it and never released it (Redis lost
    /// it): nothing changed; the reconciler's stock rules report the unit.
    NotFound,
}

/// The Redis step of an order MySQL has expired or cancelled (`kind`; the
/// status becomes `expired` or `cancelled`): see the module doc. `k` is the
/// bucket that holds the reservation's flow record and its buyer's mark
/// (the buyer's home bucket, `buckets::home_bucket`; the sale's own keys
/// for a sale of one bucket): the unit goes back to that bucket's stock.
/// `rebuy` removes the buyer's mark (the sale's `rebuy_after_release`).
/// Idempotent by reservation id.
///
/// Errors: as [`release`].
pub fn release_order<C: ConnectionLike>(
    con: &mut C,
    k: SaleKeys,
    reservation_id: &str,
    kind: crate::order::Release,
    rebuy: bool,
) -> Result<OrderRelease, ReleaseError> {
    let status = match kind {
        crate::order::Release::Expire => crate::keys::PurchaseStatus::Expired,
        crate::order::Release::Cancel => crate::keys::PurchaseStatus::Cancelled,
    };
    let parts = run_mode(con, k, reservation_id, &[], status.as_str(), rebuy)?;
    let unexpected = || ReleaseError::UnexpectedReply(format!("{parts:?}"));
    match parts.first().map(String::as_str) {
        Some("released") => Ok(OrderRelease::Released {
            stock_after: parts
                .get(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(unexpected)?,
        }),
        Some("already") => Ok(OrderRelease::Already),
        Some("not_found") => Ok(OrderRelease::NotFound),
        _ => Err(unexpected()),
    }
}

/// The refusals both modes share.
fn refusal(parts: &[String]) -> Option<ReleaseOutcome> {
    match parts.first().map(String::as_str) {
        Some("not_found") => Some(ReleaseOutcome::NotFound),
        Some("confirmed") => Some(ReleaseOutcome::Confirmed),
        Some("in_flight") => parts.get(1).cloned().map(ReleaseOutcome::InFlight),
        _ => None,
    }
}

fn run_mode<C: ConnectionLike>(
    con: &mut C,
    k: SaleKeys,
    reservation_id: &str,
    worker_ids: &[String],
    mode: &str,
    rebuy: bool,
) -> Result<Vec<String>, ReleaseError> {
    if !crate::ids::is_valid_reservation_id(reservation_id) {
        return Err(ReleaseError::InvalidReservationId);
    }
    let mut inv = release_script().prepare_invoke();
    inv.key(k.flow())
        .key(k.buyers())
        .key(k.stock())
        .key(k.status())
        .key(k.queue())
        .key(k.meta())
        .key(k.released())
        .key(k.released_buyers());
    for w in worker_ids {
        inv.key(k.processing(w));
    }
    inv.arg(reservation_id)
        .arg(mode)
        .arg(if rebuy { "1" } else { "0" });
    let reply: Value = inv.invoke(con)?;
    Vec::<String>::from_redis_value(reply.clone())
        .map_err(|_| ReleaseError::UnexpectedReply(format!("{reply:?}")))
}
