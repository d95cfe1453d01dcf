//! Owns the state shared by every gateway thread ([`App`]: settings,
//! metrics, the sold-out memory, the way purchases reach Redis), the pool
//! of Redis links the reading routes borrow ([`LinkPool`]), and the
//! one-round-trip reservation used without group commit ([`reserve`]).

use crate::buyers::Loader;
use crate::group_commit::Job;
use crate::metrics::Metrics;
use crate::redis_link::{Link, Unavailable};
use crate::soldout::SoldOutCache;
use crossbeam_channel::{Receiver, Sender};
use seckill_common::reservation::{self, Replied, ReserveOutcome};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

/// What every thread shares.
pub struct App {
    /// All counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The sold-out fast path.
    pub soldout: SoldOutCache,
    /// Loads a sold-out sale's buyers into `soldout` (`buyers.rs`).
    pub buyers: Loader,
    /// Opens Redis connections (`SECKILL_REDIS_URL`).
    pub client: redis::Client,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// Group commit: the queue to the Redis threads. `None`: each purchase
    /// borrows a link from `links` for one round trip.
    pub jobs: Option<Sender<Job>>,
    /// Redis links for the reading routes (and purchases without group
    /// commit): `SECKILL_GATEWAY_THREADS` of them.
    pub links: LinkPool,
    /// Requests being handled now (the stop waits for them).
    pub active: AtomicUsize,
    /// Set at stop: requests that arrive afterwards get 503.
    pub closing: AtomicBool,
    /// Set while the last server check (every second, `buyers.rs`) found
    /// an eviction policy that can delete the sale's keys: purchases get
    /// 503 until it is fixed (a policy changed on a live connection would
    /// otherwise be seen only at the next reconnect).
    pub redis_unfit: AtomicBool,
}

/// A fixed set of lazily connected Redis links that connection threads
/// borrow one at a time, so the number of Redis connections stays
/// `SECKILL_GATEWAY_THREADS` however many HTTP clients are connected.
pub struct LinkPool {
    free: Receiver<Link>,
    back: Sender<Link>,
    /// Longest wait for a free link: 3 × `SECKILL_REDIS_TIMEOUT` (as long
    /// as a purchase waits for its pipeline). On 2 cores, 3,000 clients
    /// reading at once starved the threads holding the links, and a 1 s
    /// wait answered thousands of reads 503 while Redis was healthy.
    wait: Duration,
}

impl LinkPool {
    /// `size` links (at least one), none connected yet.
    pub fn new(
        app_client: &redis::Client,
        size: usize,
        timeout: Duration,
        metrics: &Arc<Metrics>,
    ) -> LinkPool {
        let size = size.max(1);
        let (back, free) = crossbeam_channel::bounded(size);
        for _ in 0..size {
            // Cannot fail: the channel has room for every link.
            let _ = back.send(Link::new(app_client.clone(), timeout, metrics.clone()));
        }
        LinkPool {
            free,
            back,
            wait: timeout * 3,
        }
    }

    /// Runs `f` on a borrowed link and gives the link back.
    ///
    /// Errors: [`Unavailable`] when no link is free within three Redis
    /// timeouts, or what `f` returns.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Link) -> Result<T, Unavailable>,
    ) -> Result<T, Unavailable> {
        let mut link = self.free.recv_timeout(self.wait).map_err(|_| Unavailable)?;
        let r = f(&mut link);
        // Cannot fail: this pool holds the receiver and there is room.
        let _ = self.back.send(link);
        r
    }
}

/// Reserves one unit of `sale_id` for the valid `user_id` in one round trip
/// on a borrowed link (no group commit).
///
/// Errors: [`Unavailable`] when Redis cannot be reached in time. Then a
/// reservation may still have been made (the script ran, the answer was
/// lost); a retry by the client is answered 409 with its id.
pub fn reserve(app: &App, sale_id: u64, user_id: &str) -> Result<Replied, Unavailable> {
    let rid = seckill_common::ids::new_reservation_id();
    let inv = reservation::prepare(sale_id, user_id, &rid);
    let reply = app
        .links
        .with(|link| link.with(|con| inv.invoke::<redis::Value>(con)))?;
    match reservation::parse(&reply) {
        Ok(r) => Ok(own(r, &rid)),
        Err(e) => {
            app.metrics.redis_errors.inc();
            log::error!("reservation: {e}");
            Err(Unavailable)
        }
    }
}
/// A reservation sent twice with the same id (a retry after a broken
/// connection) finds its own first attempt: that is a success, not a 409.
pub fn own(replied: Replied, rid: &str) -> Replied {
    let outcome = match replied.outcome {
        ReserveOutcome::AlreadyPurchased(r) if r == rid => ReserveOutcome::Reserved(r),
        o => o,
    };
    Replied { outcome, ..replied }
}
