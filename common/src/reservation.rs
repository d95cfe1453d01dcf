//! Owns the reservation: the one atomic Lua script that checks the sale
//! window, the buyer and the stock, and only then takes a unit, writes the
//! flow record and queues the order message.
//!
//! The script performs every check before its first write, because Redis does
//! not roll back the writes of a script that fails half-way; a write that can
//! still fail (a key of the wrong type) undoes the ones before it. It reads the time
//! with `TIME` (Redis's clock, so gateway clocks do not matter) and never lets
//! the stock go below zero: it decrements only after reading a stock of at
//! least one, inside one atomic script.

use crate::allowance::Held;
use crate::keys::SaleKeys;
use redis::{ConnectionLike, Script, ScriptInvocation, Value};
use std::fmt;
use std::sync::OnceLock;

/// The reservation script. `KEYS`: meta, stock, buyers, flow, status, queue
/// (see [`crate::keys`]); `ARGV`: user id, fresh reservation id, sale id,
/// then, for a batch of more buyers of the same bucket (the gateway's
/// group commit, [`write_calls`]), one more user id and reservation id per
/// further buyer. The buyers are taken in order, as if each had run the
/// script alone one after the other (a buyer twice in one batch: the
/// second time `already_purchased` with the first's id), with one `TIME`
/// and one read of the meta and stock for the whole batch and its writes
/// made at the end, one command per key (`DECRBY`, `HSET` of the buyers,
/// the flow records and the statuses, one `LPUSH` of the messages): a
/// batch costs Redis the checks once, not once per buyer. Once the sale
/// has had a release (meta `releases` > 0, whatever the stock left; before,
/// no id can have been released, and a hot sale's calls pay nothing for
/// this), one `HMGET` of the statuses of the call's reservation ids: an id
/// that has a status was reserved before and released since (a retry of a
/// call whose reply was lost, after an expiry, a cancellation or a
/// rollback), and is answered `released` with nothing taken. So is the
/// re-send of an id whose buyer's mark the release kept (a sale without
/// `rebuy_after_release`) once its status is `expired`, `cancelled` or
/// `failed`, and of a dead-lettered id (status `on_hold`, mark kept, nothing
/// released; its status is read, one `HGET`, for a re-send of the buyer's
/// own id when the sale has had no release). Why each check: without the
/// status read, the retry would take a second unit under the same id once
/// the release removed the mark; run only with stock left, a split sale's
/// retry that found its home bucket empty would be answered `sold_out` and
/// the gateway would pull a unit from another bucket and buy it under a
/// fresh id; and a kept mark alone answers the buyer's own
/// `already_purchased`, which the gateway turns into 202 `queued`.
///
/// A sale whose meta `max_per_buyer` is not 1 (several units per buyer,
/// `allowance.rs`) is bought only through the units script
/// (`reserve_units.rs`, keyed): after the window's checks this script
/// answers every buyer `key_required` and takes nothing; one field more
/// in the one `HMGET` of the meta is all it costs a one-unit sale.
///
/// Replies one string per buyer, `"CODE SEQ DETAIL"`, joined by `\n` (one
/// bulk string, not a table: the gateway's Redis client parses one value
/// per batch, docs/PERFORMANCE.md):
/// `CODE` as in [`ReserveOutcome`], `DETAIL` (the rest of the string after
/// the second space) the reservation id (`reserved`, `released`; for
/// `already_purchased` the id, a space and the stock left, so that a
/// winner's retry also tells the gateway's sold-out memory whether units
/// came back),
/// the pause reason (`paused`: the meta field `paused`, e.g.
/// `redis_data_loss`, or `operator` for the field `operator_paused` that
/// `sale pause` sets, or `master_changed` while a bucket whose master
/// changed waits for a watch's check, `data_loss::STAMP_FIELD`) or empty, and `SEQ` the sale's reservation
/// sequence after that buyer's turn: units ever reserved, `total_stock − stock + releases` (see
/// [`sequence`]; derived, so a reservation writes nothing for it). Since
/// Redis runs scripts one at a time, `seq` orders the replies: a `reserved`
/// with a higher `seq` than a `sold_out` ran after it (stock came back), one
/// with a lower or equal `seq` before. In a batch, an invalid user id is
/// the line `error 0 ERR invalid user id` for that buyer alone; alone, it is
/// the error reply `ERR invalid user id`.
///
/// Arguments that are not the first buyer's three then whole pairs, or
/// more than [`MAX_BUYERS_PER_CALL`] buyers, are refused before anything
/// is read (`ERR wrong number of arguments ...`, `ERR too many buyers
/// ...`).
///
/// Whole or nothing: every key is read before the first write with
/// `pcall` (meta, buyers, stock, statuses: a wrong type is refused there, the error
/// naming the key); the writes that can still fail (flow, status, queue of
/// the wrong type) run under `pcall` too, and a failure undoes the writes
/// before it (inside the one atomic script, so no one sees them) and
/// returns `WRONGTYPE <key> ...` for the whole batch. A stock that is not
/// an integer is refused before any write; Redis's own `OOM` is checked
/// before the first write and lets the rest of the script write.
pub const RESERVE_LUA: &str = concat!(
    crate::lua_refused!(),
    r#"
if #ARGV < 3 or #ARGV % 2 == 0 then
  return redis.error_reply('ERR wrong number of arguments: user id, reservation id, sale id, then a user id and reservation id per further buyer')
end
local n = (#ARGV - 1) / 2
if n > 1024 then return redis.error_reply('ERR too many buyers in one call (at most 1024)') end
local function each(line)
  if n == 1 then return line end
  local out = {}
  for i = 1, n do out[i] = line end
  return table.concat(out, '\n')
end
local w = redis.pcall('HMGET', KEYS[1], 'starts_at_ms', 'ends_at_ms', 'total_stock', 'releases', '"#,
    crate::paused_field!(),
    r#"', 'operator_paused', 'max_per_buyer', '"#,
    crate::stamp_field!(),
    r#"', '"#,
    crate::local_stamp_field!(),
    r#"')
if w['err'] then return refused(KEYS[1], w) end
-- A pause wins over everything: a paused sale may have lost its meta too.
if w[5] then return each('paused 0 ' .. w[5]) end
if w[6] then return each('paused 0 operator') end
-- Another master than the watch last checked on (its stamps differ):
-- held until it has checked this one (data_loss.rs, STAMP_FIELD).
if w[8] and w[8] ~= w[9] then return each('paused 0 master_changed') end
local starts = tonumber(w[1])
local ends = tonumber(w[2])
local total = tonumber(w[3])
if not starts or not ends or not total then return each('unknown_sale 0 ') end
local releases = tonumber(w[4] or '0')
if not releases then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' field releases is not an integer')
end
local function buyer(i)
  if i == 1 then return ARGV[1], ARGV[2] end
  return ARGV[2 * i], ARGV[2 * i + 1]
end
local function valid(user)
  return #user >= 1 and #user <= 64 and string.find(user, '^[A-Za-z0-9_.-]+$')
end
for i = 1, n do
  if n == 1 and not valid(buyer(i)) then return redis.error_reply('ERR invalid user id') end
end"#,
    crate::lua_read_stock!(),
    crate::lua_now!(),
    r#"
if now < starts then return each('not_started ' .. string.format('%d', total - stock + releases) .. ' ') end
if now >= ends then return each('ended ' .. string.format('%d', total - stock + releases) .. ' ') end
-- A sale of more than one unit per buyer is bought with a key, by the
-- units script (`reserve_units.rs`): this one takes nothing of it.
if w[7] and tonumber(w[7]) ~= 1 then
  return each('key_required ' .. string.format('%d', total - stock + releases) .. ' ')
end
-- A reservation id with a status was reserved before and released since
-- (a retry of a call whose reply was lost): it takes nothing again. Only
-- a sale with a release has such ids. Read whatever the stock: with none
-- left, 'sold_out' would send a split sale's gateway to pull a unit from
-- another bucket and buy it under a fresh id.
local done = {}
if releases > 0 then
  local ids = {}
  for i = 1, n do
    local _, rid = buyer(i)
    ids[i] = rid
  end
  done = redis.pcall('HMGET', KEYS[5], unpack(ids))
  if done['err'] then return refused(KEYS[5], done) end
end
local out, seen = {}, {}
local taken, pairs_b, pairs_f, pairs_s, msgs, took = 0, {}, {}, {}, {}, {}
local at = string.format('%d', now)
for i = 1, n do
  local user, rid = buyer(i)
  if not valid(user) then
    out[i] = 'error 0 ERR invalid user id'
  else
    local prev = seen[user]
    if not prev then
      prev = redis.pcall('HGET', KEYS[3], user)
      if type(prev) == 'table' then return refused(KEYS[3], prev) end
    end
    local st = done[i]
    if prev == rid and releases == 0 then
      -- A re-send of the buyer's own id (rare) in a sale with no release:
      -- its status still tells a dead letter ('on_hold') or a rollback
      -- ('failed'): answered as released, nothing taken again.
      st = redis.pcall('HGET', KEYS[5], rid)
      if type(st) == 'table' then return refused(KEYS[5], st) end
    end
    local gone = st == 'expired' or st == 'cancelled' or st == 'failed' or st == 'on_hold'
    if prev and not (prev == rid and gone) then
      out[i] = 'already_purchased ' .. string.format('%d', total - stock + releases) .. ' ' ..
        prev .. ' ' .. string.format('%d', stock)
    elseif st then
      out[i] = 'released ' .. string.format('%d', total - stock + releases) .. ' ' .. rid
    elseif stock < 1 then
      out[i] = 'sold_out ' .. string.format('%d', total - stock + releases) .. ' '
    else
      local msg = '{"v":1,"reservation_id":"' .. rid .. '","sale_id":' .. ARGV[3] ..
        ',"user_id":"' .. user .. '","reserved_at_ms":' .. at .. '}'
      stock = stock - 1
      taken = taken + 1
      seen[user] = rid
      took[taken] = user
      pairs_b[2 * taken - 1] = user; pairs_b[2 * taken] = rid
      pairs_f[2 * taken - 1] = rid; pairs_f[2 * taken] = msg
      pairs_s[2 * taken - 1] = rid; pairs_s[2 * taken] = 'queued'
      msgs[taken] = msg
      out[i] = 'reserved ' .. string.format('%d', total - stock + releases) .. ' ' .. rid
    end
  end
end
if taken > 0 then
  -- Undoes this call's writes to the keys before KEYS[k] and refuses with
  -- r (KEYS[k] holds the wrong type; rare).
  local function undo(k, r)
    local ids = {}
    for j = 1, taken do ids[j] = pairs_f[2 * j - 1] end
    for key = k - 1, 4, -1 do redis.call('HDEL', KEYS[key], unpack(ids)) end
    redis.call('HDEL', KEYS[3], unpack(took))
    redis.call('INCRBY', KEYS[2], taken)
    return refused(KEYS[k], r)
  end
  redis.call('DECRBY', KEYS[2], taken)
  redis.call('HSET', KEYS[3], unpack(pairs_b))
  local r = redis.pcall('HSET', KEYS[4], unpack(pairs_f))
  if type(r) == 'table' then return undo(4, r) end
  r = redis.pcall('HSET', KEYS[5], unpack(pairs_s))
  if type(r) == 'table' then return undo(5, r) end
  r = redis.pcall('LPUSH', KEYS[6], unpack(msgs))
  if type(r) == 'table' then return undo(6, r) end
end
if n == 1 then return out[1] end
return table.concat(out, '\n')
"#
);

/// Most buyers one call of [`RESERVE_LUA`] takes (its writes hand every
/// buyer to one command, and Lua's `unpack` stops at 8,000 values); a
/// call with more is refused before any write. The group commit's
/// `MAX_BATCH` is below it.
pub const MAX_BUYERS_PER_CALL: usize = 1024;

/// The sale's reservation sequence from its meta fields and stock counter:
/// `total_stock − stock + releases`, units ever reserved. Every reservation
/// takes one unit (stock − 1) and every release gives one back while
/// counting itself (stock + 1, `releases` + 1), so it only grows — unless
/// Redis loses writes, which is how `data_loss.rs` catches that. Absent
/// fields count as 0; the result never goes below 0.
pub fn sequence(total_stock: u64, stock: i64, releases: u64) -> u64 {
    let s = i128::from(total_stock) - i128::from(stock) + i128::from(releases);
    u64::try_from(s.max(0)).unwrap_or(u64::MAX)
}

/// Reads sale `sale_id`'s reservation sequence ([`sequence`]) in one
/// round trip.
///
/// Errors: Redis failures, or fields that are not integers.
pub fn read_sequence<C: ConnectionLike>(con: &mut C, sale_id: u64) -> redis::RedisResult<u64> {
    let k = SaleKeys::new(sale_id);
    let ((total, releases), stock): ((Option<u64>, Option<u64>), Option<i64>) = redis::pipe()
        .cmd("HMGET")
        .arg(k.meta())
        .arg("total_stock")
        .arg("releases")
        .cmd("GET")
        .arg(k.stock())
        .query(con)?;
    Ok(sequence(
        total.unwrap_or(0),
        stock.unwrap_or(0),
        releases.unwrap_or(0),
    ))
}

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
    /// The sale is paused (meta field `paused`, e.g. `redis_data_loss`
    /// while Redis is behind MySQL, or `operator` while an operator's
    /// `sale pause` holds it); holds the reason. Nothing changed.
    Paused(String),
    /// This reservation id was reserved before and released since (its
    /// status is `expired`, `cancelled` or `failed`; or dead-lettered,
    /// `on_hold`, its unit still held): the call is a retry
    /// of one whose reply was lost, and takes nothing again. Holds the id.
    Released(String),
    /// Fewer units left than asked for, but at least one (units script):
    /// nothing taken; a smaller purchase may still succeed. Holds the
    /// units left.
    NotEnoughStock(u64),
    /// The buyer's held units plus the quantity exceed the sale's
    /// `max_per_buyer` (units script). Holds the buyer's reservations.
    LimitReached(Held),
    /// The quantity is above the sale's `max_per_purchase` (units
    /// script). Holds that limit.
    AboveMax(u32),
    /// The keyed reservation id was reserved before with the same
    /// quantity: the purchase is a repeat, nothing taken. Holds the id.
    Replayed(String),
    /// The keyed reservation id was reserved before with another
    /// quantity: the key is reused for another purchase. Holds the id.
    KeyReused(String),
    /// The sale sells more than one unit per buyer and the purchase came
    /// without a key (the one-unit script): nothing taken.
    KeyRequired,
    /// The sale sells one unit per buyer (units script): nothing taken;
    /// the one-unit script serves the purchase.
    OnePerBuyer,
}

/// A parsed reply: the outcome and the sale's reservation sequence after
/// the script ran (`seq`, see [`RESERVE_LUA`]; 0 for an unknown sale).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replied {
    /// What the purchase came to.
    pub outcome: ReserveOutcome,
    /// Units ever reserved in the sale when the script ran.
    pub seq: u64,
    /// The stock left, when the reply tells it (`already_purchased`).
    pub stock: Option<u64>,
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
    /// The script refused to run and changed nothing: a key it writes holds
    /// the wrong type (`WRONGTYPE <key> ...`), a counter is not an integer,
    /// or Redis is out of memory (`OOM`). Holds Redis's message, which names
    /// the key.
    Refused(String),
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::InvalidUser => write!(f, "invalid user id"),
            ReserveError::Redis(e) => write!(f, "redis: {e}"),
            ReserveError::UnexpectedReply(r) => write!(f, "unexpected reservation reply: {r}"),
            ReserveError::Refused(m) => write!(f, "reservation refused by Redis: {m}"),
        }
    }
}

impl std::error::Error for ReserveError {}

impl From<redis::RedisError> for ReserveError {
    fn from(e: redis::RedisError) -> Self {
        if crate::is_error_reply(&e) {
            return ReserveError::Refused(e.to_string());
        }
        ReserveError::Redis(e)
    }
}

/// Builds the script call for one purchase; usable alone ([`reserve`]) or
/// queued in a pipeline by a caller that groups many purchases per round trip.
/// `reservation_id` must come from [`crate::ids::new_reservation_id`].
pub fn prepare(sale_id: u64, user_id: &str, reservation_id: &str) -> ScriptInvocation<'static> {
    prepare_in(SaleKeys::new(sale_id), user_id, reservation_id)
}

/// [`prepare`] on one bucket `k` of a sale split over buckets (the buyer's
/// home bucket, `buckets::home_bucket`); the order message names the sale,
/// not the bucket.
pub fn prepare_in(k: SaleKeys, user_id: &str, reservation_id: &str) -> ScriptInvocation<'static> {
    let sale_id = k.sale_id;
    let mut inv = reserve_script().prepare_invoke();
    for key in k.reservation_keys() {
        inv.key(key);
    }
    inv.arg(user_id).arg(reservation_id).arg(sale_id);
    inv
}

/// The six keys of one sale's reservation script, in `KEYS` order (see
/// [`RESERVE_LUA`]), spelled once: a caller that reserves many units of
/// one sale ([`push_call`]) keeps one and saves six `format!`s per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveKeys {
    /// The sale they belong to.
    pub sale_id: u64,
    /// The sale's bucket they name (its own `{sale:ID}` for bucket 0).
    pub bucket: SaleKeys,
    keys: [String; 6],
    /// Their lengths added up.
    bytes: usize,
    /// Their Redis Cluster slot (they share one hash tag), computed once:
    /// a group commit routes every purchase by it.
    pub slot: u16,
    /// The RESP of every argument of the call before the buyers':
    /// `EVALSHA`, the script's hash, `6` and the six keys, written once
    /// ([`write_calls`] copies it).
    head: Vec<u8>,
}

impl ReserveKeys {
    /// The keys of `sale_id` ([`SaleKeys`]; its bucket 0).
    pub fn new(sale_id: u64) -> ReserveKeys {
        ReserveKeys::of(SaleKeys::new(sale_id))
    }

    /// The keys of the bucket `k`.
    pub fn of(k: SaleKeys) -> ReserveKeys {
        let keys = k.reservation_keys();
        let bytes = keys.iter().map(String::len).sum();
        let hash = reserve_script().get_hash();
        let mut head = Vec::with_capacity(9 * 8 + hash.len() + bytes);
        bulk(&mut head, b"EVALSHA");
        bulk(&mut head, hash.as_bytes());
        bulk(&mut head, b"6");
        for key in &keys {
            bulk(&mut head, key.as_bytes());
        }
        ReserveKeys {
            sale_id: k.sale_id,
            bucket: k,
            bytes,
            slot: crate::slot_router::slot_of(&keys[1]),
            keys,
            head,
        }
    }
}

/// Appends one purchase's `EVALSHA` of the reservation script to `pipe`,
/// the same call as [`prepare`] without building a `ScriptInvocation` (the
/// caller handles `NOSCRIPT`, as a pipeline must). `reservation_id` must
/// come from [`crate::ids::new_reservation_id`].
pub fn push_call(
    pipe: &mut redis::Pipeline,
    keys: &ReserveKeys,
    user_id: &str,
    reservation_id: &str,
) {
    pipe.add_command(call(keys, user_id, reservation_id));
}

/// Appends one purchase's `EVALSHA` of the reservation script to `out`,
/// already encoded as a RESP array of bulk strings (exactly the bytes of
/// [`call`]`(..).get_packed_command()`, checked by a test): the group
/// commit writes every purchase of a batch into one buffer this way, with
/// no command object, argument list or copy per purchase (2,000 of a
/// purchase's instructions at 64 connections went to the redis crate's
/// argument encoding, docs/PERFORMANCE.md). `reservation_id` must come from
/// [`crate::ids::new_reservation_id`].
pub fn write_call(out: &mut Vec<u8>, keys: &ReserveKeys, user_id: &str, reservation_id: &str) {
    write_calls(out, keys, &[(user_id, reservation_id)]);
}

/// Appends one `EVALSHA` of the reservation script for every buyer of
/// `buyers` (user id, reservation id; at least one; all of the bucket
/// `keys`), in order: the batch form of the call ([`RESERVE_LUA`]'s extra
/// `ARGV` pairs), answered by one string of one line per buyer
/// ([`parse_batch`]). The group commit sends one such call per bucket of
/// a batch. With one buyer, exactly [`write_call`]'s bytes.
pub fn write_calls(out: &mut Vec<u8>, keys: &ReserveKeys, buyers: &[(&str, &str)]) {
    let Some(((user_id, reservation_id), more)) = buyers.split_first() else {
        return;
    };
    let mut digits = [0u8; 20];
    let args = decimal(12 + 2 * more.len() as u64, &mut digits);
    let ids: usize = buyers.iter().map(|(u, r)| u.len() + r.len() + 16).sum();
    out.reserve(keys.head.len() + args.len() + 3 + ids + 24);
    out.push(b'*');
    out.extend_from_slice(args);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&keys.head);
    bulk(out, user_id.as_bytes());
    bulk(out, reservation_id.as_bytes());
    let sale = decimal(keys.sale_id, &mut digits);
    bulk(out, sale);
    for (user_id, reservation_id) in more {
        bulk(out, user_id.as_bytes());
        bulk(out, reservation_id.as_bytes());
    }
}

/// One RESP bulk string: `$LEN\r\nBYTES\r\n`.
fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    let mut digits = [0u8; 20];
    out.push(b'$');
    out.extend_from_slice(decimal(b.len() as u64, &mut digits));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// `v` in decimal ASCII, written at the end of `buf` (20 digits hold any u64).
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

/// One purchase's `EVALSHA` of the reservation script as a command (what
/// [`push_call`] appends; the cluster's per-master pipelines take it).
pub fn call(keys: &ReserveKeys, user_id: &str, reservation_id: &str) -> redis::Cmd {
    // Sized once: 12 arguments, their bytes (the 40-byte hash, the keys,
    // the ids and 40 for the number and the sale id).
    let hash = reserve_script().get_hash();
    let bytes = 7 + hash.len() + keys.bytes + user_id.len() + reservation_id.len() + 40;
    let mut cmd = redis::Cmd::with_capacity(12, bytes);
    cmd.arg("EVALSHA")
        .arg(hash)
        .arg(keys.keys.len())
        .arg(&keys.keys[..])
        .arg(user_id)
        .arg(reservation_id)
        .arg(keys.sale_id);
    cmd
}

/// Reads the script's reply into an outcome and the sale's sequence.
///
/// Errors: [`ReserveError::Refused`] for an error reply of the script (it
/// changed nothing), [`ReserveError::UnexpectedReply`] for a reply of
/// another shape.
pub fn parse(reply: &Value) -> Result<Replied, ReserveError> {
    if let Value::ServerError(e) = reply {
        return Err(ReserveError::Refused(e.to_string()));
    }
    let text = reply_text(reply).ok_or_else(|| unexpected(reply))?;
    parse_line(text).map_err(|()| unexpected(reply))
}

/// [`parse`] of the reply to a call of `n` buyers ([`write_calls`]): one
/// result per buyer, in order. An error reply is every buyer's
/// [`ReserveError::Refused`] (the script changed nothing); a line
/// `error 0 MESSAGE` is that buyer's alone.
///
/// Errors: [`ReserveError::UnexpectedReply`] for every buyer when the
/// reply is not `n` lines.
pub fn parse_batch(reply: &Value, n: usize) -> Vec<Result<Replied, ReserveError>> {
    if let Value::ServerError(e) = reply {
        let e = e.to_string();
        return (0..n)
            .map(|_| Err(ReserveError::Refused(e.clone())))
            .collect();
    }
    let mut out = Vec::with_capacity(n);
    let mut rest = reply_text(reply);
    // One pass over the lines (this runs once per batch on a group-commit
    // Redis thread): a reply of more or fewer lines than `n` is unexpected
    // for every buyer.
    while let Some(text) = rest {
        let (line, more) = match cut(text, b'\n') {
            Some((line, more)) => (line, Some(more)),
            None => (text, None),
        };
        if out.len() == n {
            break;
        }
        out.push(match line.strip_prefix("error 0 ") {
            Some(e) => Err(ReserveError::Refused(e.to_string())),
            None => parse_line(line).map_err(|()| unexpected(reply)),
        });
        rest = more;
    }
    if rest.is_some() || out.len() != n {
        return (0..n).map(|_| Err(unexpected(reply))).collect();
    }
    out
}

/// `s` cut at its first `sep` byte (ASCII, so both halves are whole
/// characters): a plain byte scan, cheaper than `split_once` on the
/// short lines of a reply.
fn cut(s: &str, sep: u8) -> Option<(&str, &str)> {
    let i = s.bytes().position(|b| b == sep)?;
    Some((s.get(..i)?, s.get(i + 1..)?))
}

/// The text of a bulk or simple string reply, read in place (no copy: this
/// runs once per batch on a group-commit Redis thread).
fn reply_text(reply: &Value) -> Option<&str> {
    match reply {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    }
}

fn unexpected(reply: &Value) -> ReserveError {
    ReserveError::UnexpectedReply(format!("{reply:?}"))
}

/// One buyer's line, `CODE SEQ DETAIL` ([`RESERVE_LUA`]).
fn parse_line(text: &str) -> Result<Replied, ()> {
    let (code, rest) = cut(text, b' ').ok_or(())?;
    let (seq, detail) = cut(rest, b' ').ok_or(())?;
    let seq: u64 = seq.parse().map_err(|_| ())?;
    let mut stock = None;
    let outcome = match code {
        "reserved" => ReserveOutcome::Reserved(detail.to_string()),
        "already_purchased" => {
            let (rid, left) = cut(detail, b' ').unwrap_or((detail, ""));
            stock = left.parse().ok();
            ReserveOutcome::AlreadyPurchased(rid.to_string())
        }
        "sold_out" => ReserveOutcome::SoldOut,
        "not_started" => ReserveOutcome::NotStarted,
        "ended" => ReserveOutcome::Ended,
        "unknown_sale" => ReserveOutcome::UnknownSale,
        "paused" => ReserveOutcome::Paused(detail.to_string()),
        "released" => ReserveOutcome::Released(detail.to_string()),
        "not_enough" => {
            let left: u64 = detail.parse().map_err(|_| ())?;
            stock = Some(left);
            ReserveOutcome::NotEnoughStock(left)
        }
        "limit_reached" => ReserveOutcome::LimitReached(Held::parse(detail).map_err(|_| ())?),
        "above_max" => ReserveOutcome::AboveMax(detail.parse().map_err(|_| ())?),
        "replayed" => ReserveOutcome::Replayed(detail.to_string()),
        "key_reused" => ReserveOutcome::KeyReused(detail.to_string()),
        "key_required" => ReserveOutcome::KeyRequired,
        "one_per_buyer" => ReserveOutcome::OnePerBuyer,
        _ => return Err(()),
    };
    Ok(Replied {
        outcome,
        seq,
        stock,
    })
}

/// A reservation sent twice with the same id (a retry after a broken
/// connection) finds its own first attempt: that is a success, not a 409.
/// Maps `already_purchased` with `rid` (the id this call sent) to
/// `reserved`; any other reply is returned as it is.
pub fn own(replied: Replied, rid: &str) -> Replied {
    let outcome = match replied.outcome {
        ReserveOutcome::AlreadyPurchased(r) if r == rid => ReserveOutcome::Reserved(r),
        o => o,
    };
    Replied { outcome, ..replied }
}

/// [`parse`] without the sequence.
///
/// Errors: as [`parse`].
pub fn parse_reply(reply: &Value) -> Result<ReserveOutcome, ReserveError> {
    parse(reply).map(|r| r.outcome)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_refuses_beyond_max_buyers_per_call() {
        let check = format!("if n > {MAX_BUYERS_PER_CALL} then");
        assert!(RESERVE_LUA.contains(&check), "{check}");
    }

    #[test]
    fn parse_batch_takes_exactly_n_lines() {
        let reply = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let shown = |v: Vec<Result<Replied, ReserveError>>| -> Vec<String> {
            v.into_iter()
                .map(|r| match r {
                    Ok(r) => format!("{:?} {} {:?}", r.outcome, r.seq, r.stock),
                    Err(ReserveError::Refused(e)) => format!("refused {e}"),
                    Err(e) => format!("error {e}"),
                })
                .collect()
        };
        let text = "reserved 1 ab\nalready_purchased 1 ab 4\nerror 0 ERR invalid user id\n\
                    sold_out 7 \npaused 0 lost data\nreleased 2 cd";
        assert_eq!(
            shown(parse_batch(&reply(text), 6)),
            [
                "Reserved(\"ab\") 1 None",
                "AlreadyPurchased(\"ab\") 1 Some(4)",
                "refused ERR invalid user id",
                "SoldOut 7 None",
                "Paused(\"lost data\") 0 None",
                "Released(\"cd\") 2 None",
            ]
        );
        for (text, n) in [
            ("reserved 1 ab", 2),
            ("reserved 1 ab\nreserved 2 cd", 1),
            ("reserved 1 ab\n", 1),
            ("reserved 1", 1),
            ("reserved x ab", 1),
            ("", 1),
        ] {
            let got = shown(parse_batch(&reply(text), n));
            assert_eq!(got.len(), n, "{text:?}");
            assert!(
                got.iter().all(|g| g.starts_with("error unexpected")),
                "{text:?}: {got:?}"
            );
        }
        assert_eq!(
            shown(parse_batch(&Value::Int(3), 2)).len(),
            2,
            "a reply that is not a string"
        );
    }

    #[test]
    fn write_call_writes_the_bytes_of_call() {
        for (sale, user, rid) in [
            (1u64, "u1", "00ff"),
            (u64::MAX, "a.b-C_9", ""),
            (1_234_567_890, "x", "r"),
        ] {
            let k = ReserveKeys::new(sale);
            let mut out = b"before".to_vec();
            write_call(&mut out, &k, user, rid);
            assert_eq!(&out[..6], b"before");
            assert_eq!(out[6..], call(&k, user, rid).get_packed_command()[..]);
        }
    }
}
