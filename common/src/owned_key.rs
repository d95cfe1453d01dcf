//! Owns the scripts of a key held by a token (a lock): extend it or delete
//! it only while it still holds the caller's token, so a holder whose lock
//! expired and was taken by another never extends or frees the other's.
//! The reconciler's run lock (`seckill:reconcile:lock`) uses them.

use redis::Script;
use std::sync::OnceLock;

/// `KEYS[1]` the key, `ARGV[1]` the token: `DEL` when it holds the token.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0";

/// `KEYS[1]` the key, `ARGV[1]` the token, `ARGV[2]` the new TTL in ms:
/// `PEXPIRE` when it holds the token.
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0";

/// Sets the TTL of `key` to `ttl_ms` if it still holds `token`; returns
/// whether it did (`false`: the key expired or another holds it).
///
/// Errors: Redis failures.
pub fn extend(
    con: &mut impl redis::ConnectionLike,
    key: &str,
    token: &str,
    ttl_ms: u64,
) -> redis::RedisResult<bool> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let ok: i64 = SCRIPT
        .get_or_init(|| Script::new(EXTEND_LUA))
        .key(key)
        .arg(token)
        .arg(ttl_ms)
        .invoke(con)?;
    Ok(ok == 1)
}

/// Deletes `key` if it still holds `token`; returns whether it did.
///
/// Errors: Redis failures.
pub fn release(
    con: &mut impl redis::ConnectionLike,
    key: &str,
    token: &str,
) -> redis::RedisResult<bool> {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    let n: i64 = SCRIPT
        .get_or_init(|| Script::new(RELEASE_LUA))
        .key(key)
        .arg(token)
        .invoke(con)?;
    Ok(n == 1)
}
