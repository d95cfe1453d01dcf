//! Owns the state shared by every gateway thread ([`App`]: settings,
//! metrics, the sold-out memory, the way purchases reach Redis) and the
//! per-thread state of a handler ([`Worker`]: its own Redis link and answer
//! channel), and the one function that reserves a unit either way.

use crate::group_commit::{answer_wait, Answer, Job};
use crate::metrics::Metrics;
use crate::redis_link::{Link, Unavailable};
use crate::soldout::SoldOutCache;
use crossbeam_channel::{Receiver, Sender};
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
}

/// What one handler thread owns.
pub struct Worker {
    /// The shared state.
    pub app: Arc<App>,
    /// This thread's Redis connection (queries, and purchases when there is
    /// no group commit).
    pub link: Link,
    answers: (Sender<Answer>, Receiver<Answer>),
}

impl Worker {
    /// A worker with a not-yet-connected link.
    pub fn new(app: Arc<App>) -> Worker {
        let link = Link::new(app.client.clone(), app.redis_timeout, app.metrics.clone());
        Worker {
            app,
            link,
            answers: crossbeam_channel::bounded(64),
        }
    }

    /// Tries to reserve one unit of `sale_id` for the valid `user_id`.
    ///
    /// Errors: [`Unavailable`] when Redis cannot be reached in time. Then a
    /// reservation may still have been made (the script ran, the answer was
    /// lost); a retry by the client is answered 409 with its id.
    pub fn reserve(&mut self, sale_id: u64, user_id: &str) -> Result<ReserveOutcome, Unavailable> {
        let rid = seckill_common::ids::new_reservation_id();
        let Some(jobs) = &self.app.jobs else {
            let inv = reservation::prepare(sale_id, user_id, &rid);
            let reply = self.link.with(|con| inv.invoke::<redis::Value>(con))?;
            return match reservation::parse_reply(&reply) {
                Ok(o) => Ok(own(o, &rid)),
                Err(e) => {
                    self.app.metrics.redis_errors.inc();
                    log::error!("reservation: {e}");
                    Err(Unavailable)
                }
            };
        };
        let job = Job {
            sale_id,
            user_id: user_id.to_string(),
            reservation_id: rid.clone(),
            answer: self.answers.0.clone(),
        };
        let wait = answer_wait(self.app.redis_timeout);
        if jobs.send_timeout(job, wait).is_err() {
            return Err(Unavailable);
        }
        let deadline = std::time::Instant::now() + wait;
        loop {
            match self.answers.1.recv_deadline(deadline) {
                Ok((id, r)) if id == rid => return r,
                Ok(_) => continue, // a late answer to an earlier, timed-out purchase
                Err(_) => return Err(Unavailable),
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
