//! Owns the reconciler's settings: the shared [`Services`], the MySQL
//! replica it reads from, the review
//! file, `SECKILL_RECONCILE_*`, `SECKILL_ARCHIVE_AFTER`, the metrics file,
//! and the two token settings `token issue` follows
//! (`SECKILL_AUTH_AUDIENCE`, `SECKILL_AUTH_MAX_TTL`), resolved from the raw
//! environment ([`Env`]). The reconciler reads nothing else, so a bad
//! value of another binary's variable does not stop it; a command that
//! opens neither Redis nor MySQL reads neither's variables either
//! ([`Config::local_from_env`]).

use seckill_common::config::{
    parse_audience, parse_duration, parse_duration_or_zero, parse_max_ttl, parse_url,
    short_duration, ConfigError, Env, Services,
};
use std::path::PathBuf;
use std::time::Duration;

/// What `SECKILL_ARCHIVE_AFTER` takes.
const ARCHIVE_AFTER: &str = "a duration such as 1h, below SECKILL_RECONCILE_LOOKBACK, 0, or off";

/// The reconciler's settings. All defaults live in [`Config::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Redis and MySQL: where, and their timeouts.
    pub services: Services,
    /// `SECKILL_MYSQL_REPLICA_URL`: a MariaDB replica of `SECKILL_MYSQL_URL`
    /// (GTID replication) that `run`'s scans and the read-only commands
    /// read from; unset: everything reads the primary.
    pub mysql_replica_url: Option<String>,
    /// `SECKILL_MYSQL_REPLICA_WAIT`: how long a run waits for the replica to
    /// reach the primary's position before it reads the primary instead
    /// (default 5s).
    pub mysql_replica_wait: Duration,
    /// `SECKILL_REVIEW_DB`: path of the reconciler's SQLite review file.
    pub review_db: PathBuf,
    /// `SECKILL_RECONCILE_LOOKBACK`: sales that ended longer ago than this are
    /// no longer reconciled (default 24h).
    pub reconcile_lookback: Duration,
    /// `SECKILL_ARCHIVE_AFTER`: `run` archives a sale (removes its Redis
    /// keys, `seckill-reconciler sale archive`) once it ended this long ago
    /// and the run found it clean (default 1h; `0`: as soon as the
    /// archive's own minimum of one minute allows; `off`: never, only by
    /// hand). Must be below `SECKILL_RECONCILE_LOOKBACK`: a sale ended
    /// longer ago is no longer checked, so no longer archived by `run`.
    pub archive_after: Option<Duration>,
    /// `SECKILL_RECONCILE_GRACE`: reservations younger than this are skipped,
    /// so messages still on their way are not reported (default 60s).
    pub reconcile_grace: Duration,
    /// `SECKILL_RECONCILER_METRICS_FILE`: where `run` writes its metrics in
    /// the Prometheus text format after each run, for node_exporter's
    /// textfile collector (`metrics_file.rs`; default none: no file; an
    /// empty value means none too).
    pub reconciler_metrics_file: Option<PathBuf>,
    /// `SECKILL_AUTH_AUDIENCE`: the `aud` `token issue` writes (default
    /// `seckill`, as the gateway's).
    pub auth_audience: String,
    /// `SECKILL_AUTH_MAX_TTL`: the gateway's longest token lifetime; `token
    /// issue` warns beyond it (default 24h).
    pub auth_max_ttl: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            services: Services::default(),
            mysql_replica_url: None,
            mysql_replica_wait: Duration::from_secs(5),
            review_db: PathBuf::from("./seckill-review.sqlite3"),
            reconcile_lookback: Duration::from_secs(24 * 3600),
            archive_after: Some(Duration::from_secs(3600)),
            reconcile_grace: Duration::from_secs(60),
            reconciler_metrics_file: None,
            auth_audience: "seckill".to_string(),
            auth_max_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

impl Config {
    /// The reconciler's settings of `env`; missing or blank variables keep
    /// their default. Pure: touches neither the environment nor the network.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_env(env: &Env) -> Result<Config, ConfigError> {
        let services = Services::from_env(env)?;
        let mut c = Config::local_from_env(env)?;
        c.services = services;
        if let Some(v) = env.get("SECKILL_MYSQL_REPLICA_URL") {
            c.mysql_replica_url = Some(parse_url("SECKILL_MYSQL_REPLICA_URL", v, &["mysql://"])?);
        }
        if let Some(v) = env.get("SECKILL_MYSQL_REPLICA_WAIT") {
            c.mysql_replica_wait = parse_duration("SECKILL_MYSQL_REPLICA_WAIT", v)?;
        }
        Ok(c)
    }

    /// The settings of `env` for a command that opens neither Redis nor
    /// MySQL (`token keygen`, `token issue`, `findings`; `cmd::opens_services`
    /// tells which): as [`Config::from_env`] without reading
    /// `SECKILL_REDIS_*`, `SECKILL_MYSQL_*` and `SECKILL_MYSQL_REPLICA_*`,
    /// whose fields keep their defaults, so a malformed URL the command
    /// would never use does not stop it.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn local_from_env(env: &Env) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        if let Some(v) = env.get("SECKILL_REVIEW_DB") {
            c.review_db = PathBuf::from(v);
        }
        if let Some(v) = env.get("SECKILL_RECONCILE_LOOKBACK") {
            c.reconcile_lookback = parse_duration("SECKILL_RECONCILE_LOOKBACK", v)?;
        }
        if let Some(v) = env.get("SECKILL_ARCHIVE_AFTER") {
            c.archive_after = archive_after(v, c.reconcile_lookback)?;
        }
        if let Some(v) = env.get("SECKILL_RECONCILE_GRACE") {
            c.reconcile_grace = parse_duration_or_zero("SECKILL_RECONCILE_GRACE", v)?;
        }
        if let Some(v) = env.get("SECKILL_RECONCILER_METRICS_FILE") {
            c.reconciler_metrics_file = Some(PathBuf::from(v));
        }
        if let Some(v) = env.get("SECKILL_AUTH_AUDIENCE") {
            c.auth_audience = parse_audience(v)?;
        }
        if let Some(v) = env.get("SECKILL_AUTH_MAX_TTL") {
            c.auth_max_ttl = parse_max_ttl(v)?;
        }
        Ok(c)
    }
}

/// `SECKILL_ARCHIVE_AFTER` value `v`: `off` (`None`), or a duration (0
/// allowed) below `lookback`: a sale ended longer ago than the lookback is
/// no longer checked, so it would never be archived.
///
/// Errors: anything else; below-the-lookback refusals name the lookback's
/// value, so the operator sees which bound to meet.
fn archive_after(v: &str, lookback: Duration) -> Result<Option<Duration>, ConfigError> {
    let err = |expected: String| ConfigError::new("SECKILL_ARCHIVE_AFTER", v, expected);
    if v == "off" {
        return Ok(None);
    }
    let d = parse_duration_or_zero("SECKILL_ARCHIVE_AFTER", v)
        .map_err(|_| err(ARCHIVE_AFTER.to_string()))?;
    if d >= lookback {
        return Err(err(format!(
            "a duration such as 1h, below SECKILL_RECONCILE_LOOKBACK ({}), 0, or off",
            short_duration(lookback)
        )));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_common::config::{DURATION, DURATION_OR_ZERO};

    #[test]
    fn empty_environment_gives_documented_defaults() {
        let c = Config::from_env(&Env::from_pairs(&[])).unwrap();
        assert_eq!(c.services, Services::default());
        assert_eq!(c.review_db, PathBuf::from("./seckill-review.sqlite3"));
        assert_eq!(c.reconcile_lookback, Duration::from_secs(86_400));
        assert_eq!(c.archive_after, Some(Duration::from_secs(3600)));
        assert_eq!(c.reconcile_grace, Duration::from_secs(60));
        assert_eq!(c.reconciler_metrics_file, None);
        assert_eq!(c.auth_audience, "seckill");
        assert_eq!(c.auth_max_ttl, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn valid_overrides_are_applied() {
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_MYSQL_URL", "mysql://app:pw@db:3306/shop"),
            ("SECKILL_REVIEW_DB", "/var/lib/seckill/review.sqlite3"),
            ("SECKILL_RECONCILE_LOOKBACK", "48h"),
            ("SECKILL_ARCHIVE_AFTER", "off"),
            ("SECKILL_RECONCILE_GRACE", "0s"),
            (
                "SECKILL_RECONCILER_METRICS_FILE",
                "/run/seckill-metrics/seckill_reconciler.prom",
            ),
            ("SECKILL_AUTH_AUDIENCE", "shop-7"),
            ("SECKILL_AUTH_MAX_TTL", "2h"),
        ]))
        .unwrap();
        assert_eq!(c.services.mysql_url, "mysql://app:pw@db:3306/shop");
        assert_eq!(
            c.review_db,
            PathBuf::from("/var/lib/seckill/review.sqlite3")
        );
        assert_eq!(c.reconcile_lookback, Duration::from_secs(48 * 3600));
        assert_eq!(c.archive_after, None);
        assert_eq!(c.reconcile_grace, Duration::ZERO);
        assert_eq!(
            c.reconciler_metrics_file,
            Some(PathBuf::from(
                "/run/seckill-metrics/seckill_reconciler.prom"
            ))
        );
        assert_eq!(c.auth_audience, "shop-7");
        assert_eq!(c.auth_max_ttl, Duration::from_secs(7200));
        let zero = Config::from_env(&Env::from_pairs(&[("SECKILL_ARCHIVE_AFTER", "0")])).unwrap();
        assert_eq!(zero.archive_after, Some(Duration::ZERO));
    }

    #[test]
    fn bad_values_name_variable_value_and_expectation() {
        let cases = [
            ("SECKILL_REDIS_URL", "localhost:6379"),
            ("SECKILL_MYSQL_URL", "postgres://x"),
            ("SECKILL_RECONCILE_LOOKBACK", "yesterday"),
            ("SECKILL_RECONCILE_GRACE", "60"),
            ("SECKILL_ARCHIVE_AFTER", "abc"),
            ("SECKILL_ARCHIVE_AFTER", "48h"),
            ("SECKILL_AUTH_AUDIENCE", "a b"),
            ("SECKILL_AUTH_MAX_TTL", "0s"),
            ("SECKILL_AUTH_MAX_TTL", "90d"),
            ("SECKILL_AUTH_MAX_TTL", "1500ms"),
            ("SECKILL_AUTH_MAX_TTL", "abc"),
        ];
        for (var, val) in cases {
            let err = Config::from_env(&Env::from_pairs(&[(var, val)])).unwrap_err();
            assert_eq!(err.variable, var);
            assert_eq!(err.value, val);
            let msg = err.to_string();
            assert!(
                msg.contains(var) && msg.contains(val) && msg.contains("expected"),
                "{msg}"
            );
        }
        let err =
            Config::from_env(&Env::from_pairs(&[("SECKILL_RECONCILE_LOOKBACK", "0")])).unwrap_err();
        assert_eq!(err.expected, DURATION);
        let err =
            Config::from_env(&Env::from_pairs(&[("SECKILL_RECONCILE_GRACE", "5")])).unwrap_err();
        assert_eq!(err.expected, DURATION_OR_ZERO);
    }

    #[test]
    fn an_archive_delay_beyond_the_lookback_shows_the_lookback() {
        let err = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_RECONCILE_LOOKBACK", "90m"),
            ("SECKILL_ARCHIVE_AFTER", "2h"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: SECKILL_ARCHIVE_AFTER=\"2h\": expected a duration such \
             as 1h, below SECKILL_RECONCILE_LOOKBACK (90m), 0, or off"
        );
        let err =
            Config::from_env(&Env::from_pairs(&[("SECKILL_ARCHIVE_AFTER", "abc")])).unwrap_err();
        assert_eq!(err.expected, ARCHIVE_AFTER);
    }

    /// A command that opens neither Redis nor MySQL does not read their
    /// URLs: malformed ones keep the defaults; its own variables are
    /// still checked.
    #[test]
    fn local_settings_skip_the_service_urls_and_check_the_rest() {
        let bad = [
            ("SECKILL_REDIS_URL", "localhost:6379"),
            ("SECKILL_MYSQL_URL", "postgres://x"),
            ("SECKILL_REDIS_TIMEOUT", "soon"),
            ("SECKILL_MYSQL_REPLICA_URL", "replica"),
            ("SECKILL_MYSQL_REPLICA_WAIT", "5"),
        ];
        assert!(Config::from_env(&Env::from_pairs(&bad)).is_err());
        let c = Config::local_from_env(&Env::from_pairs(&bad)).unwrap();
        assert_eq!(c, Config::default());
        let mut with_ttl = bad.to_vec();
        with_ttl.push(("SECKILL_AUTH_MAX_TTL", "2h"));
        let c = Config::local_from_env(&Env::from_pairs(&with_ttl)).unwrap();
        assert_eq!(c.auth_max_ttl, Duration::from_secs(7200));
        with_ttl.push(("SECKILL_AUTH_AUDIENCE", "a b"));
        let err = Config::local_from_env(&Env::from_pairs(&with_ttl)).unwrap_err();
        assert_eq!(err.variable, "SECKILL_AUTH_AUDIENCE");
    }

    /// The gateway's and the worker's variables are theirs: a bad one does
    /// not stop the reconciler.
    #[test]
    fn a_bad_value_of_another_binarys_variable_does_not_stop_the_reconciler() {
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_GATEWAY_BUYER_RATE", "lots"),
            ("SECKILL_WORKER_BATCH", "many"),
            ("SECKILL_AUTH", "JWT"),
        ]))
        .unwrap();
        assert_eq!(c, Config::default());
    }
}
