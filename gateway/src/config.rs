//! Owns the gateway's settings: the process configuration
//! (`seckill_common::Config`, read once from `SECKILL_*`) resolved into
//! the narrow parts each layer is built from ([`Settings`]), so that no
//! layer below the process sees the whole configuration.

use seckill_common::config::Secret;
use seckill_common::trusted::TrustedProxies;
use seckill_common::{AuthMode, Config};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The listening socket (`http/listener.rs`).
#[derive(Debug, Clone)]
pub struct Listen {
    /// `SECKILL_LISTEN`.
    pub addr: SocketAddr,
    /// `SECKILL_GATEWAY_WRITE_TIMEOUT`.
    pub write_timeout: Duration,
    /// `SECKILL_GATEWAY_SEND_BUFFER`, bytes (0: the kernel's autotuning).
    pub send_buffer: usize,
}

/// The rate limits (`admission/limits.rs`).
#[derive(Debug, Clone, Copy)]
pub struct LimitSettings {
    /// `SECKILL_GATEWAY_BUYER_RATE`, per second (0: none).
    pub buyer_rate: u32,
    /// `SECKILL_GATEWAY_BUYER_BURST`.
    pub buyer_burst: u32,
    /// `SECKILL_GATEWAY_ADDRESS_RATE`, per second (0: none).
    pub address_rate: u32,
    /// `SECKILL_GATEWAY_ADDRESS_BURST`.
    pub address_burst: u32,
    /// `SECKILL_GATEWAY_LIMIT_SLOTS`: entries per table.
    pub slots: usize,
}

/// How buyers are identified (`admission/identity.rs`).
#[derive(Debug, Clone)]
pub struct IdentitySettings {
    /// `SECKILL_AUTH`.
    pub mode: AuthMode,
    /// `SECKILL_AUTH_KEYS`.
    pub keys: Option<PathBuf>,
    /// `SECKILL_AUTH_AUDIENCE`.
    pub audience: String,
    /// `SECKILL_AUTH_ISSUER`.
    pub issuer: Option<String>,
    /// `SECKILL_AUTH_LEEWAY`.
    pub leeway: Duration,
    /// `SECKILL_AUTH_MAX_TTL`.
    pub max_ttl: Duration,
    /// `SECKILL_AUTH_CACHE_MAX`.
    pub cache_max: usize,
}

/// The payment webhook (`payments.rs`).
#[derive(Clone)]
pub struct PaymentSettings {
    /// `SECKILL_PAYMENT_SECRET`; `None`: payments are refused.
    pub secret: Option<Secret>,
    /// `SECKILL_PAYMENT_TOLERANCE`, whole seconds.
    pub tolerance_s: u64,
}

/// Everything the gateway is built from.
#[derive(Clone)]
pub struct Settings {
    /// The listening socket.
    pub listen: Listen,
    /// `SECKILL_REDIS_URL`.
    pub redis_url: String,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_REDIS_REPLICAS_ACK` (0: none asked for).
    pub replicas_ack: usize,
    /// `SECKILL_GATEWAY_REDIS_THREADS` (0: one round trip per purchase).
    pub redis_threads: usize,
    /// Redis links for the reading routes (`SECKILL_GATEWAY_THREADS`, or
    /// its automatic value).
    pub links: usize,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// `SECKILL_GATEWAY_BUYERS_MAX`.
    pub buyers_max: usize,
    /// `SECKILL_GATEWAY_PURCHASES_IN_FLIGHT`.
    pub purchases_in_flight: usize,
    /// `SECKILL_GATEWAY_TRUSTED_PROXIES`.
    pub trusted_proxies: TrustedProxies,
    /// The rate limits.
    pub limits: LimitSettings,
    /// The buyer identity.
    pub identity: IdentitySettings,
    /// The payment webhook.
    pub payments: PaymentSettings,
}

impl Settings {
    /// The gateway's part of the process configuration.
    pub fn of(config: &Config) -> Settings {
        Settings {
            listen: Listen {
                addr: config.listen,
                write_timeout: config.gateway_write_timeout,
                send_buffer: config.gateway_send_buffer,
            },
            redis_url: config.redis_url.as_str().to_string(),
            redis_timeout: config.redis_timeout,
            replicas_ack: config.redis_replicas_ack,
            redis_threads: config.gateway_redis_threads,
            links: config.effective_gateway_threads(),
            body_limit: config.body_limit_bytes,
            buyers_max: config.gateway_buyers_max,
            purchases_in_flight: config.gateway_purchases_in_flight,
            trusted_proxies: config.gateway_trusted_proxies.clone(),
            limits: LimitSettings {
                buyer_rate: config.gateway_buyer_rate,
                buyer_burst: config.gateway_buyer_burst,
                address_rate: config.gateway_address_rate,
                address_burst: config.gateway_address_burst,
                slots: config.gateway_limit_slots,
            },
            identity: IdentitySettings {
                mode: config.auth,
                keys: config.auth_keys.clone(),
                audience: config.auth_audience.clone(),
                issuer: config.auth_issuer.clone(),
                leeway: config.auth_leeway,
                max_ttl: config.auth_max_ttl,
                cache_max: config.auth_cache_max,
            },
            payments: PaymentSettings {
                secret: config.payment_secret.clone(),
                tolerance_s: config.payment_tolerance.as_secs(),
            },
        }
    }
}
