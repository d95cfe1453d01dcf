//! Owns `migrate`: applies the MySQL schema's migrations not yet applied
//! (`seckill_common::schema`).

use crate::config::Config;
use crate::error::RunError;
use crate::output::outln;

/// Applies the migrations; exit code 0.
///
/// Errors: MySQL failures, a schema from a newer build.
pub fn run(config: &Config) -> Result<u8, RunError> {
    let applied =
        seckill_common::schema::migrate(&config.services.mysql_url, config.services.mysql_timeout)?;
    if applied.is_empty() {
        outln!("schema is current; nothing to apply");
    } else {
        outln!("applied migrations {applied:?}");
    }
    Ok(0)
}
