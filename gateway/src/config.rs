//! Owns the gateway's own settings: the variables only the gateway reads
//! (the `SECKILL_GATEWAY_*` beyond the shared ones, `SECKILL_AUTH*` but
//! the audience and the lifetime bound, `SECKILL_PAYMENT_TOLERANCE`,
//! `SECKILL_REDIS_REPLICAS_ACK`), parsed and checked here in the words of
//! every other setting (`seckill_common::config`), then resolved with the
//! shared configuration into the narrow parts each layer is built from
//! ([`Settings`]). A bad gateway-only value stops the gateway and no other
//! binary.

use seckill_common::config::{parse_duration, parse_duration_or_zero, parse_int, Secret};
use seckill_common::trusted::TrustedProxies;
use seckill_common::{Config, ConfigError, Env};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `SECKILL_AUTH`: where the buyer of a purchase comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// A verified JWT's `sub` (the default).
    Jwt,
    /// The body's `user_id`, unverified: development only.
    None,
}

/// The listening socket (`http/listener.rs`).
#[derive(Debug, Clone)]
pub struct Listen {
    /// `SECKILL_LISTEN`.
    pub addr: SocketAddr,
    /// `SECKILL_GATEWAY_WRITE_TIMEOUT`: send timeout of every HTTP client
    /// socket (each `write` call): a client that stops reading its
    /// responses holds its own connection's thread at most this long per
    /// write (that answer is then lost). Default 5s.
    pub write_timeout: Duration,
    /// `SECKILL_GATEWAY_SEND_BUFFER`: the send buffer of every HTTP client
    /// socket, in bytes (`SO_SNDBUF`; the kernel doubles it and keeps at
    /// least 4,608); `0` (the default) leaves it to the kernel's
    /// autotuning, up to `net.ipv4.tcp_wmem`'s maximum (4 MiB on Debian)
    /// per connection whose client stops reading. Like nginx's `listen
    /// ... sndbuf=`. 0 to 16 MiB.
    pub send_buffer: usize,
}

/// The rate limits (`admission/limits.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    /// `SECKILL_GATEWAY_BUYER_RATE`: purchase attempts per second each
    /// buyer may make on each sale, per gateway process (0-1000; `0`: no
    /// buyer limit). Default 2. Beyond it 429 `too_many_requests`, no
    /// Redis call.
    pub buyer_rate: u32,
    /// `SECKILL_GATEWAY_BUYER_BURST`: attempts a buyer may make at once
    /// before the rate applies (1-1000). Default 5.
    pub buyer_burst: u32,
    /// `SECKILL_GATEWAY_ADDRESS_RATE`: requests per second from one client
    /// address (an IPv6 client: its /64), every route but `/healthz`,
    /// `/readyz` and `/metrics`, valid or not (0-1,000,000; `0`: no
    /// address limit). Default 50.
    pub address_rate: u32,
    /// `SECKILL_GATEWAY_ADDRESS_BURST`: requests one address may send at
    /// once before the rate applies (1-1,000,000). Default 100.
    pub address_burst: u32,
    /// `SECKILL_GATEWAY_LIMIT_SLOTS`: entries of each of the two limit
    /// tables (buyers, addresses), 16 bytes each (1024-67,108,864; default
    /// 1,048,576: 16 MiB per table). See `admission/limits.rs` for what
    /// happens when a table is full.
    pub slots: usize,
}

/// How buyers are identified (`admission/identity.rs`).
#[derive(Debug, Clone)]
pub struct IdentitySettings {
    /// `SECKILL_AUTH`: how the gateway learns who buys: `jwt` (default, a
    /// signed token in `Authorization: Bearer`) or `none` (the `user_id`
    /// of the body, believed as sent: development only).
    pub mode: AuthMode,
    /// `SECKILL_AUTH_KEYS`: the gateway's key file, a JWKS document
    /// (`common/src/token.rs`), read at start. Required with `jwt`.
    pub keys: Option<PathBuf>,
    /// `SECKILL_AUTH_AUDIENCE` (shared: the reconciler mints tokens).
    pub audience: String,
    /// `SECKILL_AUTH_ISSUER`: when set, the `iss` every token must carry,
    /// exactly (an identity provider's issuer URL; 1-512 printable ASCII
    /// characters, no spaces). Unset: `iss` is not checked.
    pub issuer: Option<String>,
    /// `SECKILL_AUTH_LEEWAY`: clock skew allowed on `exp`, `nbf` and `iat`,
    /// whole seconds (0-300 s; default 30s).
    pub leeway: Duration,
    /// `SECKILL_AUTH_MAX_TTL` (shared: the reconciler mints tokens).
    pub max_ttl: Duration,
    /// `SECKILL_AUTH_CACHE_MAX`: most verified tokens remembered (each
    /// until its `exp`) so a retry costs a lookup, not a signature check;
    /// about 150 bytes each (0-10,000,000; default 200,000; 0 = none).
    pub cache_max: usize,
}

/// The payment webhook (`payments.rs`).
#[derive(Debug, Clone)]
pub struct PaymentSettings {
    /// `SECKILL_PAYMENT_SECRET` (shared: the load tool signs with it);
    /// `None`: payments are refused.
    pub secret: Option<Secret>,
    /// `SECKILL_PAYMENT_TOLERANCE`: how far a signature's timestamp may be
    /// from the gateway's clock, either way, whole seconds (1-3600 s;
    /// default 300s). A captured request is refused after it.
    pub tolerance_s: u64,
}

/// Everything the gateway is built from.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The listening socket.
    pub listen: Listen,
    /// `SECKILL_REDIS_URL`.
    pub redis_url: String,
    /// `SECKILL_REDIS_TIMEOUT`.
    pub redis_timeout: Duration,
    /// `SECKILL_REDIS_REPLICAS_ACK`: replicas that must have a purchase's
    /// reservation before it is answered 202 (`WAIT n timeout` after each
    /// group-commit pipeline, per master; 0-8, default 0: no wait). A
    /// reservation the replicas did not confirm within half of
    /// `SECKILL_REDIS_TIMEOUT` (so the reply comes before the read timeout)
    /// is answered 503 (it stays reserved: a retry gets 409 with its id).
    /// Group commit only.
    pub replicas_ack: usize,
    /// `SECKILL_GATEWAY_REDIS_THREADS`: gateway threads that pipeline
    /// queued purchases to Redis (group commit); `0` means one round trip
    /// per purchase on one of the shared Redis connections. Default 2
    /// (measured in docs/PERFORMANCE.md, "Performance: gateway").
    pub redis_threads: usize,
    /// Redis links for the reading routes (`SECKILL_GATEWAY_THREADS`, or
    /// its automatic value).
    pub links: usize,
    /// `SECKILL_BODY_LIMIT`, bytes.
    pub body_limit: usize,
    /// `SECKILL_GATEWAY_BUYERS_MAX`: most buyers (user id -> reservation
    /// id) the gateway keeps in memory, over all its sold-out sales, to
    /// answer winners' retries 409 without a Redis call (0-100,000,000;
    /// default 1,000,000, about 80 MB). A sold-out sale with more buyers
    /// than fit is answered with one `HGET` per purchase instead.
    pub buyers_max: usize,
    /// `SECKILL_GATEWAY_PURCHASES_IN_FLIGHT`: most purchases of one gateway
    /// waiting for Redis at once (1-1,000,000; default 1024); beyond it
    /// 503 `overloaded` at once.
    pub purchases_in_flight: usize,
    /// `SECKILL_GATEWAY_TRUSTED_PROXIES`: comma-separated addresses and
    /// CIDR ranges whose `X-Forwarded-For` is believed, or `none`. Default
    /// `127.0.0.1,::1` (the shipped nginx runs on the gateway's host).
    pub trusted_proxies: TrustedProxies,
    /// The rate limits.
    pub limits: LimitSettings,
    /// The buyer identity.
    pub identity: IdentitySettings,
    /// The payment webhook.
    pub payments: PaymentSettings,
}

impl Settings {
    /// The gateway's settings: the shared `config` and the process's own
    /// `SECKILL_*` variables.
    ///
    /// Errors: the first gateway-only variable whose value cannot be used.
    pub fn from_env(config: &Config) -> Result<Settings, ConfigError> {
        Settings::from_vars(config, &Env::from_env())
    }

    /// [`Settings::from_env`] from the raw environment `env`; missing or
    /// empty variables keep their default. Pure.
    ///
    /// Errors: the first gateway-only variable whose value cannot be used.
    pub fn from_vars(config: &Config, env: &Env) -> Result<Settings, ConfigError> {
        let mut s = Settings::defaults(config);
        read_gateway(&mut s, env)?;
        read_auth(&mut s.identity, env)?;
        if let Some(v) = env.get("SECKILL_PAYMENT_TOLERANCE") {
            let d = parse_duration("SECKILL_PAYMENT_TOLERANCE", v)?;
            if d > Duration::from_secs(3600) || d.subsec_nanos() != 0 {
                return Err(ConfigError::new(
                    "SECKILL_PAYMENT_TOLERANCE",
                    v,
                    "whole seconds from 1s to 3600s, such as 300s",
                ));
            }
            s.payments.tolerance_s = d.as_secs();
        }
        Ok(s)
    }

    /// The shared settings with every gateway-only one at its default.
    fn defaults(config: &Config) -> Settings {
        Settings {
            listen: Listen {
                addr: config.listen,
                write_timeout: Duration::from_secs(5),
                send_buffer: 0,
            },
            redis_url: config.redis_url.clone(),
            redis_timeout: config.redis_timeout,
            replicas_ack: 0,
            redis_threads: 2,
            links: config.effective_gateway_threads(),
            body_limit: config.body_limit_bytes,
            buyers_max: 1_000_000,
            purchases_in_flight: 1024,
            trusted_proxies: TrustedProxies::loopback(),
            limits: LimitSettings {
                buyer_rate: 2,
                buyer_burst: 5,
                address_rate: 50,
                address_burst: 100,
                slots: 1 << 20,
            },
            identity: IdentitySettings {
                mode: AuthMode::Jwt,
                keys: None,
                audience: config.auth_audience.clone(),
                issuer: None,
                leeway: Duration::from_secs(30),
                max_ttl: config.auth_max_ttl,
                cache_max: 200_000,
            },
            payments: PaymentSettings {
                secret: config.payment_secret.clone(),
                tolerance_s: 300,
            },
        }
    }
}

const INT_0_64: &str = "an integer from 0 (one round trip per purchase) to 64";
const INT_SEND_BUFFER: &str = "a byte count from 0 (the kernel's autotuning) to 16777216";
const INT_BUYERS: &str = "an integer from 0 to 100000000";
const INT_AUTH_CACHE: &str = "an integer from 0 to 10000000";
const INT_0_1000: &str = "an integer from 0 (no limit) to 1000";
const INT_1_1000: &str = "an integer from 1 to 1000";
const INT_0_1M: &str = "an integer from 0 (no limit) to 1000000";
const INT_1_1M: &str = "an integer from 1 to 1000000";
const INT_SLOTS: &str = "an integer from 1024 to 67108864";

/// A rate or a burst: at most 1,000,000, so it fits a `u32`.
fn parse_u32(
    variable: &'static str,
    v: &str,
    min: usize,
    max: usize,
    expected: &'static str,
) -> Result<u32, ConfigError> {
    let n = parse_int(variable, v, min, max, expected)?;
    u32::try_from(n).map_err(|_| ConfigError::new(variable, v, expected))
}

/// The gateway's `SECKILL_GATEWAY_*` and `SECKILL_REDIS_REPLICAS_ACK`.
fn read_gateway(s: &mut Settings, env: &Env) -> Result<(), ConfigError> {
    let get = |name: &str| env.get(name);
    if let Some(v) = get("SECKILL_GATEWAY_REDIS_THREADS") {
        s.redis_threads = parse_int("SECKILL_GATEWAY_REDIS_THREADS", v, 0, 64, INT_0_64)?;
    }
    if let Some(v) = get("SECKILL_REDIS_REPLICAS_ACK") {
        s.replicas_ack = parse_int(
            "SECKILL_REDIS_REPLICAS_ACK",
            v,
            0,
            8,
            "an integer from 0 to 8",
        )?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_WRITE_TIMEOUT") {
        s.listen.write_timeout = parse_duration("SECKILL_GATEWAY_WRITE_TIMEOUT", v)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_SEND_BUFFER") {
        s.listen.send_buffer = parse_int(
            "SECKILL_GATEWAY_SEND_BUFFER",
            v,
            0,
            1 << 24,
            INT_SEND_BUFFER,
        )?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_BUYERS_MAX") {
        s.buyers_max = parse_int("SECKILL_GATEWAY_BUYERS_MAX", v, 0, 100_000_000, INT_BUYERS)?;
    }
    read_limits(&mut s.limits, env)?;
    if let Some(v) = get("SECKILL_GATEWAY_TRUSTED_PROXIES") {
        s.trusted_proxies = TrustedProxies::parse(v).map_err(|_| {
            ConfigError::new(
            "SECKILL_GATEWAY_TRUSTED_PROXIES",
            v,
            "none, or comma-separated IP addresses and CIDR ranges such as 127.0.0.1,10.0.0.0/8",
        )
        })?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_PURCHASES_IN_FLIGHT") {
        s.purchases_in_flight = parse_int(
            "SECKILL_GATEWAY_PURCHASES_IN_FLIGHT",
            v,
            1,
            1_000_000,
            INT_1_1M,
        )?;
    }
    Ok(())
}

/// `SECKILL_GATEWAY_BUYER_*`, `SECKILL_GATEWAY_ADDRESS_*`,
/// `SECKILL_GATEWAY_LIMIT_SLOTS`.
fn read_limits(l: &mut LimitSettings, env: &Env) -> Result<(), ConfigError> {
    let get = |name: &str| env.get(name);
    if let Some(v) = get("SECKILL_GATEWAY_BUYER_RATE") {
        l.buyer_rate = parse_u32("SECKILL_GATEWAY_BUYER_RATE", v, 0, 1000, INT_0_1000)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_BUYER_BURST") {
        l.buyer_burst = parse_u32("SECKILL_GATEWAY_BUYER_BURST", v, 1, 1000, INT_1_1000)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_ADDRESS_RATE") {
        l.address_rate = parse_u32("SECKILL_GATEWAY_ADDRESS_RATE", v, 0, 1_000_000, INT_0_1M)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_ADDRESS_BURST") {
        l.address_burst = parse_u32("SECKILL_GATEWAY_ADDRESS_BURST", v, 1, 1_000_000, INT_1_1M)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_LIMIT_SLOTS") {
        l.slots = parse_int("SECKILL_GATEWAY_LIMIT_SLOTS", v, 1024, 1 << 26, INT_SLOTS)?;
    }
    Ok(())
}

/// The buyer identity's gateway-only variables (`SECKILL_AUTH`,
/// `SECKILL_AUTH_KEYS`, `_ISSUER`, `_LEEWAY`, `_CACHE_MAX`).
fn read_auth(i: &mut IdentitySettings, env: &Env) -> Result<(), ConfigError> {
    let get = |name: &str| env.get(name);
    if let Some(v) = get("SECKILL_AUTH") {
        i.mode = match v {
            "jwt" => AuthMode::Jwt,
            "none" => AuthMode::None,
            _ => return Err(ConfigError::new("SECKILL_AUTH", v, "jwt or none")),
        };
    }
    if let Some(v) = get("SECKILL_AUTH_KEYS") {
        i.keys = Some(PathBuf::from(v));
    }
    if let Some(v) = get("SECKILL_AUTH_ISSUER") {
        if v.len() > 512 || !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ConfigError::new(
                "SECKILL_AUTH_ISSUER",
                v,
                "the issuer (iss) tokens carry: 1-512 printable ASCII characters, no spaces",
            ));
        }
        i.issuer = Some(v.to_string());
    }
    if let Some(v) = get("SECKILL_AUTH_LEEWAY") {
        let d = parse_duration_or_zero("SECKILL_AUTH_LEEWAY", v)?;
        if d > Duration::from_secs(300) || d.subsec_nanos() != 0 {
            return Err(ConfigError::new(
                "SECKILL_AUTH_LEEWAY",
                v,
                "whole seconds from 0s to 300s, such as 30s",
            ));
        }
        i.leeway = d;
    }
    if let Some(v) = get("SECKILL_AUTH_CACHE_MAX") {
        i.cache_max = parse_int("SECKILL_AUTH_CACHE_MAX", v, 0, 10_000_000, INT_AUTH_CACHE)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let env = Env::from_pairs(pairs);
        let config = Config::from_vars(&env)?;
        Settings::from_vars(&config, &env)
    }

    #[test]
    fn empty_environment_gives_documented_defaults() {
        let s = settings(&[]).unwrap();
        assert_eq!(s.listen.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(s.redis_threads, 2);
        assert_eq!(s.replicas_ack, 0);
        assert_eq!(s.listen.write_timeout, Duration::from_secs(5));
        assert_eq!(s.listen.send_buffer, 0);
        assert_eq!(s.buyers_max, 1_000_000);
        assert_eq!((s.limits.buyer_rate, s.limits.buyer_burst), (2, 5));
        assert_eq!((s.limits.address_rate, s.limits.address_burst), (50, 100));
        assert_eq!(s.limits.slots, 1 << 20);
        assert_eq!(s.trusted_proxies, TrustedProxies::loopback());
        assert_eq!(s.purchases_in_flight, 1024);
        assert_eq!(s.body_limit, 4096);
        assert_eq!(s.identity.mode, AuthMode::Jwt);
        assert_eq!(s.identity.keys, None);
        assert_eq!(s.identity.audience, "seckill");
        assert_eq!(s.identity.issuer, None);
        assert_eq!(s.identity.leeway, Duration::from_secs(30));
        assert_eq!(s.identity.max_ttl, Duration::from_secs(24 * 3600));
        assert_eq!(s.identity.cache_max, 200_000);
        assert_eq!(s.payments.secret, None);
        assert_eq!(s.payments.tolerance_s, 300);
    }

    #[test]
    fn valid_overrides_are_applied() {
        let s = settings(&[
            ("SECKILL_GATEWAY_REDIS_THREADS", "0"),
            ("SECKILL_REDIS_REPLICAS_ACK", "2"),
            ("SECKILL_GATEWAY_WRITE_TIMEOUT", "30s"),
            ("SECKILL_GATEWAY_SEND_BUFFER", "65536"),
            ("SECKILL_GATEWAY_BUYERS_MAX", "7"),
            ("SECKILL_GATEWAY_BUYER_RATE", "0"),
            ("SECKILL_GATEWAY_BUYER_BURST", "9"),
            ("SECKILL_GATEWAY_ADDRESS_RATE", "7"),
            ("SECKILL_GATEWAY_ADDRESS_BURST", "8"),
            ("SECKILL_GATEWAY_LIMIT_SLOTS", "4096"),
            ("SECKILL_GATEWAY_TRUSTED_PROXIES", "none"),
            ("SECKILL_GATEWAY_PURCHASES_IN_FLIGHT", "3"),
            ("SECKILL_AUTH", "none"),
            ("SECKILL_AUTH_KEYS", "/etc/seckill/keys.jwks"),
            ("SECKILL_AUTH_ISSUER", "https://id.example/"),
            ("SECKILL_AUTH_LEEWAY", "0s"),
            ("SECKILL_AUTH_CACHE_MAX", "0"),
            ("SECKILL_PAYMENT_TOLERANCE", "60s"),
        ])
        .unwrap();
        assert_eq!((s.redis_threads, s.replicas_ack), (0, 2));
        assert_eq!(s.listen.write_timeout, Duration::from_secs(30));
        assert_eq!(s.listen.send_buffer, 65536);
        assert_eq!(s.buyers_max, 7);
        assert_eq!(
            s.limits,
            LimitSettings {
                buyer_rate: 0,
                buyer_burst: 9,
                address_rate: 7,
                address_burst: 8,
                slots: 4096,
            }
        );
        assert!(s.trusted_proxies.ranges().is_empty());
        assert_eq!(s.purchases_in_flight, 3);
        assert_eq!(s.identity.mode, AuthMode::None);
        assert_eq!(
            s.identity.keys,
            Some(PathBuf::from("/etc/seckill/keys.jwks"))
        );
        assert_eq!(s.identity.issuer.as_deref(), Some("https://id.example/"));
        assert_eq!(s.identity.leeway, Duration::ZERO);
        assert_eq!(s.identity.cache_max, 0);
        assert_eq!(s.payments.tolerance_s, 60);
    }

    #[test]
    fn bad_values_name_variable_value_and_expectation() {
        let cases = [
            ("SECKILL_GATEWAY_REDIS_THREADS", "65"),
            ("SECKILL_REDIS_REPLICAS_ACK", "9"),
            ("SECKILL_GATEWAY_WRITE_TIMEOUT", "5"),
            ("SECKILL_GATEWAY_SEND_BUFFER", "16777217"),
            ("SECKILL_GATEWAY_BUYERS_MAX", "-1"),
            ("SECKILL_GATEWAY_BUYER_RATE", "1001"),
            ("SECKILL_GATEWAY_BUYER_BURST", "0"),
            ("SECKILL_GATEWAY_ADDRESS_RATE", "-5"),
            ("SECKILL_GATEWAY_ADDRESS_BURST", "0"),
            ("SECKILL_GATEWAY_LIMIT_SLOTS", "1000"),
            ("SECKILL_GATEWAY_TRUSTED_PROXIES", "10.0.0.0/8,proxy"),
            ("SECKILL_GATEWAY_PURCHASES_IN_FLIGHT", "0"),
            ("SECKILL_AUTH", "JWT"),
            ("SECKILL_AUTH_ISSUER", "a b"),
            ("SECKILL_AUTH_LEEWAY", "10m"),
            ("SECKILL_AUTH_LEEWAY", "1500ms"),
            ("SECKILL_AUTH_CACHE_MAX", "-1"),
            ("SECKILL_PAYMENT_TOLERANCE", "2h"),
        ];
        for (var, val) in cases {
            let err = settings(&[(var, val)]).unwrap_err();
            assert_eq!((err.variable, err.value.as_str()), (var, val));
            let msg = err.to_string();
            assert!(
                msg.starts_with("invalid configuration: ") && msg.contains("expected"),
                "{msg}"
            );
            // The other binaries do not read it: it stops none of them.
            assert!(
                Config::from_vars(&Env::from_pairs(&[(var, val)])).is_ok(),
                "{var}"
            );
        }
    }

    #[test]
    fn a_duration_that_cannot_be_zero_never_suggests_zero() {
        for var in ["SECKILL_GATEWAY_WRITE_TIMEOUT", "SECKILL_PAYMENT_TOLERANCE"] {
            for val in ["5", "abc", "0", "0s", "90d"] {
                let err = settings(&[(var, val)]).unwrap_err();
                assert_eq!(err.variable, var);
                assert_eq!(
                    err.expected,
                    seckill_common::config::DURATION,
                    "{var}={val}: {err}"
                );
            }
        }
    }
}
