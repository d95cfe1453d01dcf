//! Owns `sale archive ID --by NAME`: the archive of an ended sale by hand,
//! under the run lock, after completing any archive an interruption left
//! half done (the rules and steps are `sale_archive.rs`).

use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::lock::{RunLock, LOCK_WAIT};
use crate::output::outln;
use crate::review::{ActionStatus, Review};
use crate::sale_archive::{archive, complete_interrupted};

/// `sale archive ID --by NAME`: exit 0 archived (or archived before), 1
/// refused (nothing changed), 2 could not run.
///
/// Errors: [`RunError`].
pub fn run(config: &Config, id: u64, by: &str) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let mut db = connect::mysql(&config.services)?;
    let mut redis = connect::redis(&config.services)?;
    let lock = RunLock::acquire(connect::redis(&config.services)?, LOCK_WAIT)?;
    let done = complete_interrupted(&review, &mut redis, &mut db).and_then(|_| {
        let grace = config.reconcile_grace;
        archive(&review, &mut redis, &mut db, id, by, grace, false)
    });
    let released = lock.release();
    let (status, text) = done?;
    released?;
    match status {
        ActionStatus::Refused => {
            eprintln!("seckill-reconciler: refused: {text}; nothing changed");
            Ok(EXIT_REFUSED)
        }
        _ => {
            outln!("{text}");
            Ok(0)
        }
    }
}
