//! Owns the reservation of several units in one purchase: the second
//! reservation script, run only for a purchase that names a quantity or
//! carries an `Idempotency-Key`, so the one-unit script of
//! `reservation.rs` (the hot path of every one-unit sale) stays as it is.
//!
//! Rules (`allowance.rs` holds the shapes): a sale sells up to `L` units
//! per buyer (meta `max_per_buyer`) and up to `Q` per purchase (meta
//! `max_per_purchase`, absent = `L`). A purchase of `N` units takes all
//! `N` or nothing: the stock must hold `N` and the buyer's held units
//! (the sum of the quantities in their `Held` list) plus `N` must stay
//! within `L`, both checked before the first write; then one flow record
//! and one order message carry `N` (`"quantity":N` last, absent for one
//! unit: `OrderMessage::to_json`'s bytes), the stock goes down by `N`, the
//! buyer's list gets `RID:N` appended and the status is `queued`.
//!
//! The reservation id is the purchase's key (`ids::keyed_reservation_id`):
//! the script finds a repeat by it. A flow record of that id means the
//! purchase was made: the same quantity is answered `replayed` with the
//! id (nothing taken), another quantity `key_reused`. A status
//! `expired`, `cancelled` or `failed` is answered `released` as the
//! one-unit script does (the flow record moved to `released`), and so is
//! `on_hold` (a dead letter: the key bought once, an operator decides it).
//!
//! Why fewer than `N` units left is its own answer (`not_enough`, with the
//! units left) and not `sold_out`: a smaller purchase that fits must still
//! be served, so the gateway's sold-out memory hears `sold_out` only when
//! the stock is 0.

use crate::keys::SaleKeys;
use crate::reservation::{Replied, ReserveError};
use redis::{ConnectionLike, Script, ScriptInvocation, Value};
use std::sync::OnceLock;

/// The units script. `KEYS`: meta, stock, buyers, flow, status, queue (as
/// `reservation::RESERVE_LUA`); `ARGV`: user id, reservation id (keyed),
/// sale id, quantity `N`. One buyer per call.
///
/// Replies one line `"CODE SEQ DETAIL"` (parsed by
/// [`crate::reservation::parse`]): `reserved SEQ RID`, `replayed SEQ RID`,
/// `key_reused SEQ RID`, `released SEQ RID`, `sold_out SEQ ` (stock 0),
/// `not_enough SEQ LEFT` (0 < stock < N), `limit_reached SEQ RID:Q,...`
/// (the buyer's list), `above_max SEQ Q` (N above the sale's Q),
/// `key_required SEQ ` (no reservation id),
/// `one_per_buyer 0 ` (the sale has L = 1: the one-unit script serves
/// it), and `paused`, `unknown_sale`, `not_started`, `ended` as the
/// one-unit script. Checks in that order after the window: Q, the key,
/// the key's earlier purchase, the buyer's allowance, the stock.
///
/// Nothing or everything: every key written is read (or its type checked,
/// the queue) before the first write; a key of the wrong type is the
/// error reply `WRONGTYPE <key> ...` with nothing changed.
pub const RESERVE_UNITS_LUA: &str = concat!(
    crate::lua_expect_types!(),
    crate::lua_refused!(),
    r#"
if #ARGV ~= 4 then
  return redis.error_reply('ERR wrong number of arguments: user id, reservation id, sale id, quantity')
end
local user, rid, n = ARGV[1], ARGV[2], tonumber(ARGV[4])
if #user < 1 or #user > 64 or not string.find(user, '^[A-Za-z0-9_.-]+$') then
  return redis.error_reply('ERR invalid user id')
end
if rid ~= '' and (not string.find(rid, '^[0-9a-f]+$') or #rid ~= 32) then
  return redis.error_reply('ERR invalid reservation id')
end
if not n or n ~= math.floor(n) or n < 1 or n > 100 then
  return redis.error_reply('ERR invalid quantity')
end
local w = redis.pcall('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'total_stock', 'releases', '"#,
    crate::paused_field!(),
    r#"', 'operator_paused', 'max_per_buyer', 'max_per_purchase', '"#,
    crate::stamp_field!(),
    r#"', '"#,
    crate::local_stamp_field!(),
    r#"')
if w['err'] then return refused(KEYS[1], w) end
if w[5] then return 'paused 0 ' .. w[5] end
if w[6] then return 'paused 0 operator' end
if w[9] and w[9] ~= w[10] then return 'paused 0 master_changed' end
local starts, ends, total = tonumber(w[1]), tonumber(w[2]), tonumber(w[3])
if not starts or not ends or not total then return 'unknown_sale 0 ' end
local releases = tonumber(w[4] or '0')
local limit = tonumber(w[7] or '1')
if not releases or not limit then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' field releases or max_per_buyer is not an integer')
end
if limit <= 1 then return 'one_per_buyer 0 ' end
local most = tonumber(w[8] or w[7])
if not most then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' field max_per_purchase is not an integer')
end"#,
    crate::lua_read_stock!(),
    r#"
local seq = string.format('%d', total - stock + releases)"#,
    crate::lua_now!(),
    r#"
if now < starts then return 'not_started ' .. seq .. ' ' end
if now >= ends then return 'ended ' .. seq .. ' ' end
if n > most then return 'above_max ' .. seq .. ' ' .. string.format('%d', most) end
if rid == '' then return 'key_required ' .. seq .. ' ' end
local st = redis.pcall('HGET', KEYS[5], rid)
if type(st) == 'table' then return refused(KEYS[5], st) end
if st == 'expired' or st == 'cancelled' or st == 'failed' or st == 'on_hold' then
  return 'released ' .. seq .. ' ' .. rid
end
local flow = redis.pcall('HGET', KEYS[4], rid)
if type(flow) == 'table' then return refused(KEYS[4], flow) end
if flow then
  local q = tonumber(string.match(flow, '"quantity":(%d+)}$') or '1')
  if q == n then return 'replayed ' .. seq .. ' ' .. rid end
  return 'key_reused ' .. seq .. ' ' .. rid
end
local held = redis.pcall('HGET', KEYS[3], user)
if type(held) == 'table' then return refused(KEYS[3], held) end
held = held or ''
local units = 0
for q in string.gmatch(held, ':(%d+)') do units = units + tonumber(q) end
if units + n > limit then return 'limit_reached ' .. seq .. ' ' .. held end
if stock < 1 then return 'sold_out ' .. seq .. ' ' end
if stock < n then return 'not_enough ' .. seq .. ' ' .. string.format('%d', stock) end
local bad = expect_type(KEYS[6], 'list')
if bad then return bad end
local qty = ''
if n > 1 then qty = ',"quantity":' .. string.format('%d', n) end
local msg = '{"v":1,"reservation_id":"' .. rid .. '","sale_id":' .. ARGV[3] ..
  ',"user_id":"' .. user .. '","reserved_at_ms":' .. string.format('%d', now) .. qty .. '}'
local entry = rid .. ':' .. string.format('%d', n)
if held ~= '' then entry = held .. ',' .. entry end
redis.call('DECRBY', KEYS[2], n)
redis.call('HSET', KEYS[3], user, entry)
redis.call('HSET', KEYS[4], rid, msg)
redis.call('HSET', KEYS[5], rid, 'queued')
redis.call('LPUSH', KEYS[6], msg)
return 'reserved ' .. string.format('%d', total - stock + n + releases) .. ' ' .. rid
"#
);

/// The compiled units script (its SHA1 is computed once).
pub fn reserve_units_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(RESERVE_UNITS_LUA))
}

/// The script call for one purchase of `quantity` units on bucket `k` (a
/// one-bucket sale's own keys) under the keyed `reservation_id` (empty:
/// the purchase has no key).
pub fn prepare_units(
    k: SaleKeys,
    user_id: &str,
    reservation_id: &str,
    quantity: u32,
) -> ScriptInvocation<'static> {
    let sale_id = k.sale_id;
    let mut inv = reserve_units_script().prepare_invoke();
    for key in k.reservation_keys() {
        inv.key(key);
    }
    inv.arg(user_id)
        .arg(reservation_id)
        .arg(sale_id)
        .arg(quantity);
    inv
}

/// One purchase of `quantity` units of `sale_id` for `user_id` under the
/// keyed `reservation_id` (empty: no key), in one round trip (the script is loaded again
/// on `NOSCRIPT`).
///
/// Errors: [`ReserveError::InvalidUser`] before any call; Redis failures;
/// [`ReserveError::Refused`] for the script's error reply (nothing
/// changed).
pub fn reserve_units<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    user_id: &str,
    reservation_id: &str,
    quantity: u32,
) -> Result<Replied, ReserveError> {
    if !crate::is_valid_token(user_id) {
        return Err(ReserveError::InvalidUser);
    }
    let reply: Value =
        prepare_units(SaleKeys::new(sale_id), user_id, reservation_id, quantity).invoke(con)?;
    crate::reservation::parse(&reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_caps_quantities_at_max_units() {
        let check = format!("n > {}", crate::allowance::MAX_UNITS);
        assert!(RESERVE_UNITS_LUA.contains(&check), "{check}");
    }
}
