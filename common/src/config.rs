//! Owns the configuration's two lower layers and the gateway's settings.
//! The raw environment is an [`Env`] (every `SECKILL_*` variable, as
//! given); each binary resolves from it only what it uses, with the parts
//! every binary shares read once here ([`Services`]: the Redis and MySQL
//! URLs and timeouts) and the parsers every part uses (a variable, its
//! value and what would have been accepted, as a [`ConfigError`]). The
//! worker's settings are `worker/src/config.rs`, the reconciler's
//! `reconciler/src/config.rs`, the gateway's own `gateway/src/config.rs`;
//! [`Config`] holds the gateway's settings that the tests and the
//! reconciler read too (listen address, threads, body limit, the tokens'
//! audience and lifetime, the payment secret). A bad value of one binary's
//! variable stops only the binaries that read it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// The gateway's settings that the tests and the reconciler read too, from
/// `SECKILL_*` variables: the shared [`Services`] and its own shared part
/// (the rest is `gateway/src/config.rs`).
///
/// All defaults live in [`Config::default`]. Each timeout is its own field;
/// durations are written in the environment with a unit (`500ms`, `60s`,
/// `24h`), parsed by `humantime`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `SECKILL_REDIS_URL`: where the hot stock, flow records and queues
    /// live: one Redis (`redis://host:port/db`) or a Redis Cluster named by
    /// seed nodes (`redis+cluster://host:port,host:port/`, see
    /// [`parse_redis_target`]).
    pub redis_url: String,
    /// `SECKILL_MYSQL_URL`: the system of record (sales, orders, stock ledger).
    /// The path names the database; `migrate` creates it when missing.
    pub mysql_url: String,
    /// `SECKILL_LISTEN`: the gateway's HTTP listen address.
    pub listen: SocketAddr,
    /// `SECKILL_GATEWAY_THREADS`: the gateway's Redis connections for the
    /// reading routes (and for purchases without group commit), shared by
    /// the connection threads; `0` means 16 per core (with 4 links on 2
    /// cores, 1,500 connections reading at once got 503s after waiting 1 s
    /// for a link; with 32, none). (Each HTTP connection has a thread of
    /// its own.)
    pub gateway_threads: usize,
    /// `SECKILL_BODY_LIMIT`: largest accepted request body, in bytes
    /// (default 4096, per the gateway issue). Larger bodies get 413.
    pub body_limit_bytes: usize,
    /// `SECKILL_GATEWAY_ADDRESS_RATE`: requests per second from one client
    /// address (an IPv6 client: its /64), every route but `/healthz`,
    /// `SECKILL_REDIS_TIMEOUT`: connect, read and write timeout of
    /// non-blocking Redis calls (gateway, reconciler, worker bookkeeping).
    pub redis_timeout: Duration,
    /// `SECKILL_MYSQL_TIMEOUT`: connect, read and write timeout of MySQL
    /// connections.
    pub mysql_timeout: Duration,
    /// `SECKILL_AUTH_AUDIENCE`: the `aud` every token must carry (default
    /// `seckill`).
    pub auth_audience: String,
    /// `SECKILL_AUTH_ISSUER`: when set, the `iss` every token must carry,
    /// `SECKILL_AUTH_LEEWAY`: clock skew allowed on `exp`, `nbf` and `iat`,
    /// `SECKILL_AUTH_MAX_TTL`: longest token lifetime accepted, `exp - iat`
    /// (`exp - now` when the token has no `iat`, plus the leeway for the
    /// clock skew), whole seconds (1 s-30 days; default 24h): a longer one
    /// is refused `invalid_token`, so a leaked token, or one a login service
    /// minted by mistake for a year, is worth a day at most (RFC 8725 3.10
    /// asks verifiers to bound what they accept; docs/IDENTITY.md).
    pub auth_max_ttl: Duration,
    /// `SECKILL_PAYMENT_SECRET`: the secret shared with the payment service,
    /// with which it signs `POST /v1/payments` (`payment.rs`; at least 16
    /// bytes). Unset: the gateway answers that route 503
    /// `payments_not_configured`.
    pub payment_secret: Option<Secret>,
}

/// A secret value: compared and used as bytes, never printed (`Debug`
/// shows its length only).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            redis_url: "redis://127.0.0.1:6379/".to_string(),
            mysql_url: "mysql://root@127.0.0.1:3306/seckill".to_string(),
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            gateway_threads: 0,
            body_limit_bytes: 4096,
            redis_timeout: Duration::from_millis(1000),
            mysql_timeout: Duration::from_secs(10),
            auth_audience: "seckill".to_string(),
            auth_max_ttl: Duration::from_secs(24 * 3600),
            payment_secret: None,
        }
    }
}

/// A setting that could not be used; the program stops at start with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    /// The variable, e.g. `SECKILL_WORKER_BATCH`.
    pub variable: &'static str,
    /// The value as given (a URL without its password,
    /// `crate::redact::redacted`).
    pub value: String,
    /// What would have been accepted, e.g. `an integer from 1 to 10000`
    /// (a fixed text, or one naming another setting's value).
    pub expected: Cow<'static, str>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: {}={:?}: expected {}",
            self.variable, self.value, self.expected
        )
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// Variable `variable`'s value `value` (already redacted when it is a
    /// URL) refused; `expected`: what would have been accepted.
    pub fn new(
        variable: &'static str,
        value: impl Into<String>,
        expected: impl Into<Cow<'static, str>>,
    ) -> ConfigError {
        ConfigError {
            variable,
            value: value.into(),
            expected: expected.into(),
        }
    }
}

/// The raw environment: every `SECKILL_*` variable as given, the lowest
/// layer each binary's settings are resolved from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env(HashMap<String, String>);

impl Env {
    /// The process environment's `SECKILL_*` variables (a value that is not
    /// valid Unicode is kept lossily, and refused by its parser).
    pub fn from_env() -> Env {
        let mut map = HashMap::new();
        for (k, v) in std::env::vars_os() {
            let Some(k) = k.to_str() else { continue };
            if !k.starts_with("SECKILL_") {
                continue;
            }
            map.insert(k.to_string(), v.to_string_lossy().into_owned());
        }
        Env(map)
    }

    /// The variables of `vars` (variable name to value): for tests and for
    /// an environment file read as text.
    pub fn from_map(vars: &HashMap<String, String>) -> Env {
        Env(vars.clone())
    }

    /// An environment of `pairs` (name, value), as tests and tools write one.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Env {
        Env(pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// Variable `name`'s trimmed value; `None` when unset or blank (a
    /// blank value keeps the default).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
    }
}

/// What every binary reads: where Redis and MySQL are, and their timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Services {
    /// `SECKILL_REDIS_URL`: where the hot stock, flow records and queues
    /// live: one Redis (`redis://host:port/db`) or a Redis Cluster named by
    /// seed nodes (`redis+cluster://host:port,host:port/`, see
    /// [`parse_redis_target`]).
    pub redis_url: String,
    /// `SECKILL_MYSQL_URL`: the system of record (sales, orders, stock ledger).
    /// The path names the database; `migrate` creates it when missing.
    pub mysql_url: String,
    /// `SECKILL_REDIS_TIMEOUT`: connect, read and write timeout of
    /// non-blocking Redis calls (gateway, reconciler, worker bookkeeping).
    pub redis_timeout: Duration,
    /// `SECKILL_MYSQL_TIMEOUT`: connect, read and write timeout of MySQL
    /// connections.
    pub mysql_timeout: Duration,
}

impl Default for Services {
    fn default() -> Self {
        Services {
            redis_url: "redis://127.0.0.1:6379/".to_string(),
            mysql_url: "mysql://root@127.0.0.1:3306/seckill".to_string(),
            redis_timeout: Duration::from_millis(1000),
            mysql_timeout: Duration::from_secs(10),
        }
    }
}

impl Services {
    /// The shared settings of `env`; missing or blank variables keep their
    /// default.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_env(env: &Env) -> Result<Services, ConfigError> {
        let mut s = Services::default();
        if let Some(v) = env.get("SECKILL_REDIS_URL") {
            parse_redis_target(v)?;
            s.redis_url = v.to_string();
        }
        if let Some(v) = env.get("SECKILL_MYSQL_URL") {
            s.mysql_url = parse_url("SECKILL_MYSQL_URL", v, &["mysql://"])?;
        }
        if let Some(v) = env.get("SECKILL_REDIS_TIMEOUT") {
            s.redis_timeout = parse_duration("SECKILL_REDIS_TIMEOUT", v)?;
        }
        if let Some(v) = env.get("SECKILL_MYSQL_TIMEOUT") {
            s.mysql_timeout = parse_duration("SECKILL_MYSQL_TIMEOUT", v)?;
        }
        Ok(s)
    }
}

impl Config {
    /// Reads the process environment and parses it with [`Config::from_map`].
    ///
    /// Variables that are not valid Unicode are reported as invalid values.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_vars(&Env::from_env())
    }

    /// Parses settings from a map of variable name to value; missing or empty
    /// variables keep their default. Pure: touches neither the environment
    /// nor the network.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_map(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        Config::from_vars(&Env::from_map(vars))
    }

    /// The gateway's settings of `env`.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_vars(env: &Env) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let services = Services::from_env(env)?;
        c.redis_url = services.redis_url;
        c.mysql_url = services.mysql_url;
        c.redis_timeout = services.redis_timeout;
        c.mysql_timeout = services.mysql_timeout;
        let get = |name: &str| env.get(name);
        read_gateway(&mut c, &get)?;
        read_auth(&mut c, &get)?;
        read_payments(&mut c, &get)?;
        Ok(c)
    }

    /// The gateway's Redis connections for reads: the configured number,
    /// or 16 per available core when it is `0`.
    pub fn effective_gateway_threads(&self) -> usize {
        if self.gateway_threads > 0 {
            return self.gateway_threads;
        }
        std::thread::available_parallelism()
            .map(|n| n.get() * 16)
            .unwrap_or(32)
    }
}

/// A variable's trimmed value; `None` when unset or blank.
type Get<'a> = dyn Fn(&str) -> Option<&'a str> + 'a;

/// The gateway's variables (`SECKILL_LISTEN`, `SECKILL_BODY_LIMIT`, `SECKILL_GATEWAY_*`).
fn read_gateway(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_LISTEN") {
        c.listen = parse_addr("SECKILL_LISTEN", v)?;
    }
    if let Some(v) = get("SECKILL_GATEWAY_THREADS") {
        c.gateway_threads = parse_int("SECKILL_GATEWAY_THREADS", v, 0, 1024, INT_0_1024)?;
    }
    if let Some(v) = get("SECKILL_BODY_LIMIT") {
        c.body_limit_bytes = parse_int("SECKILL_BODY_LIMIT", v, 64, 1 << 20, INT_BODY)?;
    }
    Ok(())
}

/// The payment webhook's variables (`SECKILL_PAYMENT_*`).
fn read_payments(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_PAYMENT_SECRET") {
        if v.len() < 16 {
            return Err(ConfigError {
                variable: "SECKILL_PAYMENT_SECRET",
                value: format!("({} bytes)", v.len()),
                expected: "a secret of at least 16 bytes".into(),
            });
        }
        c.payment_secret = Some(Secret(v.as_bytes().to_vec()));
    }
    Ok(())
}

/// The buyer identity's variables (`SECKILL_AUTH*`).
fn read_auth(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_AUTH_AUDIENCE") {
        c.auth_audience = parse_audience(v)?;
    }
    if let Some(v) = get("SECKILL_AUTH_MAX_TTL") {
        c.auth_max_ttl = parse_max_ttl(v)?;
    }
    Ok(())
}

/// `SECKILL_AUTH_AUDIENCE`: the `aud` of every token (the gateway checks
/// it, the reconciler's `token issue` writes it).
///
/// Errors: a value outside the id rule (`crate::TOKEN_RULE`).
pub fn parse_audience(v: &str) -> Result<String, ConfigError> {
    if !crate::is_valid_token(v) {
        return Err(ConfigError {
            variable: "SECKILL_AUTH_AUDIENCE",
            value: v.to_string(),
            expected: crate::TOKEN_RULE.into(),
        });
    }
    Ok(v.to_string())
}

/// `SECKILL_AUTH_MAX_TTL`: the longest token lifetime the gateway accepts
/// (and `token issue` warns beyond), whole seconds from 1 s to 30 days.
///
/// Errors: one message for every way to miss (zero, a fraction of a
/// second, beyond 30 days, not a duration).
pub fn parse_max_ttl(v: &str) -> Result<Duration, ConfigError> {
    let err = || ConfigError {
        variable: "SECKILL_AUTH_MAX_TTL",
        value: v.to_string(),
        expected: MAX_TTL.into(),
    };
    let d = parse_duration_or_zero("SECKILL_AUTH_MAX_TTL", v).map_err(|_| err())?;
    if d.is_zero() || d.subsec_nanos() != 0 {
        return Err(err());
    }
    Ok(d)
}

const INT_0_1024: &str = "an integer from 0 (auto) to 1024";
const INT_BODY: &str = "a byte count from 64 to 1048576";
/// What a duration that cannot be zero takes ([`parse_duration`]).
pub const DURATION: &str =
    "a duration with a unit between 1ms and 30 days, such as 500ms, 60s or 24h";
/// What a duration that may be zero takes ([`parse_duration_or_zero`]).
pub const DURATION_OR_ZERO: &str =
    "0, or a duration with a unit such as 500ms, 60s, 2m (at most 30 days)";

/// What `SECKILL_AUTH_MAX_TTL` takes.
const MAX_TTL: &str = "whole seconds from 1s to 30 days, such as 24h";

/// `d` as an operator writes it: `24h`, `90m`, `45s`, `1500ms`.
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// How a Redis URL is written, as a refusal shows it: the form, then an
/// example.
const REDIS_FORM: &str = "redis://[:password@]host:port[/db], such as redis://127.0.0.1:6379/";

/// How a MySQL URL is written, as a refusal shows it (several servers:
/// `host:port,host:port`, `mysql_writable.rs`).
const MYSQL_FORM: &str = "mysql://user[:password]@host:port[,host:port...]/database, such as \
                          mysql://app:password@127.0.0.1:3306/seckill";

/// Variable `variable`'s URL `v`, kept as given, when it starts with one
/// of `schemes` and its client (`redis`, `mysql`) can read it: a URL it
/// cannot read is refused at start, naming its variable, rather than at
/// the first connect.
///
/// Errors: any other value (shown without its password); the refusal ends
/// in the form to write ([`REDIS_FORM`], [`MYSQL_FORM`]).
pub fn parse_url(variable: &'static str, v: &str, schemes: &[&str]) -> Result<String, ConfigError> {
    let (client, form) = if schemes[0] == "redis://" {
        ("Redis", REDIS_FORM)
    } else {
        ("MySQL", MYSQL_FORM)
    };
    let refuse = |expected: String| ConfigError {
        variable,
        value: crate::redact::redacted(v),
        expected: expected.into(),
    };
    if !(schemes.iter().any(|s| v.starts_with(s)) && v.len() > 8) {
        return Err(refuse(format!("a URL written as {form}")));
    }
    let refuse_unreadable = |why: String| refuse(unreadable(client, form, v, &why));
    if client == "Redis" {
        // The client's text without its error kind (`Redis URL did not
        // parse - InvalidClientConfig`): the kind says nothing to fix.
        redis::IntoConnectionInfo::into_connection_info(v).map_err(|e| {
            refuse_unreadable(e.to_string().replacen(&format!(" - {:?}", e.kind()), "", 1))
        })?;
    } else {
        let each = crate::mysql_writable::servers(v).unwrap_or_else(|| vec![v.to_string()]);
        for one in each {
            let opts = mysql::Opts::from_url(&one).map_err(|e| refuse_unreadable(e.to_string()))?;
            // Without a database every query fails (ERROR 1046, no
            // database selected), which waiting does not fix.
            if opts.get_db_name().is_none_or(str::is_empty) {
                return Err(refuse(format!(
                    "a URL naming its database; write the database name: \
                     mysql://user[:password]@host:port/DATABASE, such as {}",
                    "mysql://app:password@127.0.0.1:3306/seckill"
                )));
            }
        }
    }
    Ok(v.to_string())
}

/// What a refusal of URL `v` that its `client` cannot read expects: the
/// client's reason `why` in brackets (left out when it holds the URL's
/// password), then the `form` to write it in, last, where the operator
/// reads the remedy.
fn unreadable(client: &str, form: &str, v: &str, why: &str) -> String {
    let shows_password = crate::redact::password(v).is_some_and(|p| why.contains(p));
    let cause = if shows_password {
        String::new()
    } else {
        format!(" ({why})")
    };
    format!("a URL the {client} client can read{cause}; write it as {form}")
}

/// Where the Redis data lives, as `SECKILL_REDIS_URL` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis: the URL as given (`redis://[user:pass@]host:port[/db]`).
    Single(String),
    /// A Redis Cluster: one `redis://host:port/` URL per seed node, in the
    /// order given. Any reachable seed yields the whole slot map.
    Cluster(Vec<String>),
    /// One Redis whose master Redis Sentinel elects: the Sentinels
    /// (`host:port`, asked in the order given) and the master's name.
    Sentinel {
        /// The Sentinels' addresses.
        sentinels: Vec<String>,
        /// The name they monitor the master under.
        master: String,
    },
}

/// The scheme of Sentinels and a master name in `SECKILL_REDIS_URL`.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The scheme of a cluster's seed list in `SECKILL_REDIS_URL`.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// Parses `SECKILL_REDIS_URL`: `redis://…` is one Redis, kept as given;
/// `redis+cluster://host:port[,host:port…][/]` is a cluster's seed nodes
/// (at least one; no user, password or database: a cluster has only
/// database 0); `redis+sentinel://host:port[,host:port…]/NAME` is the
/// Sentinels watching the master named NAME (database 0, no password).
///
/// Errors: [`ConfigError`] naming `SECKILL_REDIS_URL` for any other form,
/// an empty seed, a seed without a numeric port, or a path other than `/`.
pub fn parse_redis_target(v: &str) -> Result<RedisTarget, ConfigError> {
    let bad = || ConfigError {
        variable: "SECKILL_REDIS_URL",
        value: crate::redact::redacted(v),
        expected:
            "a URL such as redis://127.0.0.1:6379/, redis+cluster://10.0.0.1:7000,10.0.0.2:7000/ \
             or redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster"
                .into(),
    };
    if let Some(rest) = v.strip_prefix(SENTINEL_SCHEME) {
        let (nodes, master) = rest.split_once('/').ok_or_else(bad)?;
        let master_ok = !master.is_empty()
            && master
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !master_ok {
            return Err(bad());
        }
        let sentinels = host_ports(nodes).ok_or_else(bad)?;
        return Ok(RedisTarget::Sentinel {
            sentinels,
            master: master.to_string(),
        });
    }
    let Some(rest) = v.strip_prefix(CLUSTER_SCHEME) else {
        return parse_url("SECKILL_REDIS_URL", v, &["redis://"]).map(RedisTarget::Single);
    };
    let nodes = rest.strip_suffix('/').unwrap_or(rest);
    let seeds = host_ports(nodes).ok_or_else(bad)?;
    Ok(RedisTarget::Cluster(
        seeds.iter().map(|n| format!("redis://{n}/")).collect(),
    ))
}

/// `host:port,host:port…` split and checked (a host of letters, digits
/// and `.-[]:`, a port 1-65535); `None` for anything else.
fn host_ports(nodes: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for node in nodes.split(',') {
        let (host, port) = node.rsplit_once(':')?;
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-[]:".contains(c));
        if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
            return None;
        }
        out.push(format!("{host}:{port}"));
    }
    Some(out)
}

/// Variable `variable`'s socket address (`127.0.0.1:8080`).
///
/// Errors: anything else.
pub fn parse_addr(variable: &'static str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|_| ConfigError {
        variable,
        value: v.to_string(),
        expected: "an IP address and port such as 127.0.0.1:8080".into(),
    })
}

/// Variable `variable`'s integer from `min` to `max`; `expected` says so
/// in the refusal.
///
/// Errors: anything else.
pub fn parse_int(
    variable: &'static str,
    v: &str,
    min: usize,
    max: usize,
    expected: &'static str,
) -> Result<usize, ConfigError> {
    match v.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError {
            variable,
            value: v.to_string(),
            expected: expected.into(),
        }),
    }
}

/// A duration above zero; every refusal names [`DURATION`] (never "0, or
/// ...": zero is refused here).
pub fn parse_duration(variable: &'static str, v: &str) -> Result<Duration, ConfigError> {
    match parse_duration_or_zero(variable, v) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(ConfigError {
            variable,
            value: v.to_string(),
            expected: DURATION.into(),
        }),
    }
}

/// Variable `variable`'s duration with a unit, 0 allowed, at most 30 days
/// (a bare number is refused: `60` could mean seconds or ms).
///
/// Errors: anything else, naming [`DURATION_OR_ZERO`].
pub fn parse_duration_or_zero(variable: &'static str, v: &str) -> Result<Duration, ConfigError> {
    let err = || ConfigError {
        variable,
        value: v.to_string(),
        expected: DURATION_OR_ZERO.into(),
    };
    // A bare number is refused on purpose: "60" could mean seconds or ms.
    if v.chars().all(|c| c.is_ascii_digit()) && v != "0" {
        return Err(err());
    }
    let d = humantime::parse_duration(v).map_err(|_| err())?;
    if d > Duration::from_secs(30 * 24 * 3600) {
        return Err(err());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        Env::from_pairs(pairs).0
    }

    #[test]
    fn empty_environment_gives_documented_defaults() {
        let c = Config::from_map(&HashMap::new()).unwrap();
        assert_eq!(c.redis_url, "redis://127.0.0.1:6379/");
        assert_eq!(c.mysql_url, "mysql://root@127.0.0.1:3306/seckill");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.body_limit_bytes, 4096);
        assert_eq!(c.gateway_threads, 0);
        assert_eq!(c.redis_timeout, Duration::from_millis(1000));
        assert_eq!(c.mysql_timeout, Duration::from_secs(10));
        assert_eq!(c.auth_audience, "seckill");
        assert_eq!(c.auth_max_ttl, Duration::from_secs(24 * 3600));
        assert_eq!(c.payment_secret, None);
    }

    #[test]
    fn valid_overrides_are_applied() {
        let c = Config::from_map(&map(&[
            ("SECKILL_REDIS_URL", "redis://10.0.0.1:7000/2"),
            ("SECKILL_MYSQL_URL", "mysql://app:pw@db:3306/shop"),
            ("SECKILL_LISTEN", "0.0.0.0:9000"),
            ("SECKILL_GATEWAY_THREADS", "16"),
            ("SECKILL_BODY_LIMIT", "8192"),
            ("SECKILL_REDIS_TIMEOUT", "250ms"),
            ("SECKILL_MYSQL_TIMEOUT", "3s"),
            ("SECKILL_AUTH_AUDIENCE", "shop-7"),
            ("SECKILL_AUTH_MAX_TTL", "2h"),
            ("SECKILL_PAYMENT_SECRET", "0123456789abcdef"),
        ]))
        .unwrap();
        assert_eq!(c.payment_secret, Some(Secret(b"0123456789abcdef".to_vec())));
        assert_eq!(format!("{:?}", c.payment_secret), "Some(Secret(16 bytes))");
        let short = Config::from_map(&map(&[("SECKILL_PAYMENT_SECRET", "short")]));
        assert_eq!(short.unwrap_err().variable, "SECKILL_PAYMENT_SECRET");
        assert_eq!(c.auth_audience, "shop-7");
        assert_eq!(c.auth_max_ttl, Duration::from_secs(7200));
        assert_eq!(c.redis_url, "redis://10.0.0.1:7000/2");
        assert_eq!(c.mysql_url, "mysql://app:pw@db:3306/shop");
        assert_eq!(c.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(c.gateway_threads, 16);
        assert_eq!(c.effective_gateway_threads(), 16);
        assert_eq!(c.body_limit_bytes, 8192);
        assert_eq!(c.redis_timeout, Duration::from_millis(250));
        assert_eq!(c.mysql_timeout, Duration::from_secs(3));
    }

    #[test]
    fn bad_values_name_variable_value_and_expectation() {
        let cases = [
            ("SECKILL_REDIS_URL", "localhost:6379"),
            ("SECKILL_MYSQL_URL", "postgres://x"),
            ("SECKILL_LISTEN", "8080"),
            ("SECKILL_GATEWAY_THREADS", "-1"),
            ("SECKILL_BODY_LIMIT", "10"),
            ("SECKILL_REDIS_TIMEOUT", "500"),
            ("SECKILL_MYSQL_TIMEOUT", "0s"),
            ("SECKILL_AUTH_AUDIENCE", "a b"),
            ("SECKILL_AUTH_MAX_TTL", "0s"),
            ("SECKILL_AUTH_MAX_TTL", "90d"),
            ("SECKILL_AUTH_MAX_TTL", "1500ms"),
            ("SECKILL_AUTH_MAX_TTL", "abc"),
        ];
        for (var, val) in cases {
            let err = Config::from_map(&map(&[(var, val)])).unwrap_err();
            assert_eq!(err.variable, var);
            assert_eq!(err.value, val);
            let msg = err.to_string();
            assert!(
                msg.contains(var) && msg.contains(val) && msg.contains("expected"),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_duration_is_shown_as_an_operator_writes_it() {
        assert_eq!(short_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(short_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(short_duration(Duration::from_secs(5400)), "90m");
    }

    #[test]
    fn a_sentinel_url_is_its_sentinels_and_a_master_name() {
        assert_eq!(
            parse_redis_target("redis+sentinel://10.0.0.1:26379,s-b:26380/mymaster"),
            Ok(RedisTarget::Sentinel {
                sentinels: vec!["10.0.0.1:26379".into(), "s-b:26380".into()],
                master: "mymaster".into()
            })
        );
        for bad in [
            "redis+sentinel://10.0.0.1:26379",
            "redis+sentinel://10.0.0.1:26379/",
            "redis+sentinel://10.0.0.1/mymaster",
            "redis+sentinel://10.0.0.1:26379/my master",
        ] {
            let e = parse_redis_target(bad).unwrap_err();
            assert_eq!(e.variable, "SECKILL_REDIS_URL", "{bad}");
        }
    }

    #[test]
    fn a_url_that_its_client_cannot_parse_is_refused_naming_its_variable() {
        for (var, bad) in [
            ("SECKILL_REDIS_URL", "redis://[bad"),
            ("SECKILL_REDIS_URL", "redis://127.0.0.1:notaport"),
            ("SECKILL_MYSQL_URL", "mysql://root@127.0.0.1:notaport/x"),
            ("SECKILL_MYSQL_URL", "mysql://root@a:3306,b:bad/x"),
        ] {
            let e = Config::from_map(&map(&[(var, bad)])).unwrap_err();
            assert_eq!(e.variable, var, "{bad}");
            assert!(e.expected.contains("client can read"), "{bad}: {e}");
            assert!(e.expected.ends_with(":3306/seckill") || e.expected.ends_with(":6379/"));
        }
        let e = parse_url(
            "SECKILL_MYSQL_REPLICA_URL",
            "mysql://u:pw@h:x/d",
            &["mysql://"],
        )
        .unwrap_err();
        assert_eq!(e.value, "mysql://u:***@h:x/d");
        for no_database in [
            "mysql://root@127.0.0.1:3306/",
            "mysql://root:pw@127.0.0.1:3306",
        ] {
            let e = Config::from_map(&map(&[("SECKILL_MYSQL_URL", no_database)])).unwrap_err();
            assert_eq!(e.variable, "SECKILL_MYSQL_URL");
            assert!(!e.value.contains("pw"), "{e}");
            assert!(
                e.expected
                    .starts_with("a URL naming its database; write the database name: "),
                "{e}"
            );
            assert!(e.expected.contains("host:port/DATABASE"), "{e}");
        }
        for good in [
            "mysql://root@127.0.0.1:3306/x",
            "mysql://u:p@a:3306,b:3307/x",
        ] {
            assert!(Config::from_map(&map(&[("SECKILL_MYSQL_URL", good)])).is_ok());
        }
    }

    /// A refusal ends in the form to write, after the client's reason; the
    /// value is shown without its password, and so is the reason.
    #[test]
    fn a_refused_url_ends_in_the_form_to_write() {
        let e = Config::from_map(&map(&[(
            "SECKILL_REDIS_URL",
            "redis://:s3cret@127.0.0.1:notaport/0",
        )]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: SECKILL_REDIS_URL=\"redis://:***@127.0.0.1:notaport/0\": \
             expected a URL the Redis client can read (Redis URL did not parse); write it as \
             redis://[:password@]host:port[/db], such as redis://127.0.0.1:6379/"
        );
        let e = Config::from_map(&map(&[(
            "SECKILL_MYSQL_URL",
            "mysql://app:s3cret@db:3306/shop?frobnicate=1",
        )]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: SECKILL_MYSQL_URL=\"mysql://app:***@db:3306/shop?frobnicate=1\": \
             expected a URL the MySQL client can read (Unknown URL parameter `frobnicate'); write it as \
             mysql://user[:password]@host:port[,host:port...]/database, such as \
             mysql://app:password@127.0.0.1:3306/seckill"
        );
        let e = Config::from_map(&map(&[("SECKILL_REDIS_URL", "localhost:6379")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid configuration: SECKILL_REDIS_URL=\"localhost:6379\": expected a URL \
             written as redis://[:password@]host:port[/db], such as redis://127.0.0.1:6379/"
        );
        // A reason that repeats the password is left out.
        assert_eq!(
            unreadable("MySQL", "F", "mysql://u:hunter22@h/d", "bad value hunter22"),
            "a URL the MySQL client can read; write it as F"
        );
        assert_eq!(
            unreadable("MySQL", "F", "mysql://u:hunter22@h/d", "bad port"),
            "a URL the MySQL client can read (bad port); write it as F"
        );
    }

    #[test]
    fn a_redis_url_is_one_redis_and_a_cluster_url_its_seed_nodes() {
        assert_eq!(
            parse_redis_target("redis://10.0.0.1:7000/2"),
            Ok(RedisTarget::Single("redis://10.0.0.1:7000/2".into()))
        );
        assert_eq!(
            parse_redis_target("redis+cluster://10.0.0.1:7000,node-b:7001/"),
            Ok(RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000/".into(),
                "redis://node-b:7001/".into()
            ]))
        );
        assert_eq!(
            parse_redis_target("redis+cluster://127.0.0.1:7000"),
            Ok(RedisTarget::Cluster(vec!["redis://127.0.0.1:7000/".into()]))
        );
        let c =
            Config::from_map(&map(&[("SECKILL_REDIS_URL", "redis+cluster://h:1,h:2")])).unwrap();
        assert_eq!(c.redis_url, "redis+cluster://h:1,h:2");
        for bad in [
            "redis+cluster://",
            "redis+cluster://h:1,,h:2",
            "redis+cluster://h",
            "redis+cluster://h:0",
            "redis+cluster://h:70000",
            "redis+cluster://h:1/3",
            "redis+cluster://user:pw@h:1",
            "cluster://h:1",
        ] {
            let e = parse_redis_target(bad).unwrap_err();
            let shown = crate::redact::redacted(bad);
            assert_eq!(
                (e.variable, e.value.as_str()),
                ("SECKILL_REDIS_URL", &*shown)
            );
        }
        // The refusal never repeats a password.
        let e = parse_redis_target("redis+cluster://user:pw@h:1").unwrap_err();
        assert_eq!(e.value, "redis+cluster://user:***@h:1");
        let e = Config::from_map(&map(&[("SECKILL_MYSQL_URL", "mysq://app:pw@db/x")])).unwrap_err();
        assert_eq!(e.value, "mysq://app:***@db/x");
    }

    /// A variable that refuses zero never suggests it (the gateway's own
    /// timeouts are checked the same way in `gateway/src/config.rs`).
    #[test]
    fn a_duration_that_cannot_be_zero_never_suggests_zero() {
        for var in ["SECKILL_REDIS_TIMEOUT", "SECKILL_MYSQL_TIMEOUT"] {
            for val in ["5", "abc", "0", "0s", "90d"] {
                let err = Config::from_map(&map(&[(var, val)])).unwrap_err();
                assert_eq!(err.variable, var);
                assert_eq!(err.expected, DURATION, "{var}={val}: {err}");
            }
        }
        assert_eq!(
            parse_duration_or_zero("SECKILL_RECONCILE_GRACE", "5")
                .unwrap_err()
                .expected,
            DURATION_OR_ZERO
        );
    }

    #[test]
    fn empty_values_keep_defaults() {
        let c = Config::from_map(&map(&[("SECKILL_BODY_LIMIT", "  ")])).unwrap();
        assert_eq!(c.body_limit_bytes, 4096);
    }

    /// The other binaries' variables are theirs: the shared part never
    /// reads them, so a bad one does not stop the gateway.
    #[test]
    fn the_gateway_reads_neither_the_workers_nor_the_reconcilers_variables() {
        let c = Config::from_map(&map(&[
            ("SECKILL_WORKER_BATCH", "many"),
            ("SECKILL_ARCHIVE_AFTER", "abc"),
            ("SECKILL_MYSQL_REPLICA_URL", "postgres://x"),
        ]))
        .unwrap();
        assert_eq!(c, Config::default());
    }
}
