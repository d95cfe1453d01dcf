//! Owns the check every binary makes of the Redis server on each (re)connect
//! (docs/reliability.md §3): a server whose eviction policy can delete this system's
//! keys is refused, one that persists nothing is warned about, and one that
//! refuses writes (a replica, a master short of replicas, out of memory) is
//! reported not ready.
//!
//! The rule, and why: only `maxmemory-policy noeviction` is accepted. Every
//! `allkeys-*` policy may evict a sale's stock, meta, buyers, flow records or
//! queue — reservations answered 202 would then never become orders, and a
//! lost stock key reads as "sold out". The `volatile-*` policies evict only
//! keys with a TTL, and this system's keys with a TTL are the workers'
//! heartbeats and the reconciler's run lock: evicting a heartbeat makes a
//! live worker look dead (its processing list is reclaimed under it), and
//! evicting the lock lets two reconciler runs overlap. So they are refused
//! too. Under `noeviction` a full Redis answers `OOM` to a script before its
//! first write, so a purchase changes nothing and is answered 503.

use crate::redis_target::{Con, Target};
use redis::{Connection, ConnectionLike};
use std::fmt;
use std::time::Duration;

/// The only `maxmemory-policy` accepted (see the module doc for why).
pub const REQUIRED_POLICY: &str = "noeviction";

/// A script that writes nothing but is not flagged `no-writes`: Redis
/// refuses it exactly when it would refuse a purchase before running it —
/// `READONLY` on a replica, `NOREPLICAS` on a master short of
/// `min-replicas-to-write`, `OOM` when memory is full under `noeviction`.
const WRITABLE_PROBE: &str = "#!lua\nreturn 1\n";

/// What the server keeps across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persistence {
    /// `appendonly yes` (INFO persistence `aof_enabled:1`).
    pub aof: bool,
    /// RDB save points configured (`CONFIG GET save` not empty); `None`
    /// when `CONFIG` is not allowed on this server.
    pub rdb: Option<bool>,
}

impl Persistence {
    /// True when the server provably persists nothing: a restart loses
    /// every reservation not yet in MySQL.
    pub fn nothing(&self) -> bool {
        !self.aof && self.rdb == Some(false)
    }
}

/// Why a Redis server cannot be used, or could not be checked.
#[derive(Debug)]
#[non_exhaustive]
pub enum ServerError {
    /// The eviction policy can delete this system's keys; holds the policy.
    EvictionPolicy(String),
    /// The server refuses writes now; holds its error reply (`READONLY`,
    /// `NOREPLICAS`, `OOM`, ...).
    NotWritable(String),
    /// The connection or a check command failed.
    Redis(redis::RedisError),
    /// No connection could be opened to the address (`SECKILL_REDIS_URL`
    /// without its password, and the variable's name).
    Unreachable(String, redis::RedisError),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::EvictionPolicy(p) => write!(
                f,
                "redis maxmemory-policy is {p}: it can evict this system's keys (stock, \
                 flow records, queues, heartbeats); set `maxmemory-policy {REQUIRED_POLICY}` \
                 (redis.conf, or CONFIG SET maxmemory-policy {REQUIRED_POLICY})"
            ),
            ServerError::NotWritable(e) => write!(f, "redis refuses writes: {e}"),
            ServerError::Redis(e) => write!(f, "redis: {}", crate::redis_error::explain(e)),
            ServerError::Unreachable(at, e) => {
                write!(f, "redis at {at}: {}", crate::redis_error::explain(e))
            }
        }
    }
}

impl std::error::Error for ServerError {}

impl crate::redis_target::NodeError for ServerError {
    fn is_link_failure(&self) -> bool {
        match self {
            ServerError::Redis(e) => crate::redis_target::NodeError::is_link_failure(e),
            ServerError::Unreachable(..) => true,
            ServerError::EvictionPolicy(_) | ServerError::NotWritable(_) => false,
        }
    }
}

impl From<redis::RedisError> for ServerError {
    fn from(e: redis::RedisError) -> Self {
        ServerError::Redis(e)
    }
}

fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// Checks the server at the other end of `con`, or every master of a
/// cluster ([`check_node`] each): on a cluster, `aof` holds when every
/// master has it, `rdb` when every master has save points. A master that
/// does not accept a connection is left out (`Con::each_reachable_master`).
///
/// Errors: those of [`check_node`], for the first master that fails.
pub fn check(con: &mut Con) -> Result<Persistence, ServerError> {
    let all = con.each_reachable_master(check_node)?;
    Ok(Persistence {
        aof: all.iter().all(|p| p.aof),
        rdb: all.iter().try_fold(true, |acc, p| p.rdb.map(|r| acc && r)),
    })
}

/// Checks one server: the eviction policy (from `INFO memory`, so it
/// works where `CONFIG` is renamed away) and what it persists.
///
/// Errors: [`ServerError::EvictionPolicy`] for any policy but
/// [`REQUIRED_POLICY`]; [`ServerError::Redis`] when `INFO` fails.
pub fn check_node<C: ConnectionLike>(con: &mut C) -> Result<Persistence, ServerError> {
    let memory: String = redis::cmd("INFO").arg("memory").query(con)?;
    let policy = info_field(&memory, "maxmemory_policy").unwrap_or(REQUIRED_POLICY);
    if policy != REQUIRED_POLICY {
        return Err(ServerError::EvictionPolicy(policy.to_string()));
    }
    let persistence: String = redis::cmd("INFO").arg("persistence").query(con)?;
    let aof = info_field(&persistence, "aof_enabled") == Some("1");
    let rdb = redis::cmd("CONFIG")
        .arg("GET")
        .arg("save")
        .query::<Vec<String>>(con)
        .ok()
        .map(|kv| kv.get(1).is_some_and(|v| !v.trim().is_empty()));
    Ok(Persistence { aof, rdb })
}

/// Whether the server would run a writing script now (see
/// [`WRITABLE_PROBE`]); the eviction policy is checked too, so a policy
/// changed at run time makes the caller unready.
///
/// Errors: [`ServerError::NotWritable`] with Redis's reply,
/// [`ServerError::EvictionPolicy`], or [`ServerError::Redis`] when the
/// server cannot be reached.
pub fn check_writable(con: &mut Con) -> Result<(), ServerError> {
    con.each_master(check_writable_node).map(|_| ())
}

/// [`check_writable`] of one server.
fn check_writable_node(con: &mut Connection) -> Result<(), ServerError> {
    check_node(con)?;
    match redis::cmd("EVAL")
        .arg(WRITABLE_PROBE)
        .arg(0)
        .query::<redis::Value>(con)
    {
        Ok(_) => Ok(()),
        Err(e) if crate::is_error_reply(&e) => Err(ServerError::NotWritable(e.to_string())),
        Err(e) => Err(ServerError::Redis(e)),
    }
}

/// Opens a connection to `url` with `timeout` for connect, reads and writes,
/// and [`check`]s the server; a server that persists nothing is logged as a
/// warning.
///
/// Errors: the URL is not usable, the server cannot be reached
/// ([`ServerError::Unreachable`], naming the address), or [`check`]
/// refuses it.
pub fn connect(url: &str, timeout: Duration) -> Result<(Con, Persistence), ServerError> {
    let target = Target::open(url)?;
    let mut con = target
        .connect(timeout)
        .map_err(|e| ServerError::Unreachable(target.address().to_string(), e))?;
    let p = check(&mut con)?;
    warn_if_volatile(&p);
    Ok((con, p))
}

/// Logs a loud warning when `p` persists nothing.
pub fn warn_if_volatile(p: &Persistence) {
    if p.nothing() {
        log::warn!(
            "redis persists nothing (appendonly no, no RDB save points): a Redis restart \
             loses every reservation not yet in MySQL; set `appendonly yes`"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_exactly() {
        let info =
            "# Memory\r\nused_memory:1\r\nmaxmemory_policy:allkeys-lru\r\nmaxmemory_policy_x:y\r\n";
        assert_eq!(info_field(info, "maxmemory_policy"), Some("allkeys-lru"));
        assert_eq!(info_field(info, "used_memory"), Some("1"));
        assert_eq!(info_field(info, "maxmemory"), None);
        let p = Persistence {
            aof: false,
            rdb: Some(false),
        };
        assert!(p.nothing());
        assert!(!Persistence { rdb: None, ..p }.nothing());
        assert!(!Persistence { aof: true, ..p }.nothing());
    }
}
