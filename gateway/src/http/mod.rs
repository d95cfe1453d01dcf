//! Owns HTTP: the only layer that knows tiny_http, status codes and
//! headers. A request is routed ([`routes`]), its body taken safely
//! ([`body`]), charged to its client address ([`client_addr`]), served by
//! the layers below and answered ([`outcomes`] says each domain outcome as
//! a [`reply::Reply`]); a purchase may be handed with its request to the
//! Redis thread that decides it ([`answer`]). [`handler`] is one request's
//! life, [`listener`] the socket and the server.

pub mod answer;
pub mod body;
pub mod client_addr;
pub mod handler;
pub mod headers;
pub mod listener;
pub mod outcomes;
pub mod reply;
pub mod routes;

use crate::admission::Admission;
use crate::metrics::{Label, Metrics};
use crate::payments::Payments;
use crate::purchase::Purchases;
use crate::queries::Reads;
use seckill_common::trusted::TrustedProxies;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The parts a request is served with: each layer below borrows its own.
pub struct Gateway {
    /// The purchase path.
    pub purchases: Purchases,
    /// Identity, limits and the in-flight bound.
    pub admission: Admission,
    /// The reading routes.
    pub reads: Reads,
    /// The payment webhook and cancellations.
    pub payments: Payments,
    /// All counters and histograms.
    pub metrics: Arc<Metrics>,
    /// `SECKILL_GATEWAY_TRUSTED_PROXIES` (`client_addr.rs`).
    pub trusted_proxies: TrustedProxies,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// The stop's view of the requests.
    pub lifecycle: Lifecycle,
}

/// Requests being handled, and whether the stop has begun.
#[derive(Debug, Default)]
pub struct Lifecycle {
    /// Requests being handled now (the stop waits for them).
    pub active: AtomicUsize,
    /// Set at stop: requests that arrive afterwards get 503.
    pub closing: AtomicBool,
}

impl Gateway {
    /// Counts a request answered with `status` (`/metrics`): its latency
    /// since `start`, and one fewer in flight.
    pub fn count(&self, label: Label, status: u16, start: Instant) {
        self.metrics.request(label, status, start.elapsed());
        self.metrics.in_flight.dec();
    }
}

impl Lifecycle {
    /// Begins the stop: requests that arrive from now on get 503; waits
    /// at most `wait` for those being handled (and purchases in a Redis
    /// pipeline) to be answered.
    pub fn drain(&self, wait: Duration) {
        use std::sync::atomic::Ordering;
        self.closing.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + wait;
        while self.active.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
