//! Owns everything that talks to Redis for purchases and reads: links
//! with reconnect and backoff ([`link`]), the two ways a purchase reaches
//! Redis ([`reserver`]), the group commit's Redis threads
//! ([`group_commit`], which hand each outcome on through its narrow
//! [`group_commit::Deliver`] trait), and the server's fitness check
//! ([`fitness`]). Nothing here knows HTTP or the purchase's answers.

pub mod fitness;
pub mod group_commit;
pub mod link;
pub mod reserver;

use crate::metrics::Metrics;
use link::Link;
use seckill_common::redis_target::Target;
use std::sync::Arc;
use std::time::Duration;

/// What opens a Redis connection: the server, its timeout, and the
/// metrics its links count into.
#[derive(Clone)]
pub struct Redis {
    /// Opens Redis connections (`SECKILL_REDIS_URL`).
    pub client: Target,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub timeout: Duration,
    /// Where links count their connects and errors.
    pub metrics: Arc<Metrics>,
}

impl Redis {
    /// A new link of its own for a thread, connected on first use.
    pub fn link(&self) -> Link {
        Link::new(self.client.clone(), self.timeout, self.metrics.clone())
    }
}
