//! Owns reading from a MariaDB replica (`SECKILL_MYSQL_REPLICA_URL`): a
//! read-only session on the replica, and the catch-up that makes it safe to
//! read: the primary's GTID position (`@@gtid_binlog_pos`) is read first,
//! then the replica waits for it (`MASTER_GTID_WAIT`) within a bound. A
//! replica that does not catch up in time, or cannot be reached, is not
//! read: the caller reads from the primary and says why ([`NotCaughtUp`]).
//! Nor is a replica whose position cannot be checked: a primary without a
//! binary log (`log_bin` off, MariaDB's default) has an empty position,
//! which every server has reached, however stale.
//!
//! The replica session is `READ ONLY`: a write sent to it by mistake fails
//! (error 1792) instead of landing on the replica, whatever the user's
//! privileges.

use mysql::prelude::Queryable;
use mysql::Conn;
use std::fmt;
use std::time::{Duration, Instant};

/// Why the replica is not read this time; the caller reads the primary.
#[derive(Debug)]
pub enum NotCaughtUp {
    /// The replica did not reach the primary's position within the bound.
    Behind {
        /// The primary's position it waited for.
        position: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The replica could not be reached, or refused the wait (not a
    /// replica, replication not configured with GTIDs).
    Unreachable {
        /// The replica's address, password hidden.
        at: String,
        /// What failed.
        error: String,
    },
    /// The primary's position could not be read.
    Primary(mysql::Error),
    /// The primary's position is empty (no binary log): the replica's
    /// cannot be compared with it.
    NoPosition,
}

impl fmt::Display for NotCaughtUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotCaughtUp::Behind { position, waited } => write!(
                f,
                "the replica did not reach the primary's GTID position {position} within {} ms \
                 (replication stopped or lagging: SHOW SLAVE STATUS on the replica; the bound is \
                 SECKILL_MYSQL_REPLICA_WAIT)",
                waited.as_millis()
            ),
            NotCaughtUp::Unreachable { at, error } => write!(
                f,
                "the replica at {at} (SECKILL_MYSQL_REPLICA_URL) failed: {error}"
            ),
            NotCaughtUp::NoPosition => write!(
                f,
                "the primary has no GTID position (@@gtid_binlog_pos is empty: its binary log \
                 is off), so whether the replica is current cannot be checked: turn on \
                 log_bin on the primary (docs/OPERATIONS.md, \"A MySQL replica for reads\")"
            ),
            NotCaughtUp::Primary(e) => write!(
                f,
                "the primary's GTID position (SELECT @@gtid_binlog_pos) could not be read: {}",
                crate::mysql_error::explain(e)
            ),
        }
    }
}

impl std::error::Error for NotCaughtUp {}

/// A replica session that has applied everything the primary had at
/// [`catch_up`]'s start.
pub struct CaughtUp {
    /// The read-only session on the replica.
    pub conn: Conn,
    /// The primary's position it reached.
    pub position: String,
    /// How long the wait took (connect included).
    pub waited: Duration,
}

/// Opens a read-only session on the replica at `replica_url` and waits, at
/// most `bound`, until it has applied the primary's current GTID position
/// (read on `primary` first).
///
/// Errors: [`NotCaughtUp`], saying why the replica must not be read now.
pub fn catch_up(
    primary: &mut Conn,
    replica_url: &str,
    timeout: Duration,
    bound: Duration,
) -> Result<CaughtUp, NotCaughtUp> {
    let started = Instant::now();
    let position: String = primary
        .query_first("SELECT @@gtid_binlog_pos")
        .map_err(NotCaughtUp::Primary)?
        .unwrap_or_default();
    if position.trim().is_empty() {
        return Err(NotCaughtUp::NoPosition);
    }
    let unreachable = |error: String| NotCaughtUp::Unreachable {
        at: crate::redact::redacted(replica_url),
        error,
    };
    let explain = |e: mysql::Error| unreachable(crate::mysql_error::explain_replica(&e));
    // The wait itself is bounded by the server; the read timeout must not
    // cut it short.
    let mut conn = crate::schema::connect(replica_url, timeout + bound).map_err(|e| match e {
        crate::schema::SchemaError::Mysql(e) => explain(e),
        other => unreachable(other.to_string()),
    })?;
    conn.query_drop("SET SESSION TRANSACTION READ ONLY")
        .map_err(explain)?;
    // 0: reached; -1: timed out. The wait is in seconds, fractions allowed.
    let reached: Option<i64> = conn
        .exec_first(
            "SELECT MASTER_GTID_WAIT(?, ?)",
            (&position, bound.as_secs_f64()),
        )
        .map_err(explain)?;
    let waited = started.elapsed();
    match reached {
        Some(0) => Ok(CaughtUp {
            conn,
            position,
            waited,
        }),
        _ => Err(NotCaughtUp::Behind { position, waited }),
    }
}
