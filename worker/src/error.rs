//! Owns the worker's error types: why [`crate::run`] stopped, and how one
//! failed MySQL application is classified (retry in place, reconnect, or count
//! a failed attempt against the messages).

use std::fmt;

/// Why the worker could not run. Redis or MySQL being unreachable is not one
/// of these: the worker waits and retries until they answer or it is stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkerError {
    /// `SECKILL_REDIS_URL` could not be turned into a client.
    BadRedisUrl(String),
    /// `SECKILL_MYSQL_URL` could not be turned into connection options.
    BadMysqlUrl(String),
    /// The `/metrics` listener could not bind its address.
    MetricsListen(String),
    /// A background thread could not be started.
    Thread(String),
    /// MySQL refused what waiting cannot fix (access denied, an unknown
    /// database, missing tables or migrations); holds the address, the
    /// server's error and the remedy (`start_check.rs`).
    MysqlRefused(String),
    /// Redis refused the password of `SECKILL_REDIS_URL`; holds the
    /// address, the client's error and the remedy
    /// (`seckill_common::redis_error`).
    RedisRefused(String),
    /// Another worker is live under this worker's id: its heartbeat was
    /// refreshed while this one waited (`housekeeping::beaten_by_another`);
    /// holds the id.
    IdLive(String),
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::BadRedisUrl(d) => write!(
                f,
                "SECKILL_REDIS_URL: {d}: expected a URL such as redis://127.0.0.1:6379/"
            ),
            WorkerError::BadMysqlUrl(d) => write!(
                f,
                "SECKILL_MYSQL_URL: {d}: expected a URL such as \
                 mysql://user:password@127.0.0.1:3306/seckill"
            ),
            WorkerError::MetricsListen(d) => write!(
                f,
                "metrics listener (SECKILL_WORKER_METRICS_LISTEN): {d}: give each worker \
                 a free address"
            ),
            WorkerError::Thread(d) => write!(f, "thread start: {d}"),
            WorkerError::MysqlRefused(d) => write!(f, "mysql at {d}"),
            WorkerError::RedisRefused(d) => write!(f, "redis at {d}"),
            WorkerError::IdLive(id) => write!(
                f,
                "SECKILL_WORKER_ID={id}: another worker is live under this id (its heartbeat \
                 was refreshed while this one waited); give each worker its own id (the unit \
                 instance seckill-worker@ID), or stop the other one first"
            ),
        }
    }
}

impl std::error::Error for WorkerError {}

impl WorkerError {
    /// Whether the error is a configuration problem (exit code 2: a URL, a
    /// MySQL that refuses this user or lacks the schema, or a metrics
    /// address that cannot be listened on, as the gateway's, a Redis that
    /// refuses the password) rather than a
    /// runtime one (exit code 1).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            WorkerError::BadRedisUrl(_)
                | WorkerError::BadMysqlUrl(_)
                | WorkerError::MetricsListen(_)
                | WorkerError::MysqlRefused(_)
                | WorkerError::RedisRefused(_)
                | WorkerError::IdLive(_)
        )
    }
}

/// Why one MySQL application of a batch failed, by what the worker does next.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApplyError {
    /// Deadlock (1213), lock-wait timeout (1205) or a lost insert race: the
    /// transaction was rolled back; retry it with backoff on the same
    /// connection. Never counted against the messages.
    Transient(String),
    /// The connection is gone or could not be opened (refused, killed,
    /// server shutdown, timeout): reconnect and retry, keeping the messages in
    /// the processing list. Never counted against the messages.
    Connection(String),
    /// Any other server error (a statement error: a table missing, a
    /// privilege refused, a trigger's refusal), as the operator reads it,
    /// with its remedy when waiting does not fix it
    /// (`seckill_common::mysql_error::explain`): retried with backoff for
    /// `SECKILL_WORKER_RETRY_FOR`, then counted as one failed application
    /// of each message involved (see `SECKILL_WORKER_MAX_ATTEMPTS`).
    Permanent(String),
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApplyError::Transient(d) => write!(f, "transient mysql error: {d}"),
            ApplyError::Connection(d) => write!(f, "mysql connection: {d}"),
            ApplyError::Permanent(d) => write!(f, "mysql: {d}"),
        }
    }
}

impl std::error::Error for ApplyError {}

/// MySQL/MariaDB server error codes after which the transaction is retried.
/// 1213 `ER_LOCK_DEADLOCK`, 1205 `ER_LOCK_WAIT_TIMEOUT` (MySQL reference
/// manual, "Server Error Message Reference").
const TRANSIENT_CODES: &[u16] = &[1205, 1213];

/// Server error codes that mean the session is gone: 1053 server shutdown,
/// 1040 too many connections, 1317 query interrupted (`KILL`), 1927
/// connection killed (MariaDB), 2006 server gone away, 2013 lost connection,
/// 4031 disconnected for inactivity (MySQL 8.0.24+; MariaDB just closes the
/// socket when `idle_transaction_timeout` ends an idle transaction), 1290 the server
/// runs `--read-only` (made read-only by a switchover: the next connect
/// finds the writable server of `SECKILL_MYSQL_URL`).
const CONNECTION_CODES: &[u16] = &[1040, 1053, 1290, 1317, 1927, 2006, 2013, 4031];

impl From<mysql::Error> for ApplyError {
    fn from(e: mysql::Error) -> Self {
        match &e {
            mysql::Error::MySqlError(se) if TRANSIENT_CODES.contains(&se.code) => {
                ApplyError::Transient(e.to_string())
            }
            mysql::Error::MySqlError(se) if CONNECTION_CODES.contains(&se.code) => {
                ApplyError::Connection(e.to_string())
            }
            mysql::Error::MySqlError(_) => {
                ApplyError::Permanent(seckill_common::mysql_error::explain(&e))
            }
            mysql::Error::FromValueError(_) | mysql::Error::FromRowError(_) => {
                ApplyError::Permanent(e.to_string())
            }
            // A timeout of the driver (a connect's timeout is already an
            // I/O error of kind `TimedOut` naming the server).
            mysql::Error::CodecError(_)
            | mysql::Error::IoError(_)
            | mysql::Error::DriverError(_)
                if seckill_common::mysql_error::is_timeout(&e)
                    && !matches!(&e, mysql::Error::IoError(io)
                        if io.kind() == std::io::ErrorKind::TimedOut) =>
            {
                ApplyError::Connection(format!(
                    "timeout: no answer within SECKILL_MYSQL_TIMEOUT (the server hangs or the \
                 network drops packets): {}",
                    seckill_common::mysql_error::describe(&e)
                ))
            }
            // I/O, codec and driver errors (closed socket, bad handshake)
            // all mean "this connection is unusable".
            _ => ApplyError::Connection(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_configuration_error_names_its_variable() {
        for (e, variable) in [
            (WorkerError::BadRedisUrl("x".into()), "SECKILL_REDIS_URL"),
            (WorkerError::BadMysqlUrl("x".into()), "SECKILL_MYSQL_URL"),
            (
                WorkerError::MetricsListen("x".into()),
                "SECKILL_WORKER_METRICS_LISTEN",
            ),
        ] {
            assert!(e.is_config());
            assert!(e.to_string().contains(variable), "{e}");
        }
    }

    fn server_error(code: u16) -> mysql::Error {
        mysql::Error::MySqlError(mysql::MySqlError {
            state: "HY000".into(),
            message: "x".into(),
            code,
        })
    }

    #[test]
    fn classifies_server_codes() {
        assert!(matches!(
            ApplyError::from(server_error(1213)),
            ApplyError::Transient(_)
        ));
        assert!(matches!(
            ApplyError::from(server_error(1205)),
            ApplyError::Transient(_)
        ));
        assert!(matches!(
            ApplyError::from(server_error(1927)),
            ApplyError::Connection(_)
        ));
        assert!(matches!(
            ApplyError::from(server_error(4031)),
            ApplyError::Connection(_)
        ));
        // A server made read-only (a switchover): reconnect, to the
        // writable server of SECKILL_MYSQL_URL.
        assert!(matches!(
            ApplyError::from(server_error(1290)),
            ApplyError::Connection(_)
        ));
        assert!(matches!(
            ApplyError::from(server_error(1146)),
            ApplyError::Permanent(_)
        ));
        let io = mysql::Error::IoError(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(matches!(ApplyError::from(io), ApplyError::Connection(_)));
    }
}
