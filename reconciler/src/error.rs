//! Owns the reconciler's error type: every way a command can fail to run,
//! each mapped by `main` to exit code 2.

use crate::lock::LockError;
use crate::review::ReviewError;
use seckill_common::schema::SchemaError;
use seckill_common::{mysql_error, redact};
use std::fmt;

/// Why a command could not run (exit code 2).
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError {
    /// Redis could not be reached or failed a command.
    Redis(redis::RedisError),
    /// The Redis server is unfit to hold the sales (an eviction policy
    /// that can delete their keys) or could not be checked.
    RedisServer(seckill_common::redis_server::ServerError),
    /// MySQL could not be reached or failed a statement.
    Mysql(mysql::Error),
    /// [`RunError::Mysql`] with the server's address (password hidden) and
    /// its variable, as `main` prints it ([`at_addresses`]).
    MysqlAt(String, mysql::Error),
    /// The SQLite review store failed.
    Review(ReviewError),
    /// The run lock could not be taken or was lost.
    Lock(LockError),
    /// The release script failed.
    Release(seckill_common::release::ReleaseError),
    /// SIGINT or SIGTERM arrived; the run stopped between two chunks.
    Interrupted,
    /// The operator asked for something this finding does not allow.
    Refused(String),
    /// Writing the result to stdout failed (other than a closed pipe, which
    /// ends the output quietly).
    Output(std::io::Error),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Redis(e) => write!(f, "redis: {e}"),
            RunError::RedisServer(e) => write!(f, "{e}"),
            RunError::Mysql(e) => write!(f, "mysql: {}", mysql_error::explain(e)),
            RunError::MysqlAt(at, e) => write!(f, "mysql at {at}: {}", mysql_error::explain(e)),
            RunError::Review(e) => write!(f, "{e}"),
            RunError::Lock(e) => write!(f, "{e}"),
            RunError::Release(e) => write!(f, "{e}"),
            RunError::Interrupted => write!(f, "interrupted: stopped by a signal"),
            RunError::Refused(why) => write!(f, "refused: {why}"),
            RunError::Output(e) => write!(f, "stdout: {e}"),
        }
    }
}

impl std::error::Error for RunError {}

/// A command's error `e` as `main` prints it: a MySQL error (a
/// [`RunError::Mysql`], a [`SchemaError::Mysql`] or the driver's own) names the server `mysql_url`
/// it came from (without its password) and `SECKILL_MYSQL_URL`, so the
/// operator knows which setting to fix; anything else is `e` as it is.
pub fn at_addresses(e: Box<dyn std::error::Error>, mysql_url: &str) -> Box<dyn std::error::Error> {
    let at = || redact::address(mysql_url, "SECKILL_MYSQL_URL");
    let e = match e.downcast::<RunError>() {
        Ok(run) => match *run {
            RunError::Mysql(m) => return Box::new(RunError::MysqlAt(at(), m)),
            other => return Box::new(other),
        },
        Err(e) => e,
    };
    let e = match e.downcast::<SchemaError>() {
        Ok(schema) => match *schema {
            SchemaError::Mysql(m) => return Box::new(RunError::MysqlAt(at(), m)),
            other => return Box::new(other),
        },
        Err(e) => e,
    };
    match e.downcast::<mysql::Error>() {
        Ok(m) => Box::new(RunError::MysqlAt(at(), *m)),
        Err(e) => e,
    }
}

impl From<seckill_common::redis_server::ServerError> for RunError {
    fn from(e: seckill_common::redis_server::ServerError) -> Self {
        RunError::RedisServer(e)
    }
}

impl From<redis::RedisError> for RunError {
    fn from(e: redis::RedisError) -> Self {
        RunError::Redis(e)
    }
}

impl From<mysql::Error> for RunError {
    fn from(e: mysql::Error) -> Self {
        RunError::Mysql(e)
    }
}

impl From<ReviewError> for RunError {
    fn from(e: ReviewError) -> Self {
        RunError::Review(e)
    }
}

impl From<rusqlite::Error> for RunError {
    fn from(e: rusqlite::Error) -> Self {
        RunError::Review(ReviewError::Sqlite(e))
    }
}

impl From<LockError> for RunError {
    fn from(e: LockError) -> Self {
        RunError::Lock(e)
    }
}

impl From<seckill_common::release::ReleaseError> for RunError {
    fn from(e: seckill_common::release::ReleaseError) -> Self {
        RunError::Release(e)
    }
}

impl From<seckill_common::schema::SchemaError> for RunError {
    fn from(e: seckill_common::schema::SchemaError) -> Self {
        match e {
            seckill_common::schema::SchemaError::Mysql(e) => RunError::Mysql(e),
            other => RunError::Refused(other.to_string()),
        }
    }
}

impl From<seckill_common::lifecycle::LifecycleError> for RunError {
    fn from(e: seckill_common::lifecycle::LifecycleError) -> Self {
        use seckill_common::lifecycle::LifecycleError as L;
        match e {
            L::Mysql(e) => RunError::Mysql(e),
            L::Redis(e) => RunError::Release(e),
            other => RunError::Refused(other.to_string()),
        }
    }
}
