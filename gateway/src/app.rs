//! Owns the state shared by every gateway thread ([`App`]: settings,
//! metrics, the sold-out memory, the way purchases reach Redis), the
//! per-thread state of a handler ([`Worker`]: its own Redis link), and the
//! one-round-trip reservation used without group commit.

use crate::buyers::Buyers;
use crate::group_commit::Job;
use crate::metrics::Metrics;
use crate::redis_link::{Link, Unavailable};
use crate::soldout::SoldOutCache;
use crossbeam_channel::Sender;
use seckill_common::reservation::{self, ReserveOutcome};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

/// What every thread shares.
pub struct App {
    /// All counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The sold-out fast path.
    pub soldout: SoldOutCache,
    /// Buyers this gateway has seen, so the fast path answers their retries 409.
    pub buyers: Buyers,
    /// Opens Redis connections (`SECKILL_REDIS_URL`).
    pub client: redis::Client,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// Group commit: the queue to the Redis threads. `None`: every handler
    /// calls Redis itself, one round trip per purchase.
    pub jobs: Option<Sender<Job>>,
    /// Slow-lane threads running now (see `body.rs`).
    pub slow_lane: AtomicUsize,
    /// Purchases handed to the group-commit threads and not yet answered
    /// (the stop waits for them).
    pub pending: AtomicUsize,
}

/// What one handler thread owns.
pub struct Worker {
    /// The shared state.
    pub app: Arc<App>,
    /// This thread's Redis connection (queries, and purchases when there is
    /// no group commit).
    pub link: Link,
}

impl Worker {
    /// A worker with a not-yet-connected link.
    pub fn new(app: Arc<App>) -> Worker {
        let link = Link::new(app.client.clone(), app.redis_timeout, app.metrics.clone());
        Worker { app, link }
    }

    /// Reserves one unit of `sale_id` for the valid `user_id` in one round
    /// trip on this thread's connection (no group commit).
    ///
    /// Errors: [`Unavailable`] when Redis cannot be reached in time. Then a
    /// reservation may still have been made (the script ran, the answer was
    /// lost); a retry by the client is answered 409 with its id.
    pub fn reserve(&mut self, sale_id: u64, user_id: &str) -> Result<ReserveOutcome, Unavailable> {
        let rid = seckill_common::ids::new_reservation_id();
        let inv = reservation::prepare(sale_id, user_id, &rid);
        let reply = self.link.with(|con| inv.invoke::<redis::Value>(con))?;
        match reservation::parse_reply(&reply) {
            Ok(o) => Ok(own(o, &rid)),
            Err(e) => {
                self.app.metrics.redis_errors.inc();
                log::error!("reservation: {e}");
                Err(Unavailable)
            }
        }
    }
}

/// A reservation sent twice with the same id (a retry after a broken
/// connection) finds its own first attempt: that is a success, not a 409.
pub fn own(outcome: ReserveOutcome, rid: &str) -> ReserveOutcome {
    match outcome {
        ReserveOutcome::AlreadyPurchased(r) if r == rid => ReserveOutcome::Reserved(r),
        o => o,
    }
}
