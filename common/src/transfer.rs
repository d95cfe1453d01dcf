//! Owns moving stock between the buckets of one sale (`buckets.rs`): the
//! two-step transfer with a durable record on each side, the completion of
//! a transfer interrupted between its steps, the gateway's pull of units to
//! a buyer's home bucket that holds fewer than a purchase asks for, and the
//! sold-out (or not-enough) decision over all buckets.
//!
//! A transfer cannot be one script: its two buckets are in different slots
//! (on a cluster, on different masters). So it is two idempotent scripts
//! keyed by one transfer id:
//! 1. on the source ([`TRANSFER_OUT_LUA`]): `stock -= n`, `total_stock -= n`,
//!    the record in `transfers:out` (kept) and in `transfers:open` (until
//!    step 2 is confirmed);
//! 2. on the destination ([`TRANSFER_IN_LUA`]): `stock += n`,
//!    `total_stock += n`, `moved_in += n`, the record in `transfers:in`;
//!    done once per transfer id whatever the number of calls;
//!
//! then `HDEL transfers:open` on the source. A crash between 1 and 2 leaves
//! the units in the open record: the next [`complete_open`] (every pull
//! that finds too few units, the reconciler's run) takes them in exactly once.
//! Each bucket's reservation sequence (`total − stock + releases`) does
//! not move with a transfer, so the data-loss watch and the sold-out
//! memory keep their meaning per bucket.

use crate::keys::SaleKeys;
use redis::{ConnectionLike, Script};
use std::sync::OnceLock;

/// `KEYS`: the source bucket's meta, stock, `transfers:out`,
/// `transfers:open`; `ARGV`: transfer id, destination bucket, units
/// wanted. Takes `min(wanted, stock)` units; replies the units taken (0:
/// nothing written, the stock was empty or the bucket is paused). A
/// transfer id already recorded replies its recorded units and writes
/// nothing (a retried step 1).
pub const TRANSFER_OUT_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return bad end
local prev = redis.call('HGET', KEYS[3], ARGV[1])
if prev then return cjson.decode(prev)['units'] end
if redis.call('HEXISTS', KEYS[1], '"#,
    crate::paused_field!(),
    r#"') == 1 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'total_stock') == 0 then return 0 end
local left = tonumber(redis.call('GET', KEYS[2]) or '0')
if not left then return redis.error_reply('ERR ' .. KEYS[2] .. ' is not an integer') end
local n = math.min(left, tonumber(ARGV[3]))
if n < 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = '{"to":' .. ARGV[2] .. ',"units":' .. string.format('%d', n) ..
  ',"at_ms":' .. string.format('%d', now) .. '}'
redis.call('DECRBY', KEYS[2], n)
redis.call('HINCRBY', KEYS[1], 'total_stock', -n)
redis.call('HSET', KEYS[3], ARGV[1], rec)
redis.call('HSET', KEYS[4], ARGV[1], rec)
return n
"#
);

/// `KEYS`: the destination bucket's meta, stock, `transfers:in`; `ARGV`:
/// transfer id, source bucket, units, the source's `at_ms`. Replies 1 when
/// it took the units in now, 0 when this transfer id was taken in before
/// (nothing written); an error reply, nothing written, when the bucket is
/// not loaded (its units stay in the source's open record).
pub const TRANSFER_IN_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'string', KEYS[3], 'hash'})
if bad then return bad end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'total_stock') == 0 or redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.error_reply('ERR ' .. KEYS[1] .. ' is not loaded: transfer left open')
end
local n = tonumber(ARGV[3])
redis.call('INCRBY', KEYS[2], n)
redis.call('HINCRBY', KEYS[1], 'total_stock', n)
redis.call('HINCRBY', KEYS[1], 'moved_in', n)
redis.call('HSET', KEYS[3], ARGV[1], '{"from":' .. ARGV[2] .. ',"units":' .. ARGV[3] ..
  ',"at_ms":' .. ARGV[4] .. '}')
return 1
"#
);

/// `KEYS`: a bucket's meta, stock, `transfers:open`. Replies `{stock,
/// moved_in, open, seq}`: its stock, units ever taken in, transfers out
/// not yet confirmed, and its reservation sequence.
const SNAPSHOT_LUA: &str = concat!(
    r#"
local m = redis.call('HMGET', KEYS[1], 'total_stock', 'releases', 'moved_in', '"#,
    crate::paused_field!(),
    r#"')
local stock = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local total = tonumber(m[1] or '0') or 0
local seq = total - stock + (tonumber(m[2] or '0') or 0)
if seq < 0 then seq = 0 end
local paused = 0
if m[4] then paused = 1 end
return {stock, tonumber(m[3] or '0') or 0, redis.call('HLEN', KEYS[3]), seq, paused}
"#
);

fn script(which: &'static str) -> &'static Script {
    static OUT: OnceLock<Script> = OnceLock::new();
    static IN: OnceLock<Script> = OnceLock::new();
    static SNAP: OnceLock<Script> = OnceLock::new();
    match which {
        "out" => OUT.get_or_init(|| Script::new(TRANSFER_OUT_LUA)),
        "in" => IN.get_or_init(|| Script::new(TRANSFER_IN_LUA)),
        _ => SNAP.get_or_init(|| Script::new(SNAPSHOT_LUA)),
    }
}

/// Which side of a transfer a [`Record`] is on: the source's (in its
/// `transfers:out` and `transfers:open`, naming the destination `to`) or
/// the destination's (in its `transfers:in`, naming the source `from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The source's record: units given `to` the peer.
    Out,
    /// The destination's record: units taken `from` the peer.
    In,
}

impl Direction {
    /// The JSON field that names the peer bucket on this side.
    pub fn peer_field(self) -> &'static str {
        match self {
            Direction::Out => "to",
            Direction::In => "from",
        }
    }
}

/// One side's record of a transfer, as stored (JSON `{"to"|"from", "units",
/// "at_ms"}`, the peer's field by [`Direction`]): the other bucket, the
/// units, the source's time (Unix ms). The transfer scripts write the same
/// shape in Lua.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The bucket on the other side.
    pub peer: u32,
    /// Units moved.
    pub units: u64,
    /// When the source gave them (Unix ms, Redis's clock).
    pub at_ms: u64,
}

impl Record {
    /// Reads a stored record of side `direction`. `None` when malformed.
    pub fn parse(json: &str, direction: Direction) -> Option<Record> {
        let v: serde_json::Value = serde_json::from_str(json).ok()?;
        Some(Record {
            peer: u32::try_from(v.get(direction.peer_field())?.as_u64()?).ok()?,
            units: v.get("units")?.as_u64()?,
            at_ms: v.get("at_ms")?.as_u64()?,
        })
    }

    /// The record as stored on side `direction`.
    pub fn to_json(&self, direction: Direction) -> String {
        format!(
            r#"{{"{}":{},"units":{},"at_ms":{}}}"#,
            direction.peer_field(),
            self.peer,
            self.units,
            self.at_ms
        )
    }
}

/// One bucket at one instant ([`snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Units left to reserve.
    pub stock: i64,
    /// Units ever taken in by transfers (only grows).
    pub moved_in: u64,
    /// Transfers out of this bucket not yet confirmed taken in.
    pub open: u64,
    /// The bucket's reservation sequence (`reservation::sequence`).
    pub seq: u64,
    /// Paused for a data loss (`data_loss::PAUSED_FIELD`): its units are
    /// not moved ([`TRANSFER_OUT_LUA`] gives none).
    pub paused: bool,
}

/// Reads bucket `k` atomically (one script on its slot).
///
/// Errors: Redis failures.
pub fn snapshot<C: ConnectionLike>(con: &mut C, k: SaleKeys) -> redis::RedisResult<Snapshot> {
    let (stock, moved_in, open, seq, paused): (i64, u64, u64, u64, u8) = script("snap")
        .key(k.meta())
        .key(k.stock())
        .key(k.transfers_open())
        .invoke(con)?;
    Ok(Snapshot {
        stock,
        moved_in,
        open,
        seq,
        paused: paused == 1,
    })
}

/// Step 1 alone: takes up to `wanted` units out of bucket `from` for bucket
/// `to` under transfer id `tid`; the units taken (0: none).
///
/// Errors: Redis failures, a key of the wrong type (nothing written).
pub fn take_out<C: ConnectionLike>(
    con: &mut C,
    from: SaleKeys,
    to: u32,
    tid: &str,
    wanted: u64,
) -> redis::RedisResult<u64> {
    script("out")
        .key(from.meta())
        .key(from.stock())
        .key(from.transfers_out())
        .key(from.transfers_open())
        .arg(tid)
        .arg(to)
        .arg(wanted)
        .invoke(con)
}

/// Step 2 and the close: takes transfer `tid` (`rec`, as recorded by bucket
/// `from`) into its destination, then removes it from `from`'s open
/// records. `true` when the units were taken in by this call, `false` when
/// an earlier call had (then only the close was left to do).
///
/// Errors: Redis failures, a destination not loaded (the transfer stays
/// open, its units counted nowhere else).
pub fn complete<C: ConnectionLike>(
    con: &mut C,
    from: SaleKeys,
    tid: &str,
    rec: Record,
) -> redis::RedisResult<bool> {
    let to = SaleKeys::bucket(from.sale_id, rec.peer);
    let now: i64 = script("in")
        .key(to.meta())
        .key(to.stock())
        .key(to.transfers_in())
        .arg(tid)
        .arg(from.bucket)
        .arg(rec.units)
        .arg(rec.at_ms)
        .invoke(con)?;
    redis::cmd("HDEL")
        .arg(from.transfers_open())
        .arg(tid)
        .query::<()>(con)?;
    Ok(now == 1)
}

/// Moves up to `wanted` units from bucket `from` to bucket `to` of the same
/// sale (both steps and the close); the units moved (0: `from` had none).
///
/// Errors: Redis failures. After step 1 the transfer is recorded open, and
/// a failure from there on is completed by [`complete_open`].
pub fn transfer<C: ConnectionLike>(
    con: &mut C,
    from: SaleKeys,
    to: u32,
    wanted: u64,
) -> redis::RedisResult<u64> {
    let tid = crate::ids::new_reservation_id();
    let n = take_out(con, from, to, &tid, wanted)?;
    if n > 0 {
        let rec: Option<String> = redis::cmd("HGET")
            .arg(from.transfers_out())
            .arg(&tid)
            .query(con)?;
        let rec = rec
            .as_deref()
            .and_then(|r| Record::parse(r, Direction::Out));
        let rec = rec.unwrap_or(Record {
            peer: to,
            units: n,
            at_ms: 0,
        });
        complete(con, from, &tid, rec)?;
    }
    Ok(n)
}

/// A transfer found open and completed by [`complete_open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The transfer id.
    pub tid: String,
    /// The source bucket.
    pub from: u32,
    /// The record (destination, units, time).
    pub rec: Record,
    /// Whether this call took the units in (`false`: step 2 had been done,
    /// only the close was missing).
    pub took_in: bool,
}

/// Completes every open transfer of sale `sale_id` (K = `buckets`) whose
/// step 1 is at least `min_age_ms` old by its source's clock (0: all;
/// the reconciler leaves younger ones to the mover that is completing
/// them): each is taken into its destination once and closed.
///
/// Errors: Redis failures; a malformed open record is left in place and
/// skipped (the reconciler reports it).
pub fn complete_open<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    buckets: u32,
    min_age_ms: u64,
) -> redis::RedisResult<Vec<Completed>> {
    let mut done = Vec::new();
    for from in crate::buckets::all(sale_id, buckets) {
        let (open, (secs, micros)): (Vec<(String, String)>, (u64, u64)) = redis::pipe()
            .atomic()
            .hgetall(from.transfers_open())
            .cmd("TIME")
            .query(con)?;
        let now_ms = secs * 1000 + micros / 1000;
        for (tid, json) in open {
            let Some(rec) = Record::parse(&json, Direction::Out) else {
                continue;
            };
            if rec.at_ms.saturating_add(min_age_ms) > now_ms {
                continue;
            }
            let took_in = complete(con, from, &tid, rec)?;
            done.push(Completed {
                tid,
                from: from.bucket,
                rec,
                took_in,
            });
        }
    }
    Ok(done)
}

/// What [`pull`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    /// The home bucket holds the units asked for now (or some were just
    /// moved there): try the purchase again.
    Ready,
    /// Every bucket was empty at one instant with no transfer open: the
    /// whole sale is sold out. Holds the sale's sequence then (the sum of
    /// the buckets' sequences).
    SoldOut {
        /// Units ever reserved over all buckets.
        seq: u64,
    },
    /// The whole sale held fewer units than asked for, at least one, at
    /// one instant with no transfer open (decided as [`Pull::SoldOut`]):
    /// a smaller purchase may still fit, so this is never sold out.
    NotEnough {
        /// Units left over all buckets then.
        left: u64,
    },
    /// Other transfers kept changing the buckets; nothing decided (the
    /// buyer gets 503 and retries, never a false `sold_out`).
    Busy,
    /// The units asked for are there only with those of buckets paused for
    /// a data loss, which are not moved: the buyer gets 503 `sale_paused`
    /// at once (the loss pauses the whole sale until `sale repair`).
    Paused,
}

/// How many times [`pull`] looks again before it answers [`Pull::Busy`].
pub const PULL_ROUNDS: usize = 4;

/// Every bucket of `keys`, one snapshot each (one round).
fn round<C: ConnectionLike>(con: &mut C, keys: &[SaleKeys]) -> redis::RedisResult<Vec<Snapshot>> {
    keys.iter().map(|k| snapshot(con, *k)).collect()
}

/// Gets `need` units into bucket `home` of sale `sale_id` (K =
/// `buckets`) after a purchase of `need` units there found fewer: moves
/// units from the fullest buckets to it (from each, what is missing or
/// half its stock rounded up, whichever is more, at most its stock), or
/// decides that the whole sale cannot cover `need` (sold out, or fewer
/// units left). A purchase is never split: the units are moved first and
/// the purchase is made in `home` alone.
///
/// The sale-wide decision is taken from two snapshot rounds of every
/// bucket: no open transfer in either round and no bucket's `moved_in`
/// changed between them. A bucket's stock grows only by a transfer in (or
/// by a release, which the sold-out memory's recheck covers as for one
/// bucket), and units on their way are in an open record from step 1
/// until after step 2; so at the instant between the rounds each bucket
/// held at most what the first round read. All of them 0 in both rounds
/// is sold out; a first-round sum below `need` is not enough (that sum is
/// the units left).
///
/// Errors: Redis failures.
pub fn pull<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    buckets: u32,
    home: u32,
    need: u64,
) -> redis::RedisResult<Pull> {
    let keys = crate::buckets::all(sale_id, buckets);
    let need = need.max(1) as i64;
    for _ in 0..PULL_ROUNDS {
        let first = round(con, &keys)?;
        if first[home as usize].stock >= need {
            return Ok(Pull::Ready);
        }
        if first.iter().any(|s| s.open > 0) {
            complete_open(con, sale_id, buckets, 0)?;
            continue;
        }
        let left: i64 = first.iter().map(|s| s.stock.max(0)).sum();
        if left >= need && movable(&first, home) < need {
            return Ok(Pull::Paused);
        }
        if left >= need {
            if move_to(con, &keys, &first, home, need)? > 0 {
                return Ok(Pull::Ready);
            }
            continue;
        }
        let second = round(con, &keys)?;
        let still = first
            .iter()
            .zip(&second)
            .all(|(a, b)| b.open == 0 && a.moved_in == b.moved_in);
        if !still {
            continue;
        }
        if left == 0 && second.iter().all(|s| s.stock <= 0) {
            return Ok(Pull::SoldOut {
                seq: second.iter().map(|s| s.seq).sum(),
            });
        }
        if left > 0 {
            return Ok(Pull::NotEnough { left: left as u64 });
        }
    }
    Ok(Pull::Busy)
}

/// The units `home` could hold by moves from snapshot `snaps`: its own and
/// those of every bucket not paused.
fn movable(snaps: &[Snapshot], home: u32) -> i64 {
    snaps
        .iter()
        .enumerate()
        .filter(|(b, s)| *b == home as usize || !s.paused)
        .map(|(_, s)| s.stock.max(0))
        .sum()
}

/// [`pull`]'s moves: from the fullest buckets of snapshot `snaps` (not
/// `home`, none paused), fullest first, until `home` would hold `need`; each gives the
/// units missing or half its stock rounded up, whichever is more, at most
/// its stock. Returns the units moved (a donor emptied meanwhile gives
/// fewer, or none).
///
/// Errors: Redis failures.
fn move_to<C: ConnectionLike>(
    con: &mut C,
    keys: &[SaleKeys],
    snaps: &[Snapshot],
    home: u32,
    need: i64,
) -> redis::RedisResult<u64> {
    let mut donors: Vec<usize> = (0..snaps.len())
        .filter(|&b| b != home as usize && snaps[b].stock > 0 && !snaps[b].paused)
        .collect();
    donors.sort_by_key(|&b| std::cmp::Reverse(snaps[b].stock));
    let mut missing = need - snaps[home as usize].stock.max(0);
    let mut moved = 0;
    for d in donors {
        if missing <= 0 {
            break;
        }
        let has = snaps[d].stock as u64;
        let want = (missing as u64).max(has.div_ceil(2)).min(has);
        let n = transfer(con, keys[d], home, want)?;
        moved += n;
        missing -= n as i64;
    }
    Ok(moved)
}

/// The background pass (`seckill-reconciler sale rebalance`, and every
/// reconciler run): completes open transfers, then gives every empty
/// bucket half (rounded down) of the fullest one's stock while that holds at
/// least 2 units. Returns the units moved.
///
/// Errors: Redis failures.
pub fn rebalance<C: ConnectionLike>(
    con: &mut C,
    sale_id: u64,
    buckets: u32,
) -> redis::RedisResult<u64> {
    complete_open(con, sale_id, buckets, 0)?;
    let keys = crate::buckets::all(sale_id, buckets);
    let mut moved = 0;
    for home in 0..buckets {
        let snaps = keys
            .iter()
            .map(|k| snapshot(con, *k))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        if snaps[home as usize].stock > 0 {
            continue;
        }
        let donor = (0..snaps.len())
            .max_by_key(|&b| snaps[b].stock)
            .unwrap_or(0);
        if snaps[donor].stock >= 2 {
            moved += transfer(con, keys[donor], home, (snaps[donor].stock as u64) / 2)?;
        }
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_written_as_the_scripts_write_it_and_read_back_by_its_side() {
        let r = Record {
            peer: 3,
            units: 12,
            at_ms: 1_700_000_000_000,
        };
        let out = r.to_json(Direction::Out);
        assert_eq!(out, r#"{"to":3,"units":12,"at_ms":1700000000000}"#);
        assert_eq!(
            r.to_json(Direction::In),
            r#"{"from":3,"units":12,"at_ms":1700000000000}"#
        );
        assert_eq!(Record::parse(&out, Direction::Out), Some(r));
        // The other side's field is not this side's peer.
        assert_eq!(Record::parse(&out, Direction::In), None);
        assert_eq!(Record::parse("{\"to\":1}", Direction::Out), None);
    }
}
