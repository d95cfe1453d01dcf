//! The load simulator behind `seckill-load`: a flash-sale crowd over
//! keep-alive HTTP/1.1, then the invariants checked against the gateway's
//! answers, Redis and MySQL.
//!
//! # Layout
//!
//! - [`cli`]: the command line, parsed and validated into options.
//! - [`plan`]: who clicks when (seeded shuffle, double clicks, hostile requests).
//! - [`http`]: the keep-alive HTTP/1.1 client over `TcpStream`.
//! - [`drive`]: one thread per connection sends the plan and records every answer.
//! - [`state`]: what is read from Redis and MySQL, and the wait for the workers.
//! - [`invariants`]: the answers counted and every invariant checked (pure).
//! - [`lifecycle`]: `--pay-share`: payments, expiries and the resale after
//!   the crowd, and their invariants.
//! - [`timeline`]: the sale's figures sampled over time and the answers
//!   bucketed by time, for the HTML report (`report_html.rs`).
//! - [`report`]: the report as text or JSON.

pub mod cli;
pub mod drive;
pub mod http;
pub mod invariants;
pub mod lifecycle;
pub mod plan;
pub mod report;
pub mod state;
pub mod timeline;

use std::fmt;
use std::time::{Duration, Instant};

/// Why a run could not be made (distinct from "an invariant failed").
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// Redis or MySQL could not be read.
    State(state::StateError),
    /// The `--key` file cannot be used, or holds no key that can sign.
    Key(String),
    /// Nothing accepts connections at the gateway's address (checked once
    /// before the crowd is sent: a run where no request can be answered is
    /// no run, whatever `--no-verify` says).
    Unreachable(std::net::SocketAddr, std::io::Error),
    /// The `--report-json` file cannot be written.
    Report(std::path::PathBuf, std::io::Error),
    /// `--pay-share` cannot run on this sale or configuration.
    Lifecycle(String),
    /// `--quantities` asks for more units per purchase than the sale sells.
    Quantities(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::State(e) => write!(f, "cannot check the sale: {e}"),
            LoadError::Key(e) => write!(f, "--key: {e}"),
            LoadError::Unreachable(addr, e) => {
                write!(f, "cannot connect to the gateway at {addr}: {e}")
            }
            LoadError::Report(path, e) => write!(f, "--report-json {}: {e}", path.display()),
            LoadError::Lifecycle(e) => write!(f, "--pay-share: {e}"),
            LoadError::Quantities(e) => write!(f, "--quantities: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

impl From<state::StateError> for LoadError {
    fn from(e: state::StateError) -> Self {
        LoadError::State(e)
    }
}

/// Runs the crowd described by `o` against the gateway, verifies (unless
/// `--no-verify`) and prints the report on stdout. Returns whether every
/// invariant held.
///
/// Errors: [`LoadError`] when Redis or MySQL cannot be read, the key
/// cannot sign, or the gateway does not accept a connection.
pub fn run(o: &cli::Options, config: &seckill_common::Config) -> Result<bool, LoadError> {
    std::net::TcpStream::connect_timeout(&o.addr, o.timeout)
        .map_err(|e| LoadError::Unreachable(o.addr, e))?;
    let needs_store = o.verify || o.wait_open;
    let redis_url = (!o.baseline).then_some(config.redis_url.as_str());
    let open_store = || {
        let mut st = state::Store::open(o.sale_id, redis_url, &config.mysql_url, o.timeout)?;
        st.count_units(o.keyed());
        Ok::<_, state::StateError>(st)
    };
    let mut store = if needs_store {
        Some(open_store()?)
    } else {
        None
    };
    let opening = match store.as_mut() {
        Some(st) => read_opening(st, o)?,
        None => Opening::default(),
    };
    let spec = plan_spec(o);
    let steps = plan::build(&spec);
    let tokens = mint_tokens(o, config)?;
    let drive_spec = drive::DriveSpec {
        addr: o.addr,
        host: &o.host,
        sale_id: o.sale_id,
        user_prefix: &o.user_prefix,
        connections: o.connections,
        rate: o.rate,
        timeout: o.timeout,
        tokens: tokens.as_ref(),
        keys: o.keyed(),
        lead: plan::lead(&steps),
    };
    let requests = drive::format_all(&drive_spec, &steps);
    if let Some(at) = opening.open_at {
        wait_for_opening(at, requests.len(), o.sale_id);
    }
    // Its own connections, opened before the crowd so its first sample
    // shows the sale as it opened.
    let sampler = match (o.verify, needs_store) {
        (true, true) => Some(timeline::Sampler::start(open_store()?)),
        _ => None,
    };
    let outcome = drive::run(&drive_spec, &requests);
    let tally = invariants::tally(&steps, &outcome.records);
    let mut v = Verified::default();
    if let (true, Some(st)) = (o.verify, store.as_mut()) {
        v = verify(o, st, &opening, &tally)?;
        if let (Some(share), Some(row)) = (o.pay_share, opening.sale) {
            let lspec = lifecycle_spec(o, config, row, share, tokens.as_ref())?;
            eprintln!("load: the order lifecycle: payments, expiries, resale");
            let l = lifecycle::run(&lspec, &steps, &outcome.records, st)?;
            v.checks.extend(lifecycle::checks(&lspec, &l));
            v.life = Some(l);
        }
    }
    let timeline = sampler.map(|s| timeline_json(s, &outcome));
    let healthz = (o.healthz_burst > 0).then(|| healthz_burst(&drive_spec, o.healthz_burst));
    let sale = opening.sale;
    let starts = sale.map(|s| s.starts_at_ms);
    let rep = report::Report {
        sale_id: o.sale_id,
        users: o.users,
        second_clicks: plan::duplicate_count(&spec),
        retries: plan::retry_count(&spec),
        limits: o.keyed().then_some(opening.limits),
        redis_read_failures: store.as_ref().map_or(0, state::Store::redis_failures),
        connections: o.connections,
        seed: o.seed,
        total_stock: sale.map_or(0, |s| s.total_stock),
        tally: &tally,
        elapsed_s: outcome.elapsed.as_secs_f64(),
        errors: &outcome.errors,
        connects: outcome.connects,
        cpu_us: outcome.cpu_us,
        redis: v.redis.as_ref(),
        mysql: v.mysql.as_ref(),
        drain_ms: v.drain_ms,
        open_to_first_request_ms: starts.map(|s| outcome.started_at_ms as i64 - s),
        open_to_last_202_ms: starts
            .zip(tally.last_202_ms)
            .map(|(s, d)| outcome.started_at_ms as i64 + d as i64 - s),
        open_to_last_order_ms: starts
            .zip(v.mysql.as_ref().and_then(|m| m.last_order_ms))
            .map(|(s, last)| last - s),
        checks: &v.checks,
        lifecycle: v.life.as_ref(),
        timeline,
        healthz,
    };
    publish(o, &rep)?;
    Ok(rep.ok())
}

/// What the plan is made of, from the command line.
fn plan_spec(o: &cli::Options) -> plan::PlanSpec {
    plan::PlanSpec {
        users: o.users,
        duplicates: o.duplicates,
        hostile: o.hostile,
        spread: o.connections,
        seed: o.seed,
        identity: o.key.is_some(),
        quantities: o.quantities.clone(),
        retry_same_key: o.retry_same_key,
    }
}

/// The sale as the crowd starts: its row, the units reserved before the
/// run, and (with `--wait-open`) when to send the first request.
#[derive(Default)]
struct Opening {
    sale: Option<state::SaleRow>,
    limits: state::Limits,
    reserved_before: u64,
    open_at: Option<Instant>,
}

/// How long a read of Redis that fails is tried again before the run
/// gives up (a restart of Redis takes a few seconds).
const REDIS_RETRY: Duration = Duration::from_secs(30);

/// Reads the sale's row, its limits and the units reserved so far, and
/// with `--wait-open` the instant the sale opens.
///
/// Errors: Redis or MySQL cannot be read, the sale is unknown, or the
/// `--quantities` mix asks for more units than the sale's Q.
fn read_opening(st: &mut state::Store, o: &cli::Options) -> Result<Opening, LoadError> {
    let row = st.sale()?;
    let limits = st.retrying("the sale's limits", REDIS_RETRY, state::Store::limits)?;
    if o.max_quantity() > limits.per_purchase {
        return Err(LoadError::Quantities(format!(
            "the mix asks for up to {} units per purchase; sale {} sells at most {} \
             (max_per_purchase; sale create --max-per-buyer/--max-per-purchase)",
            o.max_quantity(),
            o.sale_id,
            limits.per_purchase
        )));
    }
    let reserved_before = st.retrying("the units reserved", REDIS_RETRY, |s| {
        s.reserved_so_far(limits)
    })?;
    let mut open_at = None;
    if o.wait_open {
        // A small margin so Redis's clock (the one that decides) agrees.
        // The wait is served after the plan and every request are
        // made, so the crowd's first request leaves at the opening.
        let wait_ms = row.starts_at_ms - row.mysql_now_ms + 30;
        if wait_ms > 0 {
            open_at = Some(Instant::now() + Duration::from_millis(wait_ms as u64));
        }
    }
    Ok(Opening {
        sale: Some(row),
        limits,
        reserved_before,
        open_at,
    })
}

/// With `--key`, a token per user signed by the file's last key that can
/// sign; `None` without.
///
/// Errors: [`LoadError::Key`] when the file cannot be used or holds no key
/// that can sign.
fn mint_tokens(
    o: &cli::Options,
    config: &seckill_common::Config,
) -> Result<Option<drive::Tokens>, LoadError> {
    let Some(path) = &o.key else {
        return Ok(None);
    };
    let set = seckill_common::token::load(path)
        .map_err(|e| LoadError::Key(format!("{}: {e}", path.display())))?;
    let key = set
        .signing_key(&path.display().to_string())
        .map_err(LoadError::Key)?;
    eprintln!("load: minting {} tokens with key {}", o.users, key.kid);
    // Valid well past the longest run (drain timeout included).
    let ttl_s = 3600 + o.drain_timeout.as_secs();
    drive::Tokens::mint(key, &config.auth_audience, &o.user_prefix, o.users, ttl_s)
        .map(Some)
        .map_err(|e| LoadError::Key(e.to_string()))
}

/// Sleeps until `at`, the sale's opening, saying so on stderr.
fn wait_for_opening(at: Instant, requests: usize, sale_id: u64) {
    let left = at.saturating_duration_since(Instant::now());
    eprintln!(
        "load: {requests} requests ready; waiting {} ms for sale {sale_id} to open",
        left.as_millis(),
    );
    std::thread::sleep(left);
}

/// What the verification found: the drain's wait, Redis's and MySQL's
/// state after it, every check, and the order lifecycle's outcome.
#[derive(Default)]
struct Verified {
    drain_ms: Option<u64>,
    redis: Option<state::RedisState>,
    mysql: Option<state::MysqlState>,
    checks: Vec<invariants::Check>,
    life: Option<lifecycle::LifecycleOutcome>,
}

/// Waits for the workers to drain the queue (not in `--baseline`), reads
/// Redis and MySQL and checks every invariant of the crowd's `tally`.
///
/// Errors: Redis or MySQL cannot be read.
fn verify(
    o: &cli::Options,
    st: &mut state::Store,
    opening: &Opening,
    tally: &invariants::Tally,
) -> Result<Verified, LoadError> {
    let mut v = Verified::default();
    let mut drained = true;
    if !o.baseline {
        eprintln!("load: waiting for the workers to drain the queue");
        let (ok, waited) = st.wait_drained(o.drain_timeout)?;
        drained = ok;
        v.drain_ms = Some(waited.as_millis() as u64);
    }
    v.redis = st.retrying("the sale", REDIS_RETRY, state::Store::redis_state)?;
    v.mysql = Some(st.mysql_state(opening.limits.per_buyer)?);
    let facts = invariants::Facts {
        sale_id: o.sale_id,
        total_stock: opening.sale.map_or(0, |s| s.total_stock),
        reserved_before: opening.reserved_before,
        user_prefix: &o.user_prefix,
        limits: opening.limits,
        units: o.keyed(),
        outage: o.outage,
        drained,
        redis: v.redis.as_ref(),
        mysql: v.mysql.as_ref(),
    };
    v.checks = invariants::checks(tally, &facts);
    Ok(v)
}

/// What `--pay-share` runs on sale `row`: its price and payment window,
/// the payment secret, the crowd's users and tokens.
///
/// Errors: [`LoadError::Lifecycle`] when the sale has no payment window or
/// `SECKILL_PAYMENT_SECRET` is not set.
fn lifecycle_spec<'a>(
    o: &'a cli::Options,
    config: &'a seckill_common::Config,
    row: state::SaleRow,
    share: f64,
    tokens: Option<&'a drive::Tokens>,
) -> Result<lifecycle::LifecycleSpec<'a>, LoadError> {
    let window_ms = row.payment_window_ms.ok_or_else(|| {
        LoadError::Lifecycle("the sale has no payment window (sale create --payment-window)".into())
    })?;
    let secret = config
        .payment_secret
        .as_ref()
        .ok_or_else(|| LoadError::Lifecycle("SECKILL_PAYMENT_SECRET is not set".into()))?;
    Ok(lifecycle::LifecycleSpec {
        addr: o.addr,
        host: &o.host,
        sale_id: o.sale_id,
        user_prefix: &o.user_prefix,
        timeout: o.timeout,
        tokens,
        pay_share: share,
        secret: &secret.0,
        price_cents: row.price_cents,
        window_ms,
        total_stock: row.total_stock,
        wait: o.drain_timeout,
        keys: o.keyed(),
    })
}

/// Sends `n` `GET /healthz` over the crowd's connections, as fast as they
/// are answered: the rate of the cheapest answer of the same gateway, to
/// print beside the crowd's.
fn healthz_burst(spec: &drive::DriveSpec<'_>, n: u32) -> report::Burst {
    eprintln!(
        "load: health check: {n} GET /healthz over {} connections",
        spec.connections
    );
    let req = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", spec.host).into_bytes();
    let requests = vec![req; n as usize];
    let quiet = drive::DriveSpec {
        rate: 0.0,
        lead: 0,
        ..*spec
    };
    let out = drive::run(&quiet, &requests);
    report::Burst {
        requests: u64::from(n),
        ok: out.records.iter().filter(|r| r.status == 200).count() as u64,
        elapsed_s: out.elapsed.as_secs_f64(),
    }
}

/// Stops the sampler and gives the timeline of the run for the report.
fn timeline_json(s: timeline::Sampler, outcome: &drive::Outcome) -> serde_json::Value {
    let (samples, failed) = s.stop();
    timeline::to_json(
        outcome.started_at_ms,
        &timeline::buckets(&outcome.records),
        &samples,
        failed,
    )
}

/// Writes the report: to `--report-json`'s file when given, and on stdout
/// as JSON (`--json`) or text.
///
/// Errors: [`LoadError::Report`] when the file cannot be written.
fn publish(o: &cli::Options, rep: &report::Report<'_>) -> Result<(), LoadError> {
    if let Some(path) = &o.report_json {
        std::fs::write(path, format!("{}\n", rep.to_json()))
            .map_err(|e| LoadError::Report(path.clone(), e))?;
    }
    if o.json {
        println!("{}", rep.to_json());
    } else {
        print!("{}", rep.to_text());
    }
    Ok(())
}
