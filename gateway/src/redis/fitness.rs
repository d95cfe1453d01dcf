//! Owns the check of the Redis server's fitness for purchases: once per
//! [`CHECK_EVERY`], on a connection of its own, the eviction policy (and
//! persistence) is read, so a `CONFIG SET maxmemory-policy` on a live
//! Redis stops purchases within about a tenth of a second
//! ([`Fitness::unfit`]; a check is two `INFO` sections and one `CONFIG
//! GET`, ten a second per gateway); a
//! policy changed on a live connection would otherwise be seen only at the
//! next reconnect.

use crate::redis::Redis;
use seckill_common::connections::{Held, Slot, Store};
use seckill_common::redis_target::Con;
use seckill_common::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the server is checked: every purchase answered 202 between
/// a switch to an `allkeys-*` policy and the next check can be evicted
/// (`redis_fitness_window.rs` measures that window).
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Whether the last check found a server that can delete the sale's keys.
#[derive(Debug, Default)]
pub struct Fitness {
    unfit: AtomicBool,
}

impl Fitness {
    /// True while the last check found an eviction policy that can delete
    /// the sale's keys: purchases are refused until it is fixed.
    pub fn unfit(&self) -> bool {
        self.unfit.load(Ordering::Acquire)
    }

    /// Checks the server every [`CHECK_EVERY`] until `shutdown`.
    pub fn run(&self, redis: &Redis, shutdown: &Shutdown) {
        let mut checker: Option<Held<Con>> = None;
        let mut slot = Slot::new(Store::Redis);
        while !shutdown.is_triggered() {
            self.check(redis, &mut checker, &mut slot);
            std::thread::sleep(CHECK_EVERY);
        }
    }

    /// One check, on `checker` (reopened after a failure): a link refuses
    /// to connect to an unfit server at all, which would hide the answer.
    fn check(&self, redis: &Redis, checker: &mut Option<Held<Con>>, slot: &mut Slot) {
        use seckill_common::redis_server::{self, ServerError};
        if checker.is_none() {
            *checker = redis
                .client
                .connect(redis.timeout)
                .ok()
                .map(|c| slot.hold(c));
        }
        let Some(con) = checker.as_deref_mut() else {
            return;
        };
        match redis_server::check(con) {
            Ok(p) => {
                if self.unfit.swap(false, Ordering::AcqRel) {
                    log::info!("redis: the eviction policy is fixed; taking purchases again");
                }
                redis
                    .metrics
                    .redis_persistence_off
                    .set(i64::from(p.nothing()));
            }
            Err(ServerError::Redis(_)) => *checker = None,
            Err(e) => {
                if !self.unfit.swap(true, Ordering::AcqRel) {
                    redis.metrics.redis_refused.inc();
                    log::error!("{e}; purchases are answered 503 until it is fixed");
                }
            }
        }
    }
}
