//! Owns the worker's settings: the shared [`Services`] and the
//! `SECKILL_WORKER_*` variables, resolved from the raw environment
//! ([`Env`]). The worker reads nothing else, so a bad value of another
//! binary's variable (the gateway's, the reconciler's) does not stop it.

use seckill_common::config::{
    parse_addr, parse_duration, parse_duration_or_zero, parse_int, short_duration, ConfigError,
    Env, Services,
};
use std::net::SocketAddr;
use std::time::Duration;

/// What `SECKILL_WORKER_BATCH` takes.
const INT_BATCH: &str = "an integer from 1 to 10000";
/// What `SECKILL_WORKER_MAX_ATTEMPTS` takes.
const INT_ATTEMPTS: &str = "an integer from 1 to 1000";
/// Most consumers one worker process runs.
pub const MAX_CONSUMERS: usize = 64;
/// The variable of [`Config::worker_retry_for`].
const RETRY_FOR: &str = "SECKILL_WORKER_RETRY_FOR";
/// Longest [`Config::worker_retry_for`].
const MAX_RETRY_FOR: Duration = Duration::from_secs(600);
/// What `SECKILL_WORKER_CONSUMERS_MIN` takes.
const INT_CONSUMERS: &str = "an integer from 1 to 64";

/// The worker's settings. All defaults live in [`Config::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Redis and MySQL: where, and their timeouts.
    pub services: Services,
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
    /// `Services::redis_timeout`, so the client never gives up first.
    pub worker_block: Duration,
    /// `SECKILL_WORKER_HEARTBEAT_TTL`: lifetime of a worker's heartbeat key;
    /// after it expires other workers reclaim its processing lists.
    pub worker_heartbeat_ttl: Duration,
    /// `SECKILL_WORKER_METRICS_LISTEN`: the worker's `/metrics` listener.
    pub worker_metrics_listen: SocketAddr,
    /// `SECKILL_WORKER_EXPIRY_EVERY`: pause between two passes of the
    /// worker's expiry sweep (`expiry.rs`) when the last pass found nothing
    /// to do (default 200ms: a unit is back on sale within about that after
    /// its deadline).
    pub worker_expiry_every: Duration,
    /// `SECKILL_WORKER_CONSUMERS_MIN`: consumers this process always runs
    /// (1-64, default 1). Each consumer has its own processing lists,
    /// heartbeat and MySQL session (`pool.rs`).
    pub worker_consumers_min: usize,
    /// `SECKILL_WORKER_CONSUMERS_MAX`: most consumers it runs while queues
    /// have a backlog (from the minimum to 64; default the minimum, so a
    /// process of default settings never scales).
    pub worker_consumers_max: usize,
    /// `SECKILL_WORKER_SCALE_AFTER`: a consumer is added while some
    /// sale's oldest queued message is older than this and fewer consumers
    /// run than sales have such a backlog (default 2s).
    pub worker_scale_after: Duration,
    /// `SECKILL_WORKER_IDLE_AFTER`: a consumer above the minimum that found
    /// nothing to take for this long stops (default 30s).
    pub worker_idle_after: Duration,
    /// `SECKILL_WORKER_RETRY_FOR`: how long a batch MySQL refuses with a
    /// statement error (a table missing for a moment, a grant being
    /// changed) is retried, with backoff, before each of its messages is
    /// counted one failed attempt (0s to 10m; default 30s).
    pub worker_retry_for: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            services: Services::default(),
            worker_id: "worker-1".to_string(),
            worker_batch: 256,
            worker_max_attempts: 5,
            worker_block: Duration::from_secs(1),
            worker_heartbeat_ttl: Duration::from_secs(15),
            worker_metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9101)),
            worker_expiry_every: Duration::from_millis(200),
            worker_consumers_min: 1,
            worker_consumers_max: 1,
            worker_scale_after: Duration::from_secs(2),
            worker_idle_after: Duration::from_secs(30),
            worker_retry_for: Duration::from_secs(30),
        }
    }
}

impl Config {
    /// The worker's settings of `env`; missing or blank variables keep
    /// their default. Pure: touches neither the environment nor the network.
    ///
    /// Errors: the first variable whose value cannot be used.
    pub fn from_env(env: &Env) -> Result<Config, ConfigError> {
        let mut c = Config {
            services: Services::from_env(env)?,
            ..Config::default()
        };
        if let Some(v) = env.get("SECKILL_WORKER_ID") {
            if !seckill_common::is_valid_token(v) {
                return Err(ConfigError::new(
                    "SECKILL_WORKER_ID",
                    v,
                    seckill_common::TOKEN_RULE,
                ));
            }
            c.worker_id = v.to_string();
        }
        if let Some(v) = env.get("SECKILL_WORKER_BATCH") {
            c.worker_batch = parse_int("SECKILL_WORKER_BATCH", v, 1, 10_000, INT_BATCH)?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_MAX_ATTEMPTS") {
            c.worker_max_attempts =
                parse_int("SECKILL_WORKER_MAX_ATTEMPTS", v, 1, 1000, INT_ATTEMPTS)? as u32;
        }
        if let Some(v) = env.get("SECKILL_WORKER_BLOCK") {
            c.worker_block = parse_duration("SECKILL_WORKER_BLOCK", v)?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_HEARTBEAT_TTL") {
            c.worker_heartbeat_ttl = parse_duration("SECKILL_WORKER_HEARTBEAT_TTL", v)?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_METRICS_LISTEN") {
            c.worker_metrics_listen = parse_addr("SECKILL_WORKER_METRICS_LISTEN", v)?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_EXPIRY_EVERY") {
            c.worker_expiry_every = parse_duration("SECKILL_WORKER_EXPIRY_EVERY", v)?;
        }
        if let Some(v) = env.get(RETRY_FOR) {
            c.worker_retry_for = parse_duration_or_zero(RETRY_FOR, v)?;
            if c.worker_retry_for > MAX_RETRY_FOR {
                return Err(ConfigError::new(RETRY_FOR, v, "a duration from 0s to 10m"));
            }
        }
        c.consumers_from_env(env)?;
        c.timeout_above_session_limits(env)?;
        Ok(c)
    }

    /// Refuses a `SECKILL_MYSQL_TIMEOUT` below the MySQL session limits
    /// the heartbeat TTL sets (`session.rs`: half of it, in whole seconds):
    /// the client would give up on a statement waiting for the sale row
    /// before MySQL ends that wait with 1205 (retried), and take a busy
    /// sale for a lost connection.
    fn timeout_above_session_limits(&self, env: &Env) -> Result<(), ConfigError> {
        let limits = crate::session::SessionLimits::for_heartbeat(self.worker_heartbeat_ttl);
        let floor = Duration::from_secs(limits.lock_wait_s);
        if self.services.mysql_timeout >= floor {
            return Ok(());
        }
        let value = env.get("SECKILL_MYSQL_TIMEOUT").map_or_else(
            || short_duration(self.services.mysql_timeout),
            str::to_string,
        );
        Err(ConfigError::new(
            "SECKILL_MYSQL_TIMEOUT",
            value,
            format!(
                "at least {}, the worker's MySQL session limits (half of \
                 SECKILL_WORKER_HEARTBEAT_TTL={}, whole seconds): a shorter client timeout \
                 cuts a lock wait short before MySQL answers it; or lower \
                 SECKILL_WORKER_HEARTBEAT_TTL",
                short_duration(floor),
                short_duration(self.worker_heartbeat_ttl)
            ),
        ))
    }

    /// The consumer-pool settings of `env` (`SECKILL_WORKER_CONSUMERS_*`,
    /// `_SCALE_AFTER`, `_IDLE_AFTER`), checked against each other and
    /// against the worker id, which names every consumer (`ID`, `ID.1`, …).
    fn consumers_from_env(&mut self, env: &Env) -> Result<(), ConfigError> {
        const MIN: &str = "SECKILL_WORKER_CONSUMERS_MIN";
        const MAX: &str = "SECKILL_WORKER_CONSUMERS_MAX";
        if let Some(v) = env.get(MIN) {
            self.worker_consumers_min = parse_int(MIN, v, 1, MAX_CONSUMERS, INT_CONSUMERS)?;
        }
        self.worker_consumers_max = self.worker_consumers_min;
        if let Some(v) = env.get(MAX) {
            let min = self.worker_consumers_min;
            let expected =
                format!("an integer from {min} (SECKILL_WORKER_CONSUMERS_MIN) to {MAX_CONSUMERS}");
            self.worker_consumers_max = parse_int(MAX, v, min, MAX_CONSUMERS, "")
                .map_err(|_| ConfigError::new(MAX, v, expected))?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_SCALE_AFTER") {
            self.worker_scale_after = parse_duration("SECKILL_WORKER_SCALE_AFTER", v)?;
        }
        if let Some(v) = env.get("SECKILL_WORKER_IDLE_AFTER") {
            self.worker_idle_after = parse_duration("SECKILL_WORKER_IDLE_AFTER", v)?;
        }
        let longest = crate::pool::consumer_id(&self.worker_id, self.worker_consumers_max - 1);
        if longest.len() > 64 {
            return Err(ConfigError::new(
                "SECKILL_WORKER_ID",
                self.worker_id.clone(),
                format!(
                    "at most {} characters with SECKILL_WORKER_CONSUMERS_MAX={} \
                     (consumer ids add .N, up to {longest:?})",
                    64 - (longest.len() - self.worker_id.len()),
                    self.worker_consumers_max
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_common::config::{DURATION, DURATION_OR_ZERO};

    #[test]
    fn empty_environment_gives_documented_defaults() {
        let c = Config::from_env(&Env::from_pairs(&[])).unwrap();
        assert_eq!(c.services.redis_url, "redis://127.0.0.1:6379/");
        assert_eq!(c.services.mysql_url, "mysql://root@127.0.0.1:3306/seckill");
        assert_eq!(c.services.redis_timeout, Duration::from_millis(1000));
        assert_eq!(c.services.mysql_timeout, Duration::from_secs(10));
        assert_eq!(c.worker_id, "worker-1");
        assert_eq!(c.worker_batch, 256);
        assert_eq!(c.worker_max_attempts, 5);
        assert_eq!(c.worker_block, Duration::from_secs(1));
        assert_eq!(c.worker_heartbeat_ttl, Duration::from_secs(15));
        assert_eq!(c.worker_metrics_listen.to_string(), "127.0.0.1:9101");
        assert_eq!(c.worker_expiry_every, Duration::from_millis(200));
        assert_eq!(c.worker_retry_for, Duration::from_secs(30));
    }

    #[test]
    fn the_statement_retry_takes_0s_to_10m() {
        for (v, want) in [("0s", 0), ("1s", 1), ("10m", 600)] {
            let c = Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_RETRY_FOR", v)]));
            assert_eq!(
                c.unwrap().worker_retry_for,
                Duration::from_secs(want),
                "{v}"
            );
        }
        for v in ["11m", "30", "soon"] {
            let e =
                Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_RETRY_FOR", v)])).unwrap_err();
            assert_eq!(e.variable, "SECKILL_WORKER_RETRY_FOR", "{v}");
        }
    }

    #[test]
    fn valid_overrides_are_applied() {
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_REDIS_URL", "redis://10.0.0.1:7000/2"),
            ("SECKILL_MYSQL_URL", "mysql://app:pw@db:3306/shop"),
            ("SECKILL_REDIS_TIMEOUT", "250ms"),
            ("SECKILL_MYSQL_TIMEOUT", "15s"),
            ("SECKILL_WORKER_ID", "w-7"),
            ("SECKILL_WORKER_BATCH", "16"),
            ("SECKILL_WORKER_MAX_ATTEMPTS", "3"),
            ("SECKILL_WORKER_BLOCK", "2s"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "30s"),
            ("SECKILL_WORKER_METRICS_LISTEN", "127.0.0.1:9200"),
            ("SECKILL_WORKER_EXPIRY_EVERY", "1s"),
        ]))
        .unwrap();
        assert_eq!(c.services.redis_url, "redis://10.0.0.1:7000/2");
        assert_eq!(c.services.mysql_url, "mysql://app:pw@db:3306/shop");
        assert_eq!(c.services.redis_timeout, Duration::from_millis(250));
        assert_eq!(c.services.mysql_timeout, Duration::from_secs(15));
        assert_eq!(c.worker_id, "w-7");
        assert_eq!(c.worker_batch, 16);
        assert_eq!(c.worker_max_attempts, 3);
        assert_eq!(c.worker_block, Duration::from_secs(2));
        assert_eq!(c.worker_heartbeat_ttl, Duration::from_secs(30));
        assert_eq!(c.worker_metrics_listen.to_string(), "127.0.0.1:9200");
        assert_eq!(c.worker_expiry_every, Duration::from_secs(1));
    }

    #[test]
    fn bad_values_name_variable_value_and_expectation() {
        let cases = [
            ("SECKILL_REDIS_URL", "localhost:6379"),
            ("SECKILL_MYSQL_URL", "postgres://x"),
            ("SECKILL_REDIS_TIMEOUT", "500"),
            ("SECKILL_MYSQL_TIMEOUT", "0s"),
            ("SECKILL_WORKER_ID", "bad id"),
            ("SECKILL_WORKER_BATCH", "0"),
            ("SECKILL_WORKER_BATCH", "many"),
            ("SECKILL_WORKER_MAX_ATTEMPTS", "0"),
            ("SECKILL_WORKER_BLOCK", "1 fortnight"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "90d"),
            ("SECKILL_WORKER_METRICS_LISTEN", "nowhere"),
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
        assert_eq!(
            Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_BATCH", "0")]))
                .unwrap_err()
                .to_string(),
            "invalid configuration: SECKILL_WORKER_BATCH=\"0\": expected an integer from 1 to 10000"
        );
    }

    #[test]
    fn a_duration_that_cannot_be_zero_never_suggests_zero() {
        for var in [
            "SECKILL_WORKER_BLOCK",
            "SECKILL_WORKER_HEARTBEAT_TTL",
            "SECKILL_WORKER_EXPIRY_EVERY",
            "SECKILL_WORKER_SCALE_AFTER",
            "SECKILL_WORKER_IDLE_AFTER",
        ] {
            for val in ["5", "abc", "0", "0s", "90d"] {
                let err = Config::from_env(&Env::from_pairs(&[(var, val)])).unwrap_err();
                assert_eq!(err.variable, var);
                assert_eq!(err.expected, DURATION, "{var}={val}: {err}");
                assert_ne!(err.expected, DURATION_OR_ZERO);
            }
        }
    }

    #[test]
    fn the_consumer_pool_takes_a_minimum_a_maximum_and_two_durations() {
        let c = Config::from_env(&Env::from_pairs(&[])).unwrap();
        assert_eq!((c.worker_consumers_min, c.worker_consumers_max), (1, 1));
        assert_eq!(c.worker_scale_after, Duration::from_secs(2));
        assert_eq!(c.worker_idle_after, Duration::from_secs(30));
        let c =
            Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_CONSUMERS_MIN", "3")])).unwrap();
        assert_eq!((c.worker_consumers_min, c.worker_consumers_max), (3, 3));
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_WORKER_CONSUMERS_MIN", "2"),
            ("SECKILL_WORKER_CONSUMERS_MAX", "64"),
            ("SECKILL_WORKER_SCALE_AFTER", "500ms"),
            ("SECKILL_WORKER_IDLE_AFTER", "1m"),
        ]))
        .unwrap();
        assert_eq!((c.worker_consumers_min, c.worker_consumers_max), (2, 64));
        assert_eq!(c.worker_scale_after, Duration::from_millis(500));
        assert_eq!(c.worker_idle_after, Duration::from_secs(60));
    }

    #[test]
    fn a_bad_consumer_pool_names_the_variable_and_what_it_takes() {
        let err = |pairs: &[(&str, &str)]| {
            Config::from_env(&Env::from_pairs(pairs))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&[("SECKILL_WORKER_CONSUMERS_MIN", "0")]),
            "invalid configuration: SECKILL_WORKER_CONSUMERS_MIN=\"0\": expected an integer from 1 to 64"
        );
        assert_eq!(
            err(&[
                ("SECKILL_WORKER_CONSUMERS_MIN", "4"),
                ("SECKILL_WORKER_CONSUMERS_MAX", "2")
            ]),
            "invalid configuration: SECKILL_WORKER_CONSUMERS_MAX=\"2\": expected an integer \
             from 4 (SECKILL_WORKER_CONSUMERS_MIN) to 64"
        );
        assert!(err(&[("SECKILL_WORKER_CONSUMERS_MAX", "65")]).contains("from 1 (SECKILL"));
        assert!(err(&[("SECKILL_WORKER_SCALE_AFTER", "0")]).contains("SECKILL_WORKER_SCALE_AFTER"));
        assert!(err(&[("SECKILL_WORKER_IDLE_AFTER", "soon")]).contains("SECKILL_WORKER_IDLE_AFTER"));
        // Consumer ids append ".N" to the worker id: a 64-character id
        // fits one consumer, not ten.
        let id = "w".repeat(64);
        assert!(Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_ID", &id)])).is_ok());
        let long = err(&[
            ("SECKILL_WORKER_ID", &id),
            ("SECKILL_WORKER_CONSUMERS_MAX", "10"),
        ]);
        assert!(
            long.contains("SECKILL_WORKER_ID") && long.contains("at most 62 characters"),
            "{long}"
        );
    }

    #[test]
    fn empty_values_keep_defaults() {
        let c = Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_BATCH", "  ")])).unwrap();
        assert_eq!(c.worker_batch, 256);
    }

    /// The gateway's and the reconciler's variables are theirs: a bad one
    /// does not stop the worker.
    #[test]
    fn a_bad_value_of_another_binarys_variable_does_not_stop_the_worker() {
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_GATEWAY_BUYER_RATE", "lots"),
            ("SECKILL_LISTEN", "8080"),
            ("SECKILL_AUTH", "JWT"),
            ("SECKILL_PAYMENT_SECRET", "short"),
            ("SECKILL_ARCHIVE_AFTER", "abc"),
            ("SECKILL_RECONCILE_GRACE", "60"),
            ("SECKILL_WORKER_ID", "w-2"),
        ]))
        .unwrap();
        assert_eq!(c.worker_id, "w-2");
        assert_eq!(c.worker_batch, 256);
    }

    /// A client timeout below the session limits is refused, naming both
    /// variables; at the limits it is taken.
    #[test]
    fn a_mysql_timeout_below_the_session_limits_is_refused_naming_both_variables() {
        let err = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_MYSQL_TIMEOUT", "5s"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "20s"),
        ]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: SECKILL_MYSQL_TIMEOUT=\"5s\": expected at least 10s, the \
             worker's MySQL session limits (half of SECKILL_WORKER_HEARTBEAT_TTL=20s, whole \
             seconds): a shorter client timeout cuts a lock wait short before MySQL answers \
             it; or lower SECKILL_WORKER_HEARTBEAT_TTL"
        );
        let err = Config::from_env(&Env::from_pairs(&[("SECKILL_WORKER_HEARTBEAT_TTL", "30s")]))
            .unwrap_err();
        assert_eq!(
            (err.variable, err.value.as_str()),
            ("SECKILL_MYSQL_TIMEOUT", "10s")
        );
        let c = Config::from_env(&Env::from_pairs(&[
            ("SECKILL_MYSQL_TIMEOUT", "10s"),
            ("SECKILL_WORKER_HEARTBEAT_TTL", "21s"),
        ]))
        .unwrap();
        assert_eq!(c.services.mysql_timeout, Duration::from_secs(10));
    }
}
