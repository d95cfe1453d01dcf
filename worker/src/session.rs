//! Owns the settings every worker MySQL session gets when it opens: the
//! server-side limits that end a frozen worker's session, and `READ
//! COMMITTED` (set once here, so a batch's `BEGIN` is one round trip).
//!
//! A worker that stops making progress inside its transaction (SIGSTOP, a
//! hung host) must not keep the sale row locked: every session sets the
//! [`SessionLimits`] derived from `SECKILL_WORKER_HEARTBEAT_TTL`, so the
//! server ends such a session (and rolls its transaction back) before the
//! other workers reclaim the frozen worker's processing list, and a worker
//! waiting for the lock gets 1205 (retried, never counted against the
//! messages) instead of waiting 50 s. When the frozen worker resumes, its
//! next statement or `COMMIT` finds the session gone (a connection error):
//! it reconnects and applies its batch again, which the idempotency by
//! reservation id turns into "already done" (`apply.rs`).

use crate::error::ApplyError;
use mysql::prelude::Queryable;
use mysql::Conn;
use std::time::Duration;

/// The server-side limits every worker session sets right after it
/// connects, in whole seconds (the unit of these MariaDB variables), all
/// derived from the heartbeat TTL by [`SessionLimits::for_heartbeat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// `idle_transaction_timeout` (MariaDB 10.3+): a session idle this long
    /// inside a transaction is killed and its transaction rolled back. The
    /// worker sends its statements back to back (the fence's Redis read is
    /// before `BEGIN`), so only a worker that stopped is ever idle there.
    pub idle_transaction_s: u64,
    /// `innodb_lock_wait_timeout`: longest wait for a row lock (the sale
    /// row) before error 1205, which is retried.
    pub lock_wait_s: u64,
    /// `net_read_timeout` and `net_write_timeout`: longest stall of the
    /// server reading a statement from, or writing a result to, a worker
    /// (one that stopped half-way through a packet); the session is then
    /// aborted.
    pub net_s: u64,
}

impl SessionLimits {
    /// Half the heartbeat TTL, rounded down to whole seconds, at least 1 s
    /// (the smallest value these variables accept), for all four limits.
    ///
    /// Why half: other workers reclaim a silent worker's processing list
    /// between 2/3 of a TTL and 1.5 TTL after its last heartbeat (it beats
    /// every TTL/3; they look every TTL/2), so with a TTL of 2 s or more
    /// the server has released the sale row before the reclaimed messages
    /// are applied, and every other worker of the sale is held at most
    /// TTL/2 (the default TTL of 15 s gives 7 s). With a TTL below 2 s the
    /// limits stay 1 s. A waiter started waiting after the frozen
    /// session's last statement, so its 1205 hardly ever comes before that
    /// session ends (none in `tests/tests/worker_frozen.rs`).
    pub fn for_heartbeat(ttl: Duration) -> SessionLimits {
        let s = (ttl.as_secs() / 2).max(1);
        SessionLimits {
            idle_transaction_s: s,
            lock_wait_s: s,
            net_s: s,
        }
    }
}

/// `ER_UNKNOWN_SYSTEM_VARIABLE`: the server has no `idle_transaction_timeout`
/// (MySQL, MariaDB before 10.3).
const UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

/// Sets `limits` and `READ COMMITTED` on a new session. A server without
/// `idle_transaction_timeout` gets the other limits and a warning: there a
/// worker frozen between two statements holds its locks until its
/// connection dies.
///
/// Errors: as [`ApplyError`] (the session is not used then).
pub fn set_limits(conn: &mut Conn, l: SessionLimits) -> Result<(), ApplyError> {
    let common = format!(
        "innodb_lock_wait_timeout = {}, net_read_timeout = {n}, net_write_timeout = {n}",
        l.lock_wait_s,
        n = l.net_s
    );
    let all = format!(
        "SET SESSION idle_transaction_timeout = {}, {common}",
        l.idle_transaction_s
    );
    match conn.query_drop(all) {
        Err(mysql::Error::MySqlError(e)) if e.code == UNKNOWN_SYSTEM_VARIABLE => {
            log::warn!(
                "mysql has no idle_transaction_timeout ({}): a worker stopped inside \
                 its transaction keeps the sale row locked until its connection dies",
                e.message
            );
            conn.query_drop(format!("SET SESSION {common}"))?
        }
        r => r?,
    }
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_half_the_heartbeat_in_whole_seconds_and_at_least_one() {
        let l = |ms| SessionLimits::for_heartbeat(Duration::from_millis(ms));
        assert_eq!(
            l(15_000),
            SessionLimits {
                idle_transaction_s: 7,
                lock_wait_s: 7,
                net_s: 7
            }
        );
        assert_eq!(l(6_000).idle_transaction_s, 3);
        assert_eq!(l(3_000).lock_wait_s, 1);
        assert_eq!(l(1_000).net_s, 1);
        assert_eq!(l(100).idle_transaction_s, 1);
    }
}
