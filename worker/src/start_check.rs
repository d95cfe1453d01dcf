//! Owns the worker's start-up check of MySQL: it answers, lets this user
//! into this database, and holds every migration this build knows. What
//! waiting cannot fix (access denied, an unknown database, missing tables
//! or migrations) is told apart from what it can (the server down or busy),
//! so a worker with a wrong `SECKILL_MYSQL_URL` stops with the remedy
//! instead of retrying forever.

use mysql::prelude::Queryable;
use seckill_common::mysql_error;
use seckill_common::schema::{self, SchemaError, MIGRATIONS};
use std::fmt;
use std::time::Duration;

/// Why MySQL is not usable at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartCheck {
    /// Waiting cannot fix it: the message names the server's error and the
    /// remedy.
    Permanent(String),
    /// The server is down, busy or slow: wait and check again.
    Transient(String),
}

impl fmt::Display for StartCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartCheck::Permanent(d) | StartCheck::Transient(d) => f.write_str(d),
        }
    }
}

/// Classifies `e`: permanent when `mysql_error` knows its remedy.
fn classify(e: &mysql::Error) -> StartCheck {
    match mysql_error::remedy(e) {
        Some(_) => StartCheck::Permanent(mysql_error::explain(e)),
        None => StartCheck::Transient(mysql_error::describe(e)),
    }
}

/// The migrations of [`MIGRATIONS`] that `applied` lacks.
fn missing(applied: &[u32]) -> Vec<u32> {
    MIGRATIONS
        .iter()
        .map(|(v, _, _)| *v)
        .filter(|v| !applied.contains(v))
        .collect()
}

/// Connects to `url` (connect, read and write timeout `timeout`) and reads
/// the applied migrations.
///
/// Errors: [`StartCheck::Permanent`] for an error of `seckill_common::mysql_error`'s permanent codes or
/// migrations this build needs that are not applied;
/// [`StartCheck::Transient`] for anything else.
pub fn check(url: &str, timeout: Duration) -> Result<(), StartCheck> {
    let mut conn = schema::connect(url, timeout).map_err(|e| match e {
        SchemaError::Mysql(m) => classify(&m),
        // Parsed at start already; kept apart all the same.
        other => StartCheck::Permanent(other.to_string()),
    })?;
    let applied: Vec<u32> = conn
        .query("SELECT version FROM schema_migrations")
        .map_err(|e| classify(&e))?;
    let lacking = missing(&applied);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(StartCheck::Permanent(format!(
        "migrations {lacking:?} of this build are not applied: run `seckill-reconciler migrate` (same SECKILL_MYSQL_URL)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: u16) -> mysql::Error {
        mysql::Error::MySqlError(mysql::MySqlError {
            state: "42000".into(),
            message: "x".into(),
            code,
        })
    }

    #[test]
    fn access_denied_unknown_database_and_missing_tables_are_permanent_the_rest_transient() {
        for code in [1044, 1045, 1046, 1049, 1142, 1146, 1698] {
            assert!(
                matches!(classify(&server_error(code)), StartCheck::Permanent(_)),
                "{code}"
            );
        }
        for code in [1040, 1053, 2013, 1205] {
            assert!(
                matches!(classify(&server_error(code)), StartCheck::Transient(_)),
                "{code}"
            );
        }
        let refused = mysql::Error::IoError(std::io::ErrorKind::ConnectionRefused.into());
        assert!(matches!(classify(&refused), StartCheck::Transient(_)));
        assert_eq!(
            classify(&server_error(1049)).to_string(),
            "ERROR 1049 (42000): x: create the database and its tables with \
             `seckill-reconciler migrate`, or fix its name in SECKILL_MYSQL_URL"
        );
    }

    #[test]
    fn a_schema_without_every_migration_of_this_build_is_missing_them() {
        let all: Vec<u32> = MIGRATIONS.iter().map(|(v, _, _)| *v).collect();
        assert!(missing(&all).is_empty());
        let last = all.last().copied().unwrap_or_default();
        let older: Vec<u32> = all.iter().copied().filter(|v| *v != last).collect();
        assert_eq!(missing(&older), vec![last]);
    }
}
