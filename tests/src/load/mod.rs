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
    let open_store = || state::Store::open(o.sale_id, redis_url, &config.mysql_url, o.timeout);
    let mut store = if needs_store {
        Some(open_store()?)
    } else {
        None
    };
    let opening = match store.as_mut() {
        Some(st) => read_opening(st, o)?,
        None => Opening::default(),
    };
    let spec = plan::PlanSpec {
        users: o.users,
        duplicates: o.duplicates,
        hostile: o.hostile,
        spread: o.connections,
        seed: o.seed,
        identity: o.key.is_some(),
    };
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
    let sale = opening.sale;
    let starts = sale.map(|s| s.starts_at_ms);
    let rep = report::Report {
        sale_id: o.sale_id,
        users: o.users,
        second_clicks: plan::duplicate_count(&spec),
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
    };
    publish(o, &rep)?;
    Ok(rep.ok())
}

/// The sale as the crowd starts: its row, the units reserved before the
/// run, and (with `--wait-open`) when to send the first request.
#[derive(Default)]
struct Opening {
    sale: Option<state::SaleRow>,
    reserved_before: u64,
    open_at: Option<Instant>,
}

/// Reads the sale's row and the units reserved so far, and with
/// `--wait-open` the instant the sale opens.
///
/// Errors: Redis or MySQL cannot be read, or the sale is unknown.
fn read_opening(st: &mut state::Store, o: &cli::Options) -> Result<Opening, LoadError> {
    let row = st.sale()?;
    let reserved_before = st.reserved_so_far()?;
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
        .keys
        .iter()
        .rev()
        .find(|k| k.can_sign())
        .ok_or_else(|| LoadError::Key(format!("{}: no key that can sign", path.display())))?;
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
    v.redis = st.redis_state()?;
    v.mysql = Some(st.mysql_state()?);
    let facts = invariants::Facts {
        total_stock: opening.sale.map_or(0, |s| s.total_stock),
        reserved_before: opening.reserved_before,
        user_prefix: &o.user_prefix,
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
    })
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
