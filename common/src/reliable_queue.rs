//! Owns the scripts of the reliable queue's moves: taking a batch from a
//! sale's queue into a worker's processing list, and moving a processing
//! list back to its queue (reclaim). Each is atomic, so a message is always
//! in exactly one list. The protocol around them is the worker's
//! (`worker/src/queue.rs`).

use redis::Script;
use std::sync::OnceLock;

/// Moves up to `ARGV[1]` messages from the queue (`KEYS[1]`, right end) to
/// the processing list (`KEYS[2]`, left end) without blocking and returns
/// them oldest first: the same lists as one `LMOVE queue processing RIGHT
/// LEFT` per message, in three commands (`LRANGE`, `LTRIM`, `LPUSH` of up
/// to 1,000 values each) instead of one per message (docs/PERFORMANCE.md,
/// worker). Atomic, one round trip, every Redis version. Both types are
/// checked first, so nothing is trimmed from the queue that the push could
/// then fail to place.
const TAKE_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'list', KEYS[2], 'list'})
if bad then return bad end
local n = tonumber(ARGV[1])
if n < 1 then return {} end
local newest_first = redis.call('LRANGE', KEYS[1], -n, -1)
local got = #newest_first
if got == 0 then return newest_first end
redis.call('LTRIM', KEYS[1], 0, -got - 1)
local out = {}
for i = got, 1, -1 do out[#out + 1] = newest_first[i] end
for i = 1, got, 1000 do
  redis.call('LPUSH', KEYS[2], unpack(out, i, math.min(i + 999, got)))
end
return out
"#
);

/// Moves every message of a processing list (`KEYS[1]`) back to the
/// consuming (right) end of its queue (`KEYS[2]`), the oldest ending
/// rightmost so it is taken first again; returns how many. Atomic: a message
/// is never in both lists or in neither (both types are checked before the
/// first `LPOP`, so an `RPUSH` cannot fail after it). Works on every Redis
/// version.
const RECLAIM_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'list', KEYS[2], 'list'})
if bad then return bad end
local n = 0
while true do
  local v = redis.call('LPOP', KEYS[1])
  if not v then return n end
  redis.call('RPUSH', KEYS[2], v)
  n = n + 1
end
"#
);

/// Moves up to `max` messages from the right end of `queue` to the left end
/// of `processing` in one atomic script; returns them oldest first.
///
/// Errors: Redis failures, or the script's refusal, with nothing moved,
/// when either key holds another type.
pub fn take(
    con: &mut impl redis::ConnectionLike,
    queue: &str,
    processing: &str,
    max: usize,
) -> redis::RedisResult<Vec<Vec<u8>>> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT
        .get_or_init(|| Script::new(TAKE_LUA))
        .key(queue)
        .key(processing)
        .arg(max)
        .invoke(con)
}

/// Moves every message of `processing` back to the consuming end of
/// `queue`, oldest rightmost, in one atomic script; returns how many.
///
/// Errors: Redis failures, or the script's refusal, with nothing moved,
/// when either key holds another type.
pub fn reclaim(
    con: &mut impl redis::ConnectionLike,
    processing: &str,
    queue: &str,
) -> redis::RedisResult<u64> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT
        .get_or_init(|| Script::new(RECLAIM_LUA))
        .key(processing)
        .key(queue)
        .invoke(con)
}
