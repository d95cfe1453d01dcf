//! Owns the dead-letter entry: what the worker writes to a sale's
//! dead-letter list (`seckill:{sale:ID}:dlq`) and the reconciler reads.
//!
//! Shape, one line of JSON:
//! `{"message":"<the raw queued text>","reason":"...","attempts":5,"worker":"w1","at_ms":1764400000000,"reservation_id":"..."}`
//! `reservation_id` is absent when the message could not be parsed.
//!
//! It also owns the archive script: settled entries move to the sale's
//! dead-letter archive, each exactly once ([`archive`]).

use crate::keys::SaleKeys;
use redis::Script;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// `KEYS`: dead-letter list, archive; `ARGV`: the entry, its archive form.
/// Replies 1 when the entry moved, 0 when it was no longer there; an error
/// reply, with nothing moved, when either list holds another type (the
/// `LREM` must not run when the `RPUSH` would then fail: the entry would be
/// lost).
const ARCHIVE_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r"
local bad = expect_types({KEYS[1], 'list', KEYS[2], 'list'})
if bad then return bad end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0"
);

/// One message given up on, with why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The queued message exactly as it was (lossy UTF-8 if it was not text).
    pub message: String,
    /// Why it was given up on, e.g. `malformed order message: ...`,
    /// `unknown sale 9`, `stock exhausted in MySQL`, `max attempts`.
    pub reason: String,
    /// Failed applications counted for it (0 for an unparseable message).
    pub attempts: u32,
    /// The worker that dead-lettered it.
    pub worker: String,
    /// When, Unix ms (worker clock).
    pub at_ms: u64,
    /// The reservation id when the message could be parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
}

impl DeadLetter {
    /// The JSON text stored in the list.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an entry; `None` if it is not one (a foreign push).
    pub fn parse(raw: &[u8]) -> Option<DeadLetter> {
        serde_json::from_slice(raw).ok()
    }
}

/// Moves one copy of `entry` from sale `sale_id`'s dead-letter list to its
/// archive (`seckill:{sale:ID}:dlq:archive`) as `archived` (the entry
/// wrapped with what settled it), in one atomic script (`LREM` one copy,
/// `RPUSH` only if it was removed); returns whether it moved (`false`: no
/// longer there, moved by a repeat or another process).
///
/// Errors: Redis failures, or the script's refusal, with nothing moved,
/// when either list holds another type.
pub fn archive(
    con: &mut impl redis::ConnectionLike,
    sale_id: u64,
    entry: &str,
    archived: &str,
) -> redis::RedisResult<bool> {
    archive_in(con, SaleKeys::new(sale_id), entry, archived)
}

/// [`archive`] within bucket `k` of a sale split over buckets (its own
/// dead-letter list and archive).
///
/// Errors: as [`archive`].
pub fn archive_in(
    con: &mut impl redis::ConnectionLike,
    k: SaleKeys,
    entry: &str,
    archived: &str,
) -> redis::RedisResult<bool> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let n: i64 = SCRIPT
        .get_or_init(|| Script::new(ARCHIVE_LUA))
        .key(k.dead_letter())
        .key(k.dead_letter_archive())
        .arg(entry)
        .arg(archived)
        .invoke(con)?;
    Ok(n == 1)
}
