//! Owns the reservation: the one atomic Lua script that checks the sale
//! window, the buyer and the stock, and only then takes a unit, writes the
//! flow record and queues the order message.
//!
//! The script performs every check before its first write, because Redis does
//! not roll back the writes of a script that fails half-way. It reads the time
//! with `TIME` (Redis's clock, so gateway clocks do not matter) and never lets
//! the stock go below zero: it decrements only after reading a stock of at
//! least one, inside one atomic script.

use crate::keys::SaleKeys;
use redis::{ConnectionLike, FromRedisValue, Script, ScriptInvocation, Value};
use std::fmt;
use std::sync::OnceLock;

/// The reservation script. `KEYS`: meta, stock, buyers, flow, status, queue
/// (see [`crate::keys`]); `ARGV`: user id, fresh reservation id, sale id.
/// Replies `{code}` or `{code, reservation_id}`.
pub const RESERVE_LUA: &str = r#"
local w = redis.call('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms')
local starts = tonumber(w[1])
local ends = tonumber(w[2])
if not starts or not ends then return {'unknown_sale'} end
local user = ARGV[1]
if #user < 1 or #user > 64 or not string.find(user, '^[A-Za-z0-9_.-]+$') then
  return redis.error_reply('ERR invalid user id')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < starts then return {'not_started'} end
if now >= ends then return {'ended'} end
local prev = redis.call('HGET', KEYS[3], user)
if prev then return {'already_purchased', prev} end
local stock = tonumber(redis.call('GET', KEYS[2]))
if not stock or stock < 1 then return {'sold_out'} end
local msg = '{"v":1,"reservation_id":"' .. ARGV[2] .. '","sale_id":' .. ARGV[3] ..
  ',"user_id":"' .. user .. '","reserved_at_ms":' .. string.format('%d', now) .. '}'
redis.call('DECR', KEYS[2])
redis.call('HSET', KEYS[3], user, ARGV[2])
redis.call('HSET', KEYS[4], ARGV[2], msg)
redis.call('HSET', KEYS[5], ARGV[2], 'queued')
redis.call('LPUSH', KEYS[6], msg)
return {'reserved', ARGV[2]}
"#;

/// The compiled reservation script (its SHA1 is computed once).
pub fn reserve_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(RESERVE_LUA))
}

/// What one purchase attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// A unit was taken; the order message is queued. Holds the reservation id.
    Reserved(String),
    /// No unit left.
    SoldOut,
    /// This user already holds a reservation for the sale; holds its id.
    AlreadyPurchased(String),
    /// The sale's window has not opened yet (by Redis's clock).
    NotStarted,
    /// The sale's window has closed.
    Ended,
    /// No sale with this id is loaded into Redis.
    UnknownSale,
}

/// Why a reservation could not be attempted. Nothing was changed in Redis.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReserveError {
    /// The user id breaks the rule (1-64 of `A-Z a-z 0-9 _ . -`); checked
    /// before any Redis call.
    InvalidUser,
    /// Redis could not be reached or answered with an error.
    Redis(redis::RedisError),
    /// Redis answered with a reply this build does not understand.
    UnexpectedReply(String),
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::InvalidUser => write!(f, "invalid user id"),
            ReserveError::Redis(e) => write!(f, "redis: {e}"),
            ReserveError::UnexpectedReply(r) => write!(f, "unexpected reservation reply: {r}"),
        }
    }
}

impl std::error::Error for ReserveError {}

impl From<redis::RedisError> for ReserveError {
    fn from(e: redis::RedisError) -> Self {
        ReserveError::Redis(e)
    }
}

/// Builds the script call for one purchase; usable alone ([`reserve`]) or
/// queued in a pipeline by a caller that groups many purchases per round trip.
/// `reservation_id` must come from [`crate::ids::new_reservation_id`].
pub fn prepare(sale_id: u64, user_id: &str, reservation_id: &str) -> ScriptInvocation<'static> {
    let k = SaleKeys::new(sale_id);
    let mut inv = reserve_script().prepare_invoke();
    inv.key(k.meta())
        .key(k.stock())
        .key(k.buyers())
        .key(k.flow())
        .key(k.status())
        .key(k.queue())
        .arg(user_id)
        .arg(reservation_id)
        .arg(sale_id);
    inv
}

/// Reads the script's reply into an outcome.
///
/// Errors: [`ReserveError::UnexpectedReply`] for a reply of another shape.
pub fn parse_reply(reply: &Value) -> Result<ReserveOutcome, ReserveError> {
    let parts: Vec<String> = Vec::<String>::from_redis_value(reply.clone())
        .map_err(|_| ReserveError::UnexpectedReply(format!("{reply:?}")))?;
    let id = || {
        parts
            .get(1)
            .cloned()
            .ok_or_else(|| ReserveError::UnexpectedReply(format!("{parts:?}")))
    };
    match parts.first().map(String::as_str) {
        Some("reserved") => Ok(ReserveOutcome::Reserved(id()?)),
        Some("already_purchased") => Ok(ReserveOutcome::AlreadyPurchased(id()?)),
        Some("sold_out") => Ok(ReserveOutcome::SoldOut),
        Some("not_started") => Ok(ReserveOutcome::NotStarted),
        Some("ended") => Ok(ReserveOutcome::Ended),
        Some("unknown_sale") => Ok(ReserveOutcome::UnknownSale),
        _ => Err(ReserveError::UnexpectedReply(format!("{parts:?}"))),
    }
}

/// Attempts one purchase of one unit of `sale_id` for `user_id` in one round
/// trip (EVALSHA; the script is loaded again on `NOSCRIPT`).
///
/// Errors: [`ReserveError::InvalidUser`] before any call; otherwise Redis
/// failures. On an error nothing was reserved unless the connection broke
/// after the server ran the script (then the flow record tells).
pub fn reserve<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    user_id: &str,
) -> Result<ReserveOutcome, ReserveError> {
    if !crate::is_valid_token(user_id) {
        return Err(ReserveError::InvalidUser);
    }
    let rid = crate::ids::new_reservation_id();
    let reply: Value = prepare(sale_id, user_id, &rid).invoke(con)?;
    parse_reply(&reply)
}
