//! Owns the load simulator's command line: raw arguments parsed with lexopt,
//! then validated into typed [`Options`]; nothing here touches the network.

use lexopt::prelude::*;
use std::ffi::OsString;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Printed by `--help` and after a command-line error.
pub const USAGE: &str = "\
usage: seckill-load --sale ID [OPTIONS]

Sends a flash-sale crowd at the purchase API over keep-alive HTTP/1.1, then
checks the invariants against the answers, Redis and MySQL.

options:
  --sale ID             the sale to buy from (required)
  --url URL             the gateway, http://HOST:PORT (default: http://$SECKILL_LISTEN)
  --users N             distinct users, each clicking once (default 50000)
  --connections N       keep-alive connections, one thread each (default 64)
  --duplicates F        share of users who click twice, 0 to 1 (default 0.05)
  --rate N              requests per second in total; 0 = as fast as possible (default 0)
  --hostile N           hostile requests mixed in (default: one of each kind, 7, or
                        10 with --key: forged, expired and another user's tokens too)
  --key FILE            sign each buyer's token with the last signing key of this JWKS
                        file (seckill-reconciler token keygen); without it no tokens are
                        sent (a gateway with SECKILL_AUTH=none, or --baseline)
  --user-prefix P       user ids are P-0, P-1, ... (default: u<seconds since epoch>)
  --seed N              seed of the plan's shuffle (default: from the clock)
  --wait-open           sleep until the sale's starts_at (MySQL's clock) before sending
  --drain-timeout DUR   how long to wait for the workers to drain the queue (default 120s)
  --timeout DUR         connect/read/write timeout of one request (default 10s)
  --baseline            the server is seckill-baseline: no Redis, orders written at once
  --no-verify           send and report, skip the Redis and MySQL checks
  --outage              an outage is expected during the run (a failover, a paused
                        Redis): purchases answered 503 are counted apart, not as
                        failures of purchases_answered, and checked to have
                        reserved nothing (unavailable_reserved_nothing: no buyer
                        answered only 503 holds a reservation in Redis or an order
                        in MySQL); every other invariant is checked as without it
  --json                print the report as JSON on stdout
  --report-json FILE    also write the JSON report to FILE (stdout keeps the text)
  --quantities W1:W2:.. a quantity mix: weights of 1, 2, 3, ... units per purchase
                        (70:20:10 = 70 % one unit, 20 % two, 10 % three); each
                        purchase then carries an Idempotency-Key and, above one
                        unit, a quantity; the invariants count units and check the
                        sale's per-buyer limit (its max_per_buyer / max_per_purchase,
                        sale create --max-per-buyer / --max-per-purchase)
  --retry-same-key F    share of users (0 to 1) who send their first purchase again
                        with the same Idempotency-Key and body: each must be answered
                        with the first one's reservation id (implies the keys of
                        --quantities; default 0)
  --healthz-burst N     at the end, N GET /healthz over the same connections: the
                        report prints that rate beside the crowd's (what the gateway
                        answers when a request costs it nothing; default 0, none)
  --pay-share F         then the order lifecycle: a simulated payment service pays
                        share F (0 to 1) of the winners (POST /v1/payments, signed with
                        SECKILL_PAYMENT_SECRET), the rest let the sale's payment window
                        pass, buyers told sold out buy the returned units and pay
  -h, --help            this text

Redis and MySQL: SECKILL_REDIS_URL, SECKILL_MYSQL_URL (as the services use).
Exit codes: 0 every invariant holds, 1 an invariant failed, 2 could not run,
64 bad command line.";

/// A validated command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The sale id.
    pub sale_id: u64,
    /// The gateway's address.
    pub addr: SocketAddr,
    /// `HOST:PORT` for the `Host` header.
    pub host: String,
    /// Distinct users.
    pub users: u32,
    /// Connections (= client threads).
    pub connections: u32,
    /// Share of users clicking twice.
    pub duplicates: f64,
    /// Requests per second; 0 = as fast as possible.
    pub rate: f64,
    /// Hostile requests mixed in.
    pub hostile: u32,
    /// User id prefix.
    pub user_prefix: String,
    /// Shuffle seed.
    pub seed: u64,
    /// Sleep until the sale opens.
    pub wait_open: bool,
    /// Longest wait for the queue to drain.
    pub drain_timeout: Duration,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The server is the MySQL-only baseline.
    pub baseline: bool,
    /// Check Redis and MySQL after the load.
    pub verify: bool,
    /// JSON report instead of text.
    pub json: bool,
    /// `--report-json FILE`: the JSON report written there too.
    pub report_json: Option<std::path::PathBuf>,
    /// `--pay-share F`: run the order-lifecycle phase, paying share F.
    pub pay_share: Option<f64>,
    /// `--key`: the signing key file of the crowd's tokens.
    pub key: Option<std::path::PathBuf>,
    /// `--quantities`: weights of 1, 2, 3, ... units (empty: one unit,
    /// no key, exactly the requests without the option).
    pub quantities: Vec<u32>,
    /// `--retry-same-key F`: share of users retrying with the same key.
    pub retry_same_key: f64,
    /// `--outage`: 503 answers are allowed, and checked to have reserved
    /// nothing.
    pub outage: bool,
    /// `--healthz-burst N`: health checks sent after the run (0: none).
    pub healthz_burst: u32,
}

impl Options {
    /// Whether purchases carry an `Idempotency-Key` and the invariants
    /// count units (`--quantities` or `--retry-same-key`).
    pub fn keyed(&self) -> bool {
        !self.quantities.is_empty() || self.retry_same_key > 0.0
    }

    /// The most units one purchase of the mix asks for (1 without one).
    pub fn max_quantity(&self) -> u32 {
        self.quantities
            .iter()
            .rposition(|&w| w > 0)
            .map_or(1, |i| i as u32 + 1)
    }
}

/// Reads `--quantities`: 1 to `MAX_UNITS` weights separated by `:`, at
/// least one above 0.
fn quantities(v: OsString) -> Result<Vec<u32>, UsageError> {
    let s = text(v, "quantities")?;
    let bad = || {
        UsageError(format!(
            "--quantities {s:?}: weights of 1, 2, 3, ... units, e.g. 70:20:10 \
             (at most {} of them, not all 0)",
            seckill_common::allowance::MAX_UNITS
        ))
    };
    let w: Vec<u32> = s
        .split(':')
        .map(|x| x.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let max = seckill_common::allowance::MAX_UNITS as usize;
    if w.is_empty() || w.len() > max || w.iter().all(|&x| x == 0) {
        return Err(bad());
    }
    Ok(w)
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// `--help`.
    Help,
    /// A run.
    Run(Box<Options>),
}

/// A command line that cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad command line: {}", self.0)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError(e.to_string())
    }
}

fn num<T: std::str::FromStr>(v: OsString, name: &str) -> Result<T, UsageError> {
    let s = v
        .into_string()
        .map_err(|_| UsageError(format!("--{name}: not valid UTF-8")))?;
    s.parse()
        .map_err(|_| UsageError(format!("--{name}: {s:?} is not a valid number")))
}

fn text(v: OsString, name: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError(format!("--{name}: not valid UTF-8")))
}

fn duration(v: OsString, name: &str) -> Result<Duration, UsageError> {
    let s = text(v, name)?;
    humantime::parse_duration(&s)
        .map_err(|_| UsageError(format!("--{name}: {s:?}: use e.g. 500ms, 30s, 2m")))
}

/// Parses the arguments after the program name. `default_listen` is the
/// gateway address from `SECKILL_LISTEN`; `now_s` seeds the defaults that
/// must differ between runs (user prefix, seed).
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    default_listen: SocketAddr,
    now_s: u64,
) -> Result<Parsed, UsageError> {
    let mut p = lexopt::Parser::from_args(args);
    let mut sale_id = None;
    let mut url = None;
    let mut o = defaults(default_listen, now_s);
    let mut hostile_given = false;
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("sale") => sale_id = Some(num::<u64>(p.value()?, "sale")?),
            Long("url") => url = Some(text(p.value()?, "url")?),
            Long("users") => o.users = num(p.value()?, "users")?,
            Long("connections") => o.connections = num(p.value()?, "connections")?,
            Long("duplicates") => o.duplicates = num(p.value()?, "duplicates")?,
            Long("rate") => o.rate = num(p.value()?, "rate")?,
            Long("hostile") => {
                o.hostile = num(p.value()?, "hostile")?;
                hostile_given = true;
            }
            Long("key") => o.key = Some(text(p.value()?, "key")?.into()),
            Long("user-prefix") => o.user_prefix = text(p.value()?, "user-prefix")?,
            Long("seed") => o.seed = num(p.value()?, "seed")?,
            Long("wait-open") => o.wait_open = true,
            Long("drain-timeout") => o.drain_timeout = duration(p.value()?, "drain-timeout")?,
            Long("timeout") => o.timeout = duration(p.value()?, "timeout")?,
            Long("baseline") => o.baseline = true,
            Long("no-verify") => o.verify = false,
            Long("outage") => o.outage = true,
            Long("json") => o.json = true,
            Long("report-json") => o.report_json = Some(text(p.value()?, "report-json")?.into()),
            Long("pay-share") => o.pay_share = Some(num(p.value()?, "pay-share")?),
            Long("quantities") => o.quantities = quantities(p.value()?)?,
            Long("retry-same-key") => o.retry_same_key = num(p.value()?, "retry-same-key")?,
            Long("healthz-burst") => o.healthz_burst = num(p.value()?, "healthz-burst")?,
            other => return Err(other.unexpected().into()),
        }
    }
    o.sale_id = sale_id.ok_or_else(|| UsageError("--sale ID is required".into()))?;
    if o.key.is_some() && !hostile_given {
        o.hostile = 10;
    }
    if let Some(u) = url {
        (o.addr, o.host) = gateway_at(&u)?;
    }
    validate(&o)?;
    Ok(Parsed::Run(Box::new(o)))
}

/// The options before any argument: the gateway at `default_listen`, a
/// user prefix and seed from `now_s`.
fn defaults(default_listen: SocketAddr, now_s: u64) -> Options {
    Options {
        sale_id: 0,
        addr: default_listen,
        host: default_listen.to_string(),
        users: 50_000,
        connections: 64,
        duplicates: 0.05,
        rate: 0.0,
        hostile: 7,
        user_prefix: format!("u{now_s}"),
        seed: now_s,
        wait_open: false,
        drain_timeout: Duration::from_secs(120),
        timeout: Duration::from_secs(10),
        baseline: false,
        verify: true,
        json: false,
        report_json: None,
        pay_share: None,
        key: None,
        quantities: Vec::new(),
        retry_same_key: 0.0,
        outage: false,
        healthz_burst: 0,
    }
}

/// The address and `Host` of `--url` (`http://HOST:PORT`).
fn gateway_at(u: &str) -> Result<(SocketAddr, String), UsageError> {
    let hostport = u
        .strip_prefix("http://")
        .ok_or_else(|| UsageError(format!("--url {u:?}: only http://HOST:PORT")))?
        .trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| UsageError(format!("--url {u:?}: cannot resolve {hostport:?}")))?;
    Ok((addr, hostport.to_string()))
}

/// Refuses options out of range or that do not go together.
fn validate(o: &Options) -> Result<(), UsageError> {
    if o.pay_share.is_some_and(|f: f64| !(0.0..=1.0).contains(&f)) {
        return Err(UsageError("--pay-share: 0 to 1".into()));
    }
    if o.pay_share.is_some() && (o.baseline || !o.verify) {
        return Err(UsageError(
            "--pay-share needs the gateway and the checks (not --baseline or --no-verify)".into(),
        ));
    }
    if o.users == 0 || o.users > 10_000_000 {
        return Err(UsageError("--users: 1 to 10000000".into()));
    }
    if o.connections == 0 || o.connections > 4096 {
        return Err(UsageError("--connections: 1 to 4096".into()));
    }
    if !(0.0..=1.0).contains(&o.duplicates) {
        return Err(UsageError("--duplicates: a share from 0 to 1".into()));
    }
    if !(0.0..=1.0).contains(&o.retry_same_key) {
        return Err(UsageError("--retry-same-key: a share from 0 to 1".into()));
    }
    if o.keyed() && o.baseline {
        return Err(UsageError(
            "--quantities and --retry-same-key need the gateway (not --baseline)".into(),
        ));
    }
    if !(o.rate >= 0.0 && o.rate.is_finite()) {
        return Err(UsageError("--rate: 0 or more requests per second".into()));
    }
    let longest_id = format!("{}-{}", o.user_prefix, o.users);
    if !seckill_common::is_valid_token(&longest_id) {
        return Err(UsageError(format!(
            "--user-prefix {:?}: user ids must be 1-64 characters of A-Z a-z 0-9 _ . -",
            o.user_prefix
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }
    fn listen() -> SocketAddr {
        "127.0.0.1:8080".parse().unwrap()
    }

    #[test]
    fn defaults_and_overrides() {
        let Parsed::Run(o) = parse(args(&["--sale", "4"]), listen(), 99).unwrap() else {
            panic!("not a run")
        };
        assert_eq!((o.sale_id, o.users, o.connections), (4, 50_000, 64));
        assert_eq!(o.user_prefix, "u99");
        assert_eq!(o.host, "127.0.0.1:8080");
        let Parsed::Run(o) = parse(
            args(&[
                "--sale=5",
                "--url",
                "http://127.0.0.1:9000/",
                "--users",
                "10",
                "--duplicates",
                "0.1",
                "--drain-timeout",
                "500ms",
                "--json",
                "--report-json",
                "/tmp/r.json",
            ]),
            listen(),
            1,
        )
        .unwrap() else {
            panic!("not a run")
        };
        assert_eq!(o.addr.to_string(), "127.0.0.1:9000");
        assert_eq!(o.drain_timeout, Duration::from_millis(500));
        assert!(o.json && o.verify);
        assert_eq!(o.report_json, Some("/tmp/r.json".into()));
    }

    #[test]
    fn a_quantity_mix_and_retries_are_read() {
        let run = |a: &[&str]| match parse(args(a), listen(), 1).unwrap() {
            Parsed::Run(o) => o,
            Parsed::Help => panic!("not a run"),
        };
        let o = run(&["--sale", "1"]);
        assert!(!o.keyed() && o.quantities.is_empty());
        assert_eq!(o.max_quantity(), 1);
        let o = run(&[
            "--sale",
            "1",
            "--quantities",
            "70:20:10",
            "--retry-same-key",
            "0.5",
        ]);
        assert_eq!(
            (o.quantities.clone(), o.retry_same_key),
            (vec![70, 20, 10], 0.5)
        );
        assert!(o.keyed());
        assert_eq!(o.max_quantity(), 3);
        assert_eq!(
            run(&["--sale", "1", "--quantities", "5:0"]).max_quantity(),
            1
        );
        assert!(run(&["--sale", "1", "--retry-same-key", "0.1"]).keyed());
    }

    #[test]
    fn bad_lines_are_refused() {
        for bad in [
            &["--users", "5"][..],
            &["--sale", "x"],
            &["--sale", "1", "--duplicates", "2"],
            &["--sale", "1", "--url", "https://x:1"],
            &["--sale", "1", "--user-prefix", "a b"],
            &["--sale", "1", "--bogus"],
            &["--sale", "1", "--quantities", "0:0"],
            &["--sale", "1", "--quantities", "70:x"],
            &["--sale", "1", "--quantities", ""],
            &["--sale", "1", "--retry-same-key", "1.5"],
            &["--sale", "1", "--quantities", "1", "--baseline"],
        ] {
            assert!(parse(args(bad), listen(), 1).is_err(), "{bad:?}");
        }
    }
}
