//! Owns the in-flight check: whether order messages sit in any of a sale's
//! lists (its queue and its processing lists), read in one atomic script so
//! that a message a worker moves between two lists is never missed. The
//! reconciler asks it for the few flow records its list scans did not find.

use redis::Script;
use std::sync::OnceLock;

/// Messages checked per script call, so one call stays short (each message
/// costs one `LPOS` per list).
pub const CHUNK: usize = 100;

/// `KEYS`: the lists; `ARGV`: the messages. Replies, per message, 1 when it
/// is in one of the lists and 0 when in none.
const IN_FLIGHT_LUA: &str = r"
local found = {}
for i, msg in ipairs(ARGV) do
  found[i] = 0
  for _, list in ipairs(KEYS) do
    if redis.call('LPOS', list, msg) then found[i] = 1; break end
  end
end
return found";

/// For each of `messages` (the exact queued text), whether it sits in any of
/// `lists`, checked atomically [`CHUNK`] messages at a time.
///
/// Errors: Redis failures (`WRONGTYPE` when a list key holds another type).
pub fn still_in_flight(
    con: &mut impl redis::ConnectionLike,
    lists: &[String],
    messages: &[&str],
) -> redis::RedisResult<Vec<bool>> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let script = SCRIPT.get_or_init(|| Script::new(IN_FLIGHT_LUA));
    let mut out = Vec::with_capacity(messages.len());
    for chunk in messages.chunks(CHUNK) {
        let mut inv = script.prepare_invoke();
        for l in lists {
            inv.key(l);
        }
        for m in chunk {
            inv.arg(*m);
        }
        let flags: Vec<i64> = inv.invoke(con)?;
        out.extend(flags.into_iter().map(|f| f == 1));
    }
    Ok(out)
}
