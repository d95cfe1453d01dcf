//! Owns the in-flight check: whether order messages sit in any of a sale's
//! lists (its queue and its processing lists), read in one atomic script so
//! that a message a worker moves between two lists is never missed. The
//! reconciler asks it for the few flow records its list reads did not find,
//! and only while the lists are short: each call compares at most
//! [`BUDGET`] list entries, so it holds Redis about a millisecond
//! (`LPOS` compares about ten million entries a second).

use redis::Script;
use std::sync::OnceLock;

/// Messages checked per script call at most.
pub const CHUNK: usize = 100;

/// List entries one script call may compare (messages × entries of every
/// list): about 2 ms of Redis's time. Lists longer than this in total are
/// not checked ([`still_in_flight`] answers `None`).
pub const BUDGET: usize = 20_000;

/// `KEYS`: the lists; `ARGV[1]`: the budget; the other `ARGV`: the
/// messages. Replies `-1` without comparing anything when the messages ×
/// the lists' entries exceed the budget; otherwise, per message, 1 when it
/// is in one of the lists and 0 when in none.
const IN_FLIGHT_LUA: &str = r"
local total = 0
for _, list in ipairs(KEYS) do total = total + redis.call('LLEN', list) end
if total * (#ARGV - 1) > tonumber(ARGV[1]) then return -1 end
local found = {}
for i = 2, #ARGV do
  local msg = ARGV[i]
  found[i - 1] = 0
  for _, list in ipairs(KEYS) do
    if redis.call('LPOS', list, msg) then found[i - 1] = 1; break end
  end
end
return found";

/// For each of `messages` (the exact queued text), whether it sits in any of
/// `lists`, each call atomic over every list and within [`BUDGET`];
/// `None` when the lists are too long for even one message within the
/// budget (the caller then relies on its paged reads).
///
/// Errors: Redis failures (`WRONGTYPE` when a list key holds another type).
pub fn still_in_flight(
    con: &mut impl redis::ConnectionLike,
    lists: &[String],
    messages: &[&str],
) -> redis::RedisResult<Option<Vec<bool>>> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let script = SCRIPT.get_or_init(|| Script::new(IN_FLIGHT_LUA));
    let mut out = Vec::with_capacity(messages.len());
    let mut rest = messages;
    while !rest.is_empty() {
        let mut p = redis::pipe();
        for l in lists {
            p.llen(l);
        }
        let lens: Vec<usize> = p.query(con)?;
        let total: usize = lens.iter().sum();
        let n = (BUDGET / total.max(1)).min(CHUNK).min(rest.len());
        if n == 0 {
            return Ok(None);
        }
        let (chunk, next) = rest.split_at(n);
        let mut inv = script.prepare_invoke();
        for l in lists {
            inv.key(l);
        }
        inv.arg(BUDGET);
        for m in chunk {
            inv.arg(*m);
        }
        match inv.invoke::<redis::Value>(con)? {
            // The lists grew between the lengths and the call: measure again.
            redis::Value::Int(-1) => continue,
            v => {
                let flags: Vec<i64> = redis::from_redis_value(v)?;
                out.extend(flags.into_iter().map(|f| f == 1));
            }
        }
        rest = next;
    }
    Ok(Some(out))
}
