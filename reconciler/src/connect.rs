//! Owns the reconciler's connections: one Redis connection checked for
//! fitness, one MySQL connection, both with the configured timeouts. Every
//! command opens its links here.

use crate::error::RunError;
use seckill_common::redis_target::Con;
use seckill_common::Services;

/// Opens a Redis connection with the configured timeouts and checks the
/// server (`seckill_common::redis_server`: an eviction policy that can
/// delete the sale's keys is refused, exit 2).
pub fn redis(config: &Services) -> Result<Con, RunError> {
    let (con, _) = seckill_common::redis_server::connect(&config.redis_url, config.redis_timeout)?;
    Ok(con)
}

/// Opens one MySQL connection with the configured URL and timeout.
///
/// Errors: the URL or the connection ([`RunError::Mysql`] and kin).
pub fn mysql(config: &Services) -> Result<mysql::Conn, RunError> {
    Ok(seckill_common::schema::connect(
        &config.mysql_url,
        config.mysql_timeout,
    )?)
}
