//! Owns the state shared by every gateway thread ([`App`]: settings,
//! metrics, the buyer identity, the sold-out memory, the way purchases reach
//! Redis, the Redis links the reading routes borrow, the rate limits and the
//! in-flight bound). Nothing here does work.

use crate::buyers::Loader;
use crate::identity::Identity;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::redis_link::LinkPool;
use crate::reserver::Reserver;
use crate::shed::Shed;
use crate::soldout::SoldOutCache;
use seckill_common::redis_target::Target;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

/// What every thread shares.
pub struct App {
    /// All counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The sold-out fast path.
    pub soldout: SoldOutCache,
    /// Each sale's number of buckets, for routing a purchase to its
    /// buyer's home bucket (`home.rs`).
    pub buckets: crate::home::BucketCounts,
    /// Loads a sold-out sale's buyers into `soldout` (`buyers.rs`).
    pub buyers: Loader,
    /// Opens Redis connections (`SECKILL_REDIS_URL`).
    pub client: Target,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// How a purchase reaches Redis: group commit or one round trip.
    pub reserver: Reserver,
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
    /// Who a request is from (`SECKILL_AUTH`, `identity.rs`).
    pub identity: Identity,
    /// The per-buyer and per-address rate limits (`limits.rs`).
    pub limits: Limits,
    /// `SECKILL_GATEWAY_TRUSTED_PROXIES` (`client_addr.rs`).
    pub trusted_proxies: seckill_common::trusted::TrustedProxies,
    /// The bound on purchases waiting for Redis (`shed.rs`).
    pub shed: Shed,
    /// `SECKILL_PAYMENT_SECRET`: the payment service's signing secret
    /// (`payments.rs`); `None`: payments are refused 503.
    pub payment_secret: Option<seckill_common::config::Secret>,
    /// `SECKILL_PAYMENT_TOLERANCE`, whole seconds.
    pub payment_tolerance_s: u64,
}
