//! Owns the reconciler's one error type, every way a command can fail, and
//! the exit codes of the commands (the rule is in the crate doc):
//! [`EXIT_REFUSED`] for a refusal, [`EXIT_CONFIG`] for anything that kept
//! the command from running.

use crate::cmd::token::TokenError;
use crate::lock::LockError;
use crate::review::ReviewError;
use seckill_common::data_loss::WatchError;
use seckill_common::lifecycle::LifecycleError;
use seckill_common::schema::SchemaError;
use seckill_common::start::EXIT_CONFIG;
use seckill_common::{mysql_error, redact, redis_error};
use std::fmt;

/// Exit code of a command that refused what it was asked because of the
/// state it found (a sale not ready, a finding already resolved, a worker
/// holding the sale's messages): nothing changed, and the audit log holds
/// the refusal where the command audits. The same code as `run`'s "open
/// findings": both ask a person to look; neither is a failure to run.
pub const EXIT_REFUSED: u8 = 1;

/// Why a command failed: [`RunError::Refused`] exits [`EXIT_REFUSED`],
/// every other variant [`EXIT_CONFIG`] (could not run).
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
    /// The state found does not allow what the operator asked (exit
    /// [`EXIT_REFUSED`]); nothing changed.
    Refused(String),
    /// What the command names does not exist, or names several things (no
    /// such sale, finding or dead letter): says where to look.
    NoSuch(String),
    /// `run` could not check some sales (Redis refused a command on their
    /// keys): which, and why.
    Unchecked(String),
    /// The MySQL URL is malformed (`SECKILL_MYSQL_URL`).
    Schema(SchemaError),
    /// An order's release would break MySQL's books; rolled back.
    Lifecycle(LifecycleError),
    /// The data-loss watch's script answered something this build does not
    /// know.
    Watch(WatchError),
    /// `sale create` could not load its new sale into Redis: the Redis
    /// error, and what became of the new MySQL row.
    CreateUndone(redis::RedisError, String),
    /// `token keygen` or `token issue` failed.
    Token(TokenError),
    /// Writing the result to stdout failed (other than a closed pipe, which
    /// ends the output quietly).
    Output(std::io::Error),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Redis(e) => write!(f, "redis: {}", redis_error::explain(e)),
            RunError::RedisServer(e) => write!(f, "{e}"),
            RunError::Mysql(e) => write!(f, "mysql: {}", mysql_error::explain(e)),
            RunError::MysqlAt(at, e) => write!(f, "mysql at {at}: {}", mysql_error::explain(e)),
            RunError::Review(e) => write!(f, "{e}"),
            RunError::Lock(e) => write!(f, "{e}"),
            RunError::Release(e) => write!(f, "{e}"),
            RunError::Interrupted => write!(f, "interrupted: stopped by a signal"),
            RunError::Refused(why) => write!(f, "refused: {why}"),
            RunError::NoSuch(what) => f.write_str(what),
            RunError::Unchecked(which) => write!(f, "sales not checked, {which}"),
            RunError::Schema(e) => write!(f, "{e}"),
            RunError::Lifecycle(e) => write!(f, "{e}"),
            RunError::Watch(e) => write!(f, "{e}"),
            RunError::CreateUndone(e, undo) => write!(f, "redis: {e}; {undo}"),
            RunError::Token(e) => write!(f, "{e}"),
            RunError::Output(e) => write!(f, "stdout: {e}"),
        }
    }
}

impl std::error::Error for RunError {}

impl RunError {
    /// The exit code of this error: [`EXIT_REFUSED`] for a refusal,
    /// [`EXIT_CONFIG`] (could not run) for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Refused(_) => EXIT_REFUSED,
            _ => EXIT_CONFIG,
        }
    }
}

/// A command's error `e` as `main` prints it: a MySQL error names the
/// server `mysql_url` it came from (without its password) and
/// `SECKILL_MYSQL_URL`, so the operator knows which setting to fix;
/// anything else is `e` as it is.
pub fn at_addresses(e: RunError, mysql_url: &str) -> RunError {
    match e {
        RunError::Mysql(m) => RunError::MysqlAt(redact::address(mysql_url, "SECKILL_MYSQL_URL"), m),
        other => other,
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
            other => RunError::Schema(other),
        }
    }
}

impl From<LifecycleError> for RunError {
    fn from(e: LifecycleError) -> Self {
        match e {
            LifecycleError::Mysql(e) => RunError::Mysql(e),
            LifecycleError::Redis(e) => RunError::Release(e),
            other => RunError::Lifecycle(other),
        }
    }
}

impl From<WatchError> for RunError {
    fn from(e: WatchError) -> Self {
        match e {
            WatchError::Redis(e) => RunError::Redis(e),
            WatchError::Mysql(e) => RunError::Mysql(e),
            other => RunError::Watch(other),
        }
    }
}

impl From<TokenError> for RunError {
    fn from(e: TokenError) -> Self {
        RunError::Token(e)
    }
}
