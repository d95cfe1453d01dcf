//! Owns the reorder script: the operator's "queue this reservation's order
//! message again" (`seckill-reconciler resolve ID --action reorder`), with a
//! check mode that runs every refusal and writes nothing, so a dry run and
//! the action itself can never disagree.

use crate::keys::SaleKeys;
use redis::Script;
use std::sync::OnceLock;

/// `KEYS`: flow, status, queue, attempts, reorder marks, then every
/// processing list of the sale; `ARGV`: reservation id, then `check` for a
/// dry run (stop before any write) or `queue`, then the action's mark (the
/// reconciler's evidence that this reorder took effect, written with the
/// push). Replies `queued` (`would_queue` in a dry run), `already_queued`,
/// `in_flight` or `not_found`; an error reply, with nothing changed, when a
/// key it writes holds the wrong type (`lua.rs`).
const REORDER_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r"
local bad = expect_types({KEYS[2], 'hash', KEYS[3], 'list', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return bad end
local msg = redis.call('HGET', KEYS[1], ARGV[1])
if not msg then return 'not_found' end
if redis.call('LPOS', KEYS[3], msg) then return 'already_queued' end
for i = 6, #KEYS do
  if redis.call('LPOS', KEYS[i], msg) then return 'in_flight' end
end
if ARGV[2] == 'check' then return 'would_queue' end
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], 'queued')
redis.call('HSET', KEYS[5], ARGV[1], ARGV[3])
redis.call('LPUSH', KEYS[3], msg)
return 'queued'"
);

/// What the reorder script did, or in check mode would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReorderOutcome {
    /// The message was pushed onto the sale's queue again, status `queued`.
    Queued,
    /// Check mode: it would have been pushed.
    WouldQueue,
    /// The message is already in the queue: nothing to do.
    AlreadyQueued,
    /// A worker's processing list holds it: it is being applied.
    InFlight,
    /// No flow record for the reservation: nothing to queue.
    NotFound,
}

/// Runs the reorder script for reservation `rid` of sale `sale_id`, whose
/// processing lists are those of `workers`: with `mark` it queues (writing
/// `mark` into the reorder marks), without it only checks.
///
/// Errors: Redis failures, the script's wrong-type refusal, or a reply the
/// script cannot give (a protocol error).
pub fn reorder(
    con: &mut impl redis::ConnectionLike,
    sale_id: u64,
    rid: &str,
    workers: &[String],
    mark: Option<&str>,
) -> redis::RedisResult<ReorderOutcome> {
    reorder_in(con, SaleKeys::new(sale_id), rid, workers, mark)
}

/// [`reorder`] in bucket `k` of a sale split over buckets (the bucket that
/// holds the reservation's flow record, `buckets::holding`): the message
/// goes back onto that bucket's queue, where its worker applies it.
///
/// Errors: as [`reorder`].
pub fn reorder_in(
    con: &mut impl redis::ConnectionLike,
    k: SaleKeys,
    rid: &str,
    workers: &[String],
    mark: Option<&str>,
) -> redis::RedisResult<ReorderOutcome> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let script = SCRIPT.get_or_init(|| Script::new(REORDER_LUA));
    let mut inv = script.prepare_invoke();
    inv.key(k.flow())
        .key(k.status())
        .key(k.queue())
        .key(k.attempts())
        .key(k.reorder_marks());
    for w in workers {
        inv.key(k.processing(w));
    }
    inv.arg(rid);
    match mark {
        Some(m) => inv.arg("queue").arg(m),
        None => inv.arg("check"),
    };
    let reply: String = inv.invoke(con)?;
    Ok(match reply.as_str() {
        "queued" => ReorderOutcome::Queued,
        "would_queue" => ReorderOutcome::WouldQueue,
        "already_queued" => ReorderOutcome::AlreadyQueued,
        "in_flight" => ReorderOutcome::InFlight,
        "not_found" => ReorderOutcome::NotFound,
        other => {
            return Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reorder script reply",
                other.to_string(),
            )))
        }
    })
}
