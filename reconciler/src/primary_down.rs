//! Owns what the reconciler says and does when no writable MySQL primary
//! answers (the primary down, no replica promoted yet): which errors mean
//! that, the advice a run prints, and the replica session the read-only
//! commands fall back to.
//!
//! A run records nothing then (every finding is decided on the primary);
//! its metrics file's `seckill_reconciler_mysql_primary_up` is 0, which
//! the alert `SeckillMysqlPrimaryDown` pages on.

use crate::config::Config;
use crate::error::RunError;
use seckill_common::redact::redacted;

/// Whether `e` is MySQL not answering (refused, timed out, no writable
/// server of several) rather than a server that answered with an error.
pub fn is_down(e: &RunError) -> bool {
    match e {
        RunError::Mysql(m) | RunError::MysqlAt(_, m) => {
            matches!(m, mysql::Error::IoError(_) | mysql::Error::DriverError(_))
        }
        _ => false,
    }
}

/// What a run that found the primary down adds to its journal line:
/// nothing recorded, and whether the replica answers.
pub fn advice(config: &Config) -> String {
    let replica = match &config.mysql_replica_url {
        None => "no SECKILL_MYSQL_REPLICA_URL to read meanwhile".to_string(),
        Some(url) => match seckill_common::schema::connect(url, config.services.mysql_timeout) {
            Ok(_) => format!(
                "the replica at {} (SECKILL_MYSQL_REPLICA_URL) answers and the read-only \
                     commands read it; if the primary is lost, promote the replica \
                     (docs/OPERATIONS.md, \"A MySQL failover\")",
                redacted(url)
            ),
            Err(e) => format!(
                "the replica at {} (SECKILL_MYSQL_REPLICA_URL) does not answer either: {e}",
                redacted(url)
            ),
        },
    };
    format!(
        "; no writable MySQL primary answered, so nothing was recorded (a finding is decided on \
         the primary); {replica}"
    )
}

/// A read-only session on the replica for a read-only command while the
/// primary is down (`primary_error`); `None` without a replica or when it
/// does not answer either. Warns that the replica may be behind.
pub fn replica_instead(config: &Config, primary_error: &RunError) -> Option<mysql::Conn> {
    use mysql::prelude::Queryable;
    let url = config.mysql_replica_url.as_ref()?;
    if !is_down(primary_error) {
        return None;
    }
    let mut conn = seckill_common::schema::connect(url, config.services.mysql_timeout).ok()?;
    conn.query_drop("SET SESSION TRANSACTION READ ONLY").ok()?;
    log::warn!(
        "reading the replica at {}: the primary is down ({primary_error}); the replica may be \
         behind what the primary had",
        redacted(url)
    );
    Some(conn)
}
