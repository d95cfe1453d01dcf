//! Owns the process configuration: every `SECKILL_*` environment variable,
//! its default, and the pure parser that turns a map of strings into a
//! typed [`Config`].

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Every setting of every seckill binary, read from `SECKILL_*` variables.
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
    /// `SECKILL_REDIS_TIMEOUT`: connect, read and write timeout of
    /// non-blocking Redis calls (gateway, reconciler, worker bookkeeping).
    pub redis_timeout: Duration,
    /// `SECKILL_MYSQL_TIMEOUT`: connect, read and write timeout of MySQL
    /// connections.
    pub mysql_timeout: Duration,
    /// `SECKILL_MYSQL_REPLICA_URL`: a MariaDB replica of `SECKILL_MYSQL_URL`
    /// (GTID replication) the reconciler's scans and read-only commands
    /// read from; unset: everything reads the primary.
    pub mysql_replica_url: Option<String>,
    /// `SECKILL_MYSQL_REPLICA_WAIT`: how long a reconciler run waits for the
    /// replica to reach the primary's position before it reads the primary
    /// instead. Default 5s.
    pub mysql_replica_wait: Duration,
    /// `SECKILL_REVIEW_DB`: path of the reconciler's SQLite review file.
    pub review_db: PathBuf,
    /// `SECKILL_WORKER_ID`: this worker's stable id (the systemd template
    /// instance name); it names the worker's processing lists and heartbeat.
    /// 1-64 characters of `A-Z a-z 0-9 _ . -`.
    pub worker_id: String,
    /// `SECKILL_WORKER_BATCH`: most order messages applied in one MySQL
    /// transaction (1-10,000; default 256, per the worker issue).
    pub worker_batch: usize,
    /// `SECKILL_WORKER_MAX_ATTEMPTS`: failed applications of one message
    /// before it goes to the dead-letter list (default 5).
    pub worker_max_attempts: u32,
    /// `SECKILL_WORKER_BLOCK`: how long one blocking `BLMOVE` waits on the
    /// server for a message. The client read timeout is this plus
    /// [`Config::redis_timeout`], so the client never gives up first.
    pub worker_block: Duration,
    /// `SECKILL_WORKER_HEARTBEAT_TTL`: lifetime of a worker's heartbeat key;
    /// after it expires other workers reclaim its processing lists.
    pub worker_heartbeat_ttl: Duration,
    /// `SECKILL_WORKER_METRICS_LISTEN`: the worker's `/metrics` listener.
    pub worker_metrics_listen: SocketAddr,
    /// `SECKILL_WORKER_EXPIRY_EVERY`: pause between two passes of the
    /// worker's expiry sweep (`worker/src/expiry.rs`) when the last pass
    /// found nothing to do (default 200ms: a unit is back on sale within
    /// about that after its deadline).
    pub worker_expiry_every: Duration,
    /// `SECKILL_RECONCILE_LOOKBACK`: sales that ended longer ago than this are
    /// no longer reconciled (default 24h).
    pub reconcile_lookback: Duration,
    /// `SECKILL_ARCHIVE_AFTER`: `run` archives a sale (removes its Redis
    /// keys, `seckill-reconciler sale archive`) once it ended this long ago
    /// and the run found it clean (default 1h; `0`: as soon as the
    /// archive's own minimum of one minute allows; `off`: never, only by
    /// hand). Keep it below `SECKILL_RECONCILE_LOOKBACK`: a sale ended
    /// longer ago is no longer checked, so no longer archived by `run`.
    pub archive_after: Option<Duration>,
    /// `SECKILL_RECONCILE_GRACE`: reservations younger than this are skipped,
    /// so messages still on their way are not reported (default 60s).
    pub reconcile_grace: Duration,
    /// `SECKILL_RECONCILER_METRICS_FILE`: where `run` writes its metrics in
    /// the Prometheus text format after each run, for node_exporter's
    /// textfile collector (`reconciler/src/metrics_file.rs`; default none:
    /// no file; an empty value means none too).
    pub reconciler_metrics_file: Option<PathBuf>,
    /// `SECKILL_AUTH_AUDIENCE`: the `aud` every token must carry (default
    /// `seckill`).
    pub auth_audience: String,
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
            mysql_replica_url: None,
            mysql_replica_wait: Duration::from_secs(5),
            review_db: PathBuf::from("./seckill-review.sqlite3"),
            worker_id: "worker-1".to_string(),
            worker_batch: 256,
            worker_max_attempts: 5,
            worker_block: Duration::from_secs(1),
            worker_heartbeat_ttl: Duration::from_secs(15),
            worker_metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9101)),
            worker_expiry_every: Duration::from_millis(200),
            reconcile_lookback: Duration::from_secs(24 * 3600),
            archive_after: Some(Duration::from_secs(3600)),
            reconcile_grace: Duration::from_secs(60),
            reconciler_metrics_file: None,
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
    /// What would have been accepted, e.g. `an integer from 1 to 10000`.
    pub expected: &'static str,
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
    /// A refusal of `value` for `variable`, which takes `expected` (for a
    /// binary that reads variables of its own).
    pub fn new(variable: &'static str, value: &str, expected: &'static str) -> ConfigError {
        ConfigError {
            variable,
            value: value.to_string(),
            expected,
        }
    }
}

impl Config {
    /// Reads the process environment and parses it with [`Config::from_map`].
    ///
    /// Variables that are not valid Unicode are reported as invalid values.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_map(&env_vars())
    }

    /// Parses settings from a map of variable name to value; missing or empty
    /// variables keep their default. Pure: touches neither the environment
    /// nor the network.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_map(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let get = |name: &str| get(vars, name);
        read_services(&mut c, &get)?;
        read_gateway(&mut c, &get)?;
        read_worker(&mut c, &get)?;
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

/// The process's `SECKILL_*` variables (a value that is not valid
/// Unicode is read lossily, then refused as invalid by its parser).
pub fn env_vars() -> HashMap<String, String> {
    let mut map = HashMap::new();
    for (k, v) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if !k.starts_with("SECKILL_") {
            continue;
        }
        map.insert(k.to_string(), v.to_string_lossy().into_owned());
    }
    map
}

/// A variable's trimmed value in `vars`; `None` when unset or blank.
pub fn get<'a>(vars: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    vars.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// A variable's trimmed value; `None` when unset or blank.
type Get<'a> = dyn Fn(&str) -> Option<&'a str> + 'a;

/// The URLs, timeouts and paths every binary reads.
fn read_services(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_REDIS_URL") {
        parse_redis_target(v)?;
        c.redis_url = v.to_string();
    }
    if let Some(v) = get("SECKILL_MYSQL_URL") {
        c.mysql_url = parse_url("SECKILL_MYSQL_URL", v, &["mysql://"])?;
    }
    if let Some(v) = get("SECKILL_REDIS_TIMEOUT") {
        c.redis_timeout = parse_duration("SECKILL_REDIS_TIMEOUT", v)?;
    }
    if let Some(v) = get("SECKILL_MYSQL_TIMEOUT") {
        c.mysql_timeout = parse_duration("SECKILL_MYSQL_TIMEOUT", v)?;
    }
    if let Some(v) = get("SECKILL_MYSQL_REPLICA_URL") {
        c.mysql_replica_url = Some(parse_url("SECKILL_MYSQL_REPLICA_URL", v, &["mysql://"])?);
    }
    if let Some(v) = get("SECKILL_MYSQL_REPLICA_WAIT") {
        c.mysql_replica_wait = parse_duration("SECKILL_MYSQL_REPLICA_WAIT", v)?;
    }
    if let Some(v) = get("SECKILL_REVIEW_DB") {
        c.review_db = PathBuf::from(v);
    }
    Ok(())
}

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

/// The worker's and the reconciler's variables (`SECKILL_WORKER_*`, `SECKILL_RECONCILE_*`).
fn read_worker(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_WORKER_ID") {
        if !crate::is_valid_token(v) {
            return Err(ConfigError {
                variable: "SECKILL_WORKER_ID",
                value: v.to_string(),
                expected: crate::TOKEN_RULE,
            });
        }
        c.worker_id = v.to_string();
    }
    if let Some(v) = get("SECKILL_WORKER_BATCH") {
        c.worker_batch = parse_int("SECKILL_WORKER_BATCH", v, 1, 10_000, INT_BATCH)?;
    }
    if let Some(v) = get("SECKILL_WORKER_MAX_ATTEMPTS") {
        c.worker_max_attempts =
            parse_int("SECKILL_WORKER_MAX_ATTEMPTS", v, 1, 1000, INT_ATTEMPTS)? as u32;
    }
    if let Some(v) = get("SECKILL_WORKER_BLOCK") {
        c.worker_block = parse_duration("SECKILL_WORKER_BLOCK", v)?;
    }
    if let Some(v) = get("SECKILL_WORKER_HEARTBEAT_TTL") {
        c.worker_heartbeat_ttl = parse_duration("SECKILL_WORKER_HEARTBEAT_TTL", v)?;
    }
    if let Some(v) = get("SECKILL_WORKER_METRICS_LISTEN") {
        c.worker_metrics_listen = parse_addr("SECKILL_WORKER_METRICS_LISTEN", v)?;
    }
    if let Some(v) = get("SECKILL_WORKER_EXPIRY_EVERY") {
        c.worker_expiry_every = parse_duration("SECKILL_WORKER_EXPIRY_EVERY", v)?;
    }
    if let Some(v) = get("SECKILL_RECONCILE_LOOKBACK") {
        c.reconcile_lookback = parse_duration("SECKILL_RECONCILE_LOOKBACK", v)?;
    }
    if let Some(v) = get("SECKILL_ARCHIVE_AFTER") {
        let err = || ConfigError {
            variable: "SECKILL_ARCHIVE_AFTER",
            value: v.to_string(),
            expected: ARCHIVE_AFTER,
        };
        c.archive_after = match v {
            "off" => None,
            v => Some(parse_duration_or_zero("SECKILL_ARCHIVE_AFTER", v).map_err(|_| err())?),
        };
        // A sale ended longer ago than the lookback is no longer checked,
        // so it would never be archived.
        if c.archive_after.is_some_and(|a| a >= c.reconcile_lookback) {
            // The lookback's value, so the operator sees which bound to
            // meet. `expected` is a `&'static str` for the fixed texts of
            // every other variable; this one error ends the process, so the
            // few bytes are leaked once.
            let expected = format!(
                "a duration such as 1h, below SECKILL_RECONCILE_LOOKBACK ({}), 0, or off",
                short_duration(c.reconcile_lookback)
            );
            return Err(ConfigError {
                expected: Box::leak(expected.into_boxed_str()),
                ..err()
            });
        }
    }
    if let Some(v) = get("SECKILL_RECONCILE_GRACE") {
        c.reconcile_grace = parse_duration_or_zero("SECKILL_RECONCILE_GRACE", v)?;
    }
    if let Some(v) = get("SECKILL_RECONCILER_METRICS_FILE") {
        c.reconciler_metrics_file = (!v.is_empty()).then(|| PathBuf::from(v));
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
                expected: "a secret of at least 16 bytes",
            });
        }
        c.payment_secret = Some(Secret(v.as_bytes().to_vec()));
    }
    Ok(())
}

/// The buyer identity's variables (`SECKILL_AUTH*`).
fn read_auth(c: &mut Config, get: &Get<'_>) -> Result<(), ConfigError> {
    if let Some(v) = get("SECKILL_AUTH_AUDIENCE") {
        if !crate::is_valid_token(v) {
            return Err(ConfigError {
                variable: "SECKILL_AUTH_AUDIENCE",
                value: v.to_string(),
                expected: crate::TOKEN_RULE,
            });
        }
        c.auth_audience = v.to_string();
    }
    if let Some(v) = get("SECKILL_AUTH_MAX_TTL") {
        // One message for every way to miss (0, 500ms and 31d): the
        // operator learns the whole rule at once.
        let err = || ConfigError {
            variable: "SECKILL_AUTH_MAX_TTL",
            value: v.to_string(),
            expected: MAX_TTL,
        };
        let d = parse_duration_or_zero("SECKILL_AUTH_MAX_TTL", v).map_err(|_| err())?;
        if d.is_zero() || d.subsec_nanos() != 0 {
            return Err(err());
        }
        c.auth_max_ttl = d;
    }
    Ok(())
}

const INT_0_1024: &str = "an integer from 0 (auto) to 1024";
const INT_BODY: &str = "a byte count from 64 to 1048576";
const INT_BATCH: &str = "an integer from 1 to 10000";
const INT_ATTEMPTS: &str = "an integer from 1 to 1000";
/// What a duration above zero takes.
pub const DURATION: &str =
    "a duration with a unit between 1ms and 30 days, such as 500ms, 60s or 24h";
/// What a duration that may be zero takes.
pub const DURATION_OR_ZERO: &str =
    "0, or a duration with a unit such as 500ms, 60s, 2m (at most 30 days)";

/// What `SECKILL_AUTH_MAX_TTL` takes.
const MAX_TTL: &str = "whole seconds from 1s to 30 days, such as 24h";

/// What `SECKILL_ARCHIVE_AFTER` takes.
const ARCHIVE_AFTER: &str = "a duration such as 1h, below SECKILL_RECONCILE_LOOKBACK, 0, or off";

/// `d` as an operator writes it: `24h`, `90m`, `45s`, `1500ms`.
fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

fn parse_url(variable: &'static str, v: &str, schemes: &[&str]) -> Result<String, ConfigError> {
    if schemes.iter().any(|s| v.starts_with(s)) && v.len() > 8 {
        Ok(v.to_string())
    } else {
        Err(ConfigError {
            variable,
            value: crate::redact::redacted(v),
            expected: if schemes[0] == "redis://" {
                "a URL such as redis://127.0.0.1:6379/"
            } else {
                "a URL such as mysql://user:password@127.0.0.1:3306/seckill"
            },
        })
    }
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
             or redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
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

fn parse_addr(variable: &'static str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|_| ConfigError {
        variable,
        value: v.to_string(),
        expected: "an IP address and port such as 127.0.0.1:8080",
    })
}

/// An integer from `min` to `max` in `variable`'s value `v`.
///
/// Errors: [`ConfigError`] with `expected`.
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
            expected,
        }),
    }
}

/// A duration above zero; every refusal names [`DURATION`] (never "0, or
/// ...": zero is refused here).
///
/// Errors: [`ConfigError`].
pub fn parse_duration(variable: &'static str, v: &str) -> Result<Duration, ConfigError> {
    match parse_duration_or_zero(variable, v) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(ConfigError {
            variable,
            value: v.to_string(),
            expected: DURATION,
        }),
    }
}

/// Zero, or a duration with a unit of at most 30 days.
///
/// Errors: [`ConfigError`] naming [`DURATION_OR_ZERO`].
pub fn parse_duration_or_zero(variable: &'static str, v: &str) -> Result<Duration, ConfigError> {
    let err = || ConfigError {
        variable,
        value: v.to_string(),
        expected: DURATION_OR_ZERO,
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
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_environment_gives_documented_defaults() {
        let c = Config::from_map(&HashMap::new()).unwrap();
        assert_eq!(c.redis_url, "redis://127.0.0.1:6379/");
        assert_eq!(c.mysql_url, "mysql://root@127.0.0.1:3306/seckill");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.review_db, PathBuf::from("./seckill-review.sqlite3"));
        assert_eq!(c.worker_id, "worker-1");
        assert_eq!(c.worker_batch, 256);
        assert_eq!(c.worker_max_attempts, 5);
        assert_eq!(c.body_limit_bytes, 4096);
        assert_eq!(c.gateway_threads, 0);
        assert_eq!(c.redis_timeout, Duration::from_millis(1000));
        assert_eq!(c.mysql_timeout, Duration::from_secs(10));
        assert_eq!(c.worker_block, Duration::from_secs(1));
        assert_eq!(c.worker_heartbeat_ttl, Duration::from_secs(15));
        assert_eq!(c.worker_metrics_listen.to_string(), "127.0.0.1:9101");
        assert_eq!(c.reconcile_lookback, Duration::from_secs(86_400));
        assert_eq!(c.archive_after, Some(Duration::from_secs(3600)));
        assert_eq!(c.reconcile_grace, Duration::from_secs(60));
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
            ("SECKILL_REVIEW_DB", "/var/lib/seckill/review.sqlite3"),
            ("SECKILL_WORKER_ID", "w-7"),
            ("SECKILL_WORKER_BATCH", "16"),
            ("SECKILL_WORKER_MAX_ATTEMPTS", "3"),
            ("SECKILL_WORKER_BLOCK", "2s"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "30s"),
            ("SECKILL_WORKER_METRICS_LISTEN", "127.0.0.1:9200"),
            ("SECKILL_RECONCILE_LOOKBACK", "48h"),
            ("SECKILL_ARCHIVE_AFTER", "off"),
            ("SECKILL_RECONCILE_GRACE", "0s"),
            (
                "SECKILL_RECONCILER_METRICS_FILE",
                "/run/seckill-metrics/seckill_reconciler.prom",
            ),
            ("SECKILL_AUTH_AUDIENCE", "shop-7"),
            ("SECKILL_AUTH_MAX_TTL", "2h"),
            ("SECKILL_PAYMENT_SECRET", "0123456789abcdef"),
        ]))
        .unwrap();
        assert_eq!(c.payment_secret, Some(Secret(b"0123456789abcdef".to_vec())));
        assert_eq!(format!("{:?}", c.payment_secret), "Some(Secret(16 bytes))");
        let short = map(&[("SECKILL_PAYMENT_SECRET", "short")]);
        assert_eq!(
            Config::from_map(&short).unwrap_err().variable,
            "SECKILL_PAYMENT_SECRET"
        );
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
        assert_eq!(
            c.review_db,
            PathBuf::from("/var/lib/seckill/review.sqlite3")
        );
        assert_eq!(c.worker_id, "w-7");
        assert_eq!(c.worker_batch, 16);
        assert_eq!(c.worker_max_attempts, 3);
        assert_eq!(c.worker_block, Duration::from_secs(2));
        assert_eq!(c.worker_heartbeat_ttl, Duration::from_secs(30));
        assert_eq!(c.worker_metrics_listen.to_string(), "127.0.0.1:9200");
        assert_eq!(c.reconcile_lookback, Duration::from_secs(48 * 3600));
        assert_eq!(c.archive_after, None);
        assert_eq!(c.reconcile_grace, Duration::ZERO);
        assert_eq!(
            c.reconciler_metrics_file,
            Some(PathBuf::from(
                "/run/seckill-metrics/seckill_reconciler.prom"
            ))
        );
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
            ("SECKILL_WORKER_ID", "bad id"),
            ("SECKILL_WORKER_BATCH", "0"),
            ("SECKILL_WORKER_BATCH", "many"),
            ("SECKILL_WORKER_MAX_ATTEMPTS", "0"),
            ("SECKILL_WORKER_BLOCK", "1 fortnight"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "90d"),
            ("SECKILL_WORKER_METRICS_LISTEN", "nowhere"),
            ("SECKILL_RECONCILE_LOOKBACK", "yesterday"),
            ("SECKILL_RECONCILE_GRACE", "60"),
            ("SECKILL_AUTH_AUDIENCE", "a b"),
            ("SECKILL_AUTH_MAX_TTL", "0s"),
            ("SECKILL_AUTH_MAX_TTL", "90d"),
            ("SECKILL_AUTH_MAX_TTL", "1500ms"),
            ("SECKILL_AUTH_MAX_TTL", "abc"),
            ("SECKILL_ARCHIVE_AFTER", "abc"),
            ("SECKILL_ARCHIVE_AFTER", "48h"),
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
    fn an_archive_delay_beyond_the_lookback_shows_the_lookback() {
        let err = Config::from_map(&map(&[
            ("SECKILL_RECONCILE_LOOKBACK", "90m"),
            ("SECKILL_ARCHIVE_AFTER", "2h"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: SECKILL_ARCHIVE_AFTER=\"2h\": expected a duration such \
             as 1h, below SECKILL_RECONCILE_LOOKBACK (90m), 0, or off"
        );
        assert_eq!(short_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(short_duration(Duration::from_secs(86_400)), "24h");
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

    /// A variable that refuses zero never suggests it (`5` for
    /// `SECKILL_REDIS_TIMEOUT` is told "a duration with a unit", not "0,
    /// or a duration").
    #[test]
    fn a_duration_that_cannot_be_zero_never_suggests_zero() {
        for var in [
            "SECKILL_REDIS_TIMEOUT",
            "SECKILL_MYSQL_TIMEOUT",
            "SECKILL_WORKER_BLOCK",
            "SECKILL_WORKER_HEARTBEAT_TTL",
            "SECKILL_WORKER_EXPIRY_EVERY",
            "SECKILL_RECONCILE_LOOKBACK",
        ] {
            for val in ["5", "abc", "0", "0s", "90d"] {
                let err = Config::from_map(&map(&[(var, val)])).unwrap_err();
                assert_eq!(err.variable, var);
                assert_eq!(err.expected, DURATION, "{var}={val}: {err}");
            }
        }
        let err = Config::from_map(&map(&[("SECKILL_RECONCILE_GRACE", "5")])).unwrap_err();
        assert_eq!(err.expected, DURATION_OR_ZERO);
    }

    #[test]
    fn empty_values_keep_defaults() {
        let c = Config::from_map(&map(&[("SECKILL_WORKER_BATCH", "  ")])).unwrap();
        assert_eq!(c.worker_batch, 256);
    }
}
