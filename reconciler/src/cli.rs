//! Owns the command line: raw arguments are parsed with lexopt, then
//! validated into a typed [`Command`]; nothing here touches the network.

use crate::review::findings::FindingState;
use lexopt::prelude::*;
use seckill_common::timefmt::parse_time_ms;
use std::ffi::OsString;
use std::fmt;

/// The usage text printed by `--help` (a command-line error prints only
/// itself and a pointer to `--help`).
pub const USAGE: &str = "\
usage: seckill-reconciler COMMAND [OPTIONS]

commands:
  migrate                       create the MySQL database if missing and apply the schema
  sale create --sku SKU --stock N --starts-at T --ends-at T [--title TEXT] [--price-cents N]
              [--payment-window D [--rebuy-after-release]] [--shards K]
                                T: RFC 3339 (2026-11-29T20:00:00Z, +08:00 offsets too),
                                   now, now+30s, now+2h
                                D: 15m, 30s, 500ms: orders wait that long for their payment,
                                   then their unit goes back on sale (default: none, orders
                                   are final at creation); --rebuy-after-release lets the
                                   buyer of an expired or cancelled order buy again
                                K: split the stock over K buckets (1-64, default 1), each
                                   under its own hash tag
  sale load ID [--shards K]     put a MySQL sale into Redis unless Redis holds live state
                                (K: the sale's, which MySQL keeps; --shards only for a sale
                                created before migration 5, or to repeat the same K)
  sale show ID                  MySQL and Redis figures side by side (per bucket)
  sale rebalance ID             complete half-done transfers between the sale's buckets
                                and move units to empty ones (exit 1: archived, refused)
  sale repair ID --by NAME [--note TEXT]
                                rebuild a paused sale's Redis state from MySQL and resume it
  sale archive ID --by NAME     remove an ended sale's Redis keys (a tombstone stays) once
                                every order is final and a run found it clean (exit 1:
                                refused, nothing changed); `run` does it by itself
                                SECKILL_ARCHIVE_AFTER past the end (default 1h, off: never)
  sale list                     every sale: window, state, units total/left/reserved/ordered/paid,
                                paused and why
  sale pause ID --reason TEXT --by NAME [--dry-run]
                                refuse purchases (503 sale_paused) until `sale resume`
  sale resume ID --by NAME [--dry-run]
                                end an operator's pause (refused while Redis lost data of it)
  sale end ID --by NAME [--dry-run]
                                end the sale now (purchases 403 sale_ended; orders go on)
  sale extend ID --ends-at T --by NAME [--dry-run]
                                move the sale's end later
  sale add-stock ID N --by NAME [--dry-run]
                                put N more units on sale (MySQL, Redis, a stock-ledger row)
  run                           reconcile every active or recent sale (exit 1: open findings)
  findings [--state open|auto_fixed|resolved|all] [--sale ID] [--json]
                                list findings from the review store (default: open)
  resolve FINDING_ID (--reorder | --rollback | --dismiss) --by NAME [--note TEXT] [--dry-run]
                                --reorder   queue the order message again
                                --rollback  release the reservation in Redis (stock +1)
                                --dismiss   close the finding with the note
  token keygen --alg HS256|EdDSA --kid KID --out FILE [--public FILE]
                                add a new random key to the signing key file FILE (JWKS,
                                created when missing) and its verifying half to --public
                                (the gateway's SECKILL_AUTH_KEYS); prints the kid
  token issue --user U --key FILE [--ttl 10m] [--kid KID] [--audience A] [--count N]
                                print a buyer token for U signed with KID (default: the
                                file's last key that can sign); audience default
                                SECKILL_AUTH_AUDIENCE; --count N: N tokens, one a line,
                                for users U-0 .. U-(N-1) (benchmarks)
  bench-read ID                 time the bare reads of a sale's flow records, ledger
                                and orders (the benchmark's baseline); changes nothing

configuration comes from SECKILL_* environment variables (see README).
exit codes: 0 ok, 1 open findings (run) or a refused sale repair, archive, load or rebalance,
2 could not run (an unknown sale included), 64 bad command line";

/// A validated command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print usage.
    Help,
    /// Apply the MySQL schema.
    Migrate,
    /// Create a sale in MySQL and load it into Redis.
    SaleCreate(SaleCreate),
    /// Load sale ID into Redis, with the K of `--shards K` if given (else
    /// the K MySQL records).
    SaleLoad(u64, Option<u32>),
    /// Complete the open transfers of sale ID and refill its empty buckets.
    SaleRebalance(u64),
    /// Show sale ID.
    SaleShow(u64),
    /// Rebuild a paused sale's Redis state from MySQL and resume it.
    SaleRepair(RepairArgs),
    /// Archive an ended sale (`sale archive ID --by NAME`): sale, actor.
    SaleArchive(u64, String),
    /// List every sale (`sale list`, `sale_list_cmd.rs`).
    SaleList,
    /// Pause, resume, end, extend a sale or add stock to it
    /// (`sale_admin_cli.rs`, `sale_admin_cmd.rs`).
    SaleAdmin(crate::sale_admin_cli::SaleAdminArgs),
    /// One reconciliation pass.
    Run,
    /// List findings.
    Findings(FindingsArgs),
    /// Act on a finding.
    Resolve(ResolveArgs),
    /// Time the bare reads of sale ID.
    BenchRead(u64),
    /// Add a new key to key files.
    TokenKeygen(TokenKeygen),
    /// Print a buyer token.
    TokenIssue(TokenIssue),
}

/// Arguments of `token keygen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenKeygen {
    /// `--alg`.
    pub alg: seckill_common::token::Alg,
    /// `--kid`: the id rule (1-64 of `A-Z a-z 0-9 _ . -`).
    pub kid: String,
    /// `--out`: the signing key file.
    pub out: String,
    /// `--public`: the gateway's key file.
    pub public: Option<String>,
}

/// Arguments of `token issue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIssue {
    /// `--user`: the buyer (`sub`), the user id rule.
    pub user: String,
    /// `--key`: the signing key file.
    pub key: String,
    /// `--ttl` in whole seconds (1 s to 30 days; default 10 minutes).
    pub ttl_s: u64,
    /// `--kid`.
    pub kid: Option<String>,
    /// `--audience`.
    pub audience: Option<String>,
    /// `--count`: tokens for `U-0 .. U-(N-1)` instead of one for `U`.
    pub count: Option<u64>,
}

/// Arguments of `findings`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingsArgs {
    /// Only findings in this state; `None` for all.
    pub state: Option<FindingState>,
    /// Only this sale.
    pub sale: Option<u64>,
    /// JSON (an array of findings) instead of a table.
    pub json: bool,
}

/// What `resolve` does to the reservation of a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveAction {
    /// Queue the order message again.
    Reorder,
    /// Release the reservation in Redis.
    Rollback,
    /// Close the finding, changing nothing else.
    Dismiss,
}

impl ResolveAction {
    /// The action's name as logged in `actions`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveAction::Reorder => "reorder",
            ResolveAction::Rollback => "rollback",
            ResolveAction::Dismiss => "dismiss",
        }
    }
}

/// Arguments of `resolve`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveArgs {
    /// The finding's id.
    pub finding_id: i64,
    /// Exactly one of the three actions.
    pub action: ResolveAction,
    /// Who acts: 1-64 characters of `A-Z a-z 0-9 _ . - @`.
    pub by: String,
    /// Why; at most [`MAX_NOTE`] characters.
    pub note: Option<String>,
    /// Print what would change and change nothing.
    pub dry_run: bool,
}

/// Longest `--note`, in characters.
pub const MAX_NOTE: usize = 1000;

/// Flags (options without a value) that the commands accept.
const FLAGS: &[&str] = &[
    "json",
    "reorder",
    "rollback",
    "dismiss",
    "dry-run",
    "rebuy-after-release",
];

/// Arguments of `sale repair`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairArgs {
    /// The sale.
    pub sale_id: u64,
    /// Who asks (`--by`), as for `resolve`.
    pub by: String,
    /// Why (`--note`).
    pub note: Option<String>,
}

/// Arguments of `sale create`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleCreate {
    /// 1-64 characters of `A-Z a-z 0-9 _ . -`.
    pub sku: String,
    /// 1 ..= [`MAX_STOCK`] units.
    pub stock: u64,
    /// Window start, Unix ms.
    pub starts_at_ms: u64,
    /// Window end, Unix ms; after the start, at most [`MAX_WINDOW_MS`] later.
    pub ends_at_ms: u64,
    /// At most 255 characters.
    pub title: String,
    /// At most [`MAX_PRICE_CENTS`].
    pub price_cents: u64,
    /// `--payment-window`, ms (1 ms ..= [`MAX_PAYMENT_WINDOW_MS`]): orders
    /// are `pending_payment` until reservation time + this. `None` (the
    /// default): orders are final (`confirmed`) at creation.
    pub payment_window_ms: Option<u64>,
    /// `--rebuy-after-release` (only with a window): the buyer of an order
    /// that expired or was cancelled may buy again.
    pub rebuy_after_release: bool,
    /// `--shards K`: buckets (1 ..= `buckets::MAX_BUCKETS`, default 1);
    /// above 1 only without a payment window.
    pub shards: u32,
}

/// Longest payment window: 7 days in ms.
pub const MAX_PAYMENT_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;

/// Largest stock one sale may offer (a flash sale of more is a typo).
pub const MAX_STOCK: u64 = 100_000_000;
/// Longest sale window: 366 days in ms.
pub const MAX_WINDOW_MS: u64 = 366 * 24 * 3600 * 1000;
/// Furthest a sale may start or end from now: 10 years in ms (further is a
/// typo, or an overflow such as `now+99999999999999s`).
pub const MAX_AHEAD_MS: u64 = 10 * 366 * 24 * 3600 * 1000;
/// Highest price: one billion currency units, in cents.
pub const MAX_PRICE_CENTS: u64 = 100_000_000_000;

/// A command line that cannot be run: one line saying what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError(e.to_string())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

fn string(v: OsString, what: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError(format!("{what}: not valid UTF-8")))
}

/// The operator (`--by`, required: 1-64 of `A-Z a-z 0-9 _ . - @`) and the
/// note (`--note`, optional) of an audited action.
pub(crate) fn by_and_note(
    by: Option<String>,
    note: Option<String>,
) -> Result<(String, Option<String>), UsageError> {
    let by = by.ok_or_else(|| UsageError("--by NAME is required".into()))?;
    if !(1..=64).contains(&by.len())
        || !by
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-@".contains(&b))
    {
        return Err(UsageError(format!(
            "--by {by:?}: expected 1-64 characters of A-Z a-z 0-9 _ . - @"
        )));
    }
    if let Some(n) = &note {
        if n.chars().count() > MAX_NOTE || n.chars().any(|c| c.is_control() && c != '\n') {
            return Err(UsageError(format!(
                "--note: at most {MAX_NOTE} characters, no control characters"
            )));
        }
    }
    Ok((by, note))
}

pub(crate) fn parse_u64(v: &str, what: &str) -> Result<u64, UsageError> {
    v.parse()
        .map_err(|_| UsageError(format!("{what}: {v:?} is not a non-negative integer")))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    parse_at(args, seckill_common::now_ms())
}

/// The options of a command line, by name, in the order given (a flag's
/// value is empty); each is taken once by the command that knows it, and
/// any left over is an error.
pub(crate) struct Opts(Vec<(String, String)>);

impl Opts {
    /// Removes and returns the first value of option `--name`.
    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }
}

/// Splits the arguments into words and options; `None` for `--help`.
fn lex(
    args: impl IntoIterator<Item = OsString>,
) -> Result<Option<(Vec<String>, Opts)>, UsageError> {
    let mut p = lexopt::Parser::from_args(args);
    let mut words = Vec::new();
    let mut opts: Vec<(String, String)> = Vec::new();
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long(name) if FLAGS.contains(&name) => {
                let name = name.to_string();
                if p.optional_value().is_some() {
                    return err(format!("--{name} takes no value"));
                }
                opts.push((name, String::new()));
            }
            Long(name) => {
                let name = name.to_string();
                let v = string(p.value()?, &name)?;
                opts.push((name, v));
            }
            Value(v) => words.push(string(v, "argument")?),
            other => return Err(other.unexpected().into()),
        }
    }
    Ok(Some((words, Opts(opts))))
}

/// [`parse`] with the clock given (for `now+30s`), so tests are exact.
pub fn parse_at(
    args: impl IntoIterator<Item = OsString>,
    now_ms: u64,
) -> Result<Command, UsageError> {
    let Some((words, mut opts)) = lex(args)? else {
        return Ok(Command::Help);
    };
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let cmd = match words.as_slice() {
        [] | ["help"] => Command::Help,
        ["migrate"] => Command::Migrate,
        ["sale", "load", id] => {
            let id = parse_u64(id, "sale id")?;
            Command::SaleLoad(id, shards_given(&mut opts)?)
        }
        ["sale", "rebalance", id] => Command::SaleRebalance(parse_u64(id, "sale id")?),
        ["sale", "show", id] => Command::SaleShow(parse_u64(id, "sale id")?),
        ["sale", "repair", id] => {
            let sale_id = parse_u64(id, "sale id")?;
            let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
            Command::SaleRepair(RepairArgs { sale_id, by, note })
        }
        ["sale", "archive", id] => {
            let sale_id = parse_u64(id, "sale id")?;
            let (by, _) = by_and_note(opts.take("by"), None)?;
            Command::SaleArchive(sale_id, by)
        }
        ["sale", w, ..] if crate::sale_admin_cli::help(w).is_some() => {
            crate::sale_admin_cli::parse(&words, &mut opts, now_ms)?
        }
        ["run"] => Command::Run,
        ["bench-read", id] => Command::BenchRead(parse_u64(id, "sale id")?),
        ["token", "keygen"] => token_keygen(&mut opts)?,
        ["token", "issue"] => token_issue(&mut opts)?,
        ["findings"] => findings(&mut opts)?,
        ["resolve", id] => resolve(id, &mut opts)?,
        ["sale", "create"] => sale_create(&mut opts, now_ms)?,
        _ => return err(format!("unknown command: {}", words.join(" "))),
    };
    if let Some((name, _)) = opts.0.first() {
        return err(format!("unexpected option --{name}"));
    }
    Ok(cmd)
}

/// `token keygen --alg HS256|EdDSA --kid K --out FILE [--public FILE]`.
fn token_keygen(opts: &mut Opts) -> Result<Command, UsageError> {
    let alg = opts.take("alg").unwrap_or_default();
    let alg = seckill_common::token::Alg::parse(&alg)
        .ok_or_else(|| UsageError(format!("--alg {alg:?}: expected HS256 or EdDSA")))?;
    let kid = opts
        .take("kid")
        .ok_or_else(|| UsageError("--kid is required".into()))?;
    if !seckill_common::is_valid_token(&kid) {
        return err(format!(
            "--kid {kid:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let out = opts
        .take("out")
        .ok_or_else(|| UsageError("--out is required".into()))?;
    let public = opts.take("public");
    Ok(Command::TokenKeygen(TokenKeygen {
        alg,
        kid,
        out,
        public,
    }))
}

/// `token issue --user U --key FILE [--ttl 10m] [--kid K] [--audience A] [--count N]`.
fn token_issue(opts: &mut Opts) -> Result<Command, UsageError> {
    let user = opts
        .take("user")
        .ok_or_else(|| UsageError("--user is required".into()))?;
    if !seckill_common::is_valid_token(&user) {
        return err(format!(
            "--user {user:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let key = opts
        .take("key")
        .ok_or_else(|| UsageError("--key is required".into()))?;
    let ttl = opts.take("ttl").unwrap_or_else(|| "10m".into());
    let ttl_s = humantime::parse_duration(&ttl)
        .ok()
        .map(|d| d.as_secs())
        .filter(|s| (1..=30 * 24 * 3600).contains(s))
        .ok_or_else(|| {
            UsageError(format!(
                "--ttl {ttl:?}: expected a duration from 1s to 30d, such as 10m"
            ))
        })?;
    let kid = opts.take("kid");
    let audience = opts.take("audience");
    let count = match opts.take("count") {
        None => None,
        Some(c) => Some(parse_u64(&c, "--count")?.clamp(1, 100_000_000)),
    };
    if count.is_some() && !seckill_common::is_valid_token(&format!("{user}-99999999")) {
        return err("--user with --count: U-N must stay within 64 characters");
    }
    Ok(Command::TokenIssue(TokenIssue {
        user,
        key,
        ttl_s,
        kid,
        audience,
        count,
    }))
}

/// `findings [--state S] [--sale ID] [--json]`.
fn findings(opts: &mut Opts) -> Result<Command, UsageError> {
    let state = match opts.take("state").as_deref() {
        None => Some(FindingState::Open),
        Some("all") => None,
        Some(s) if s.parse::<FindingState>().is_ok() => s.parse().ok(),
        Some(other) => {
            return err(format!(
                "--state {other:?}: expected open, auto_fixed, resolved or all"
            ))
        }
    };
    let sale = match opts.take("sale") {
        Some(s) => Some(parse_u64(&s, "--sale")?),
        None => None,
    };
    let json = opts.take("json").is_some();
    Ok(Command::Findings(FindingsArgs { state, sale, json }))
}

/// `resolve ID --reorder|--rollback|--dismiss --by NAME [--note] [--dry-run]`.
fn resolve(id: &str, opts: &mut Opts) -> Result<Command, UsageError> {
    let finding_id: i64 = id
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| UsageError(format!("finding id: {id:?} is not a positive integer")))?;
    let mut actions = Vec::new();
    for (flag, action) in [
        ("reorder", ResolveAction::Reorder),
        ("rollback", ResolveAction::Rollback),
        ("dismiss", ResolveAction::Dismiss),
    ] {
        while opts.take(flag).is_some() {
            actions.push(action);
        }
    }
    let [action] = actions.as_slice() else {
        return err("resolve needs exactly one of --reorder, --rollback, --dismiss");
    };
    let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
    let dry_run = opts.take("dry-run").is_some();
    Ok(Command::Resolve(ResolveArgs {
        finding_id,
        action: *action,
        by,
        note,
        dry_run,
    }))
}

/// `sale create --sku --stock --starts-at --ends-at [--title] [--price-cents]`.
fn sale_create(opts: &mut Opts, now_ms: u64) -> Result<Command, UsageError> {
    let sku = opts
        .take("sku")
        .ok_or_else(|| UsageError("--sku is required".into()))?;
    let stock = opts
        .take("stock")
        .ok_or_else(|| UsageError("--stock is required".into()))?;
    let starts = opts
        .take("starts-at")
        .ok_or_else(|| UsageError("--starts-at is required".into()))?;
    let ends = opts
        .take("ends-at")
        .ok_or_else(|| UsageError("--ends-at is required".into()))?;
    let title = opts.take("title").unwrap_or_default();
    let price = opts.take("price-cents").unwrap_or_else(|| "0".into());
    if !seckill_common::is_valid_token(&sku) {
        return err(format!(
            "--sku {sku:?}: expected {}",
            seckill_common::TOKEN_RULE
        ));
    }
    let stock: u64 = stock
        .parse()
        .ok()
        .filter(|n| (1..=MAX_STOCK).contains(n))
        .ok_or_else(|| {
            UsageError(format!(
                "--stock {stock:?}: expected an integer from 1 to {MAX_STOCK}"
            ))
        })?;
    let starts_at_ms = parse_time_ms(&starts, now_ms)
        .map_err(|e| UsageError(format!("--starts-at {starts:?}: {e}")))?;
    let ends_at_ms =
        parse_time_ms(&ends, now_ms).map_err(|e| UsageError(format!("--ends-at {ends:?}: {e}")))?;
    for (name, given, ms) in [
        ("--starts-at", &starts, starts_at_ms),
        ("--ends-at", &ends, ends_at_ms),
    ] {
        if ms > now_ms.saturating_add(MAX_AHEAD_MS) {
            return err(format!("{name} {given:?}: more than 10 years ahead"));
        }
    }
    if ends_at_ms <= starts_at_ms {
        return err("--ends-at must be after --starts-at");
    }
    if ends_at_ms - starts_at_ms > MAX_WINDOW_MS {
        return err("the sale window is longer than 366 days");
    }
    if ends_at_ms <= now_ms {
        return err("--ends-at is in the past: the sale would never open");
    }
    if title.chars().count() > 255 || title.chars().any(char::is_control) {
        return err("--title: at most 255 characters, no control characters");
    }
    let price_cents = parse_u64(&price, "--price-cents")?;
    if price_cents > MAX_PRICE_CENTS {
        return err(format!("--price-cents: at most {MAX_PRICE_CENTS}"));
    }
    let payment_window_ms = match opts.take("payment-window") {
        None => None,
        Some(w) => Some(
            humantime::parse_duration(&w)
                .ok()
                .map(|d| d.as_millis() as u64)
                .filter(|ms| (1..=MAX_PAYMENT_WINDOW_MS).contains(ms))
                .ok_or_else(|| {
                    UsageError(format!(
                        "--payment-window {w:?}: expected a duration from 1ms to 7d (15m, 30s)"
                    ))
                })?,
        ),
    };
    let rebuy_after_release = opts.take("rebuy-after-release").is_some();
    if rebuy_after_release && payment_window_ms.is_none() {
        return err("--rebuy-after-release needs --payment-window");
    }
    let shards = shards(opts)?;
    Ok(Command::SaleCreate(SaleCreate {
        sku,
        stock,
        starts_at_ms,
        ends_at_ms,
        title,
        price_cents,
        payment_window_ms,
        rebuy_after_release,
        shards,
    }))
}

/// `--shards K`: 1 when absent.
fn shards(opts: &mut Opts) -> Result<u32, UsageError> {
    Ok(shards_given(opts)?.unwrap_or(1))
}

/// `--shards K`: `None` when absent.
fn shards_given(opts: &mut Opts) -> Result<Option<u32>, UsageError> {
    let max = seckill_common::buckets::MAX_BUCKETS;
    match opts.take("shards") {
        None => Ok(None),
        Some(k) => k
            .parse()
            .ok()
            .filter(|k| (1..=max).contains(k))
            .map(Some)
            .ok_or_else(|| {
                UsageError(format!(
                    "--shards {k:?}: expected an integer from 1 to {max}"
                ))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, UsageError> {
        parse_at(s.split_whitespace().map(OsString::from), 1_790_000_000_000)
    }

    #[test]
    fn sale_create_accepts_relative_and_absolute_times() {
        let c = p("sale create --sku A-1 --stock 10 --starts-at now+30s --ends-at 2027-01-15T08:00:00+08:00 --price-cents 1999").unwrap();
        assert_eq!(
            c,
            Command::SaleCreate(SaleCreate {
                sku: "A-1".into(),
                stock: 10,
                starts_at_ms: 1_790_000_030_000,
                ends_at_ms: 1_799_971_200_000,
                title: String::new(),
                price_cents: 1999,
                payment_window_ms: None,
                rebuy_after_release: false,
                shards: 1,
            })
        );
        let c = p("sale create --sku A-1 --stock 10 --starts-at now --ends-at now+1h --payment-window 15m --rebuy-after-release").unwrap();
        let Command::SaleCreate(c) = c else {
            panic!("not a sale create: {c:?}")
        };
        assert_eq!(c.payment_window_ms, Some(900_000));
        assert!(c.rebuy_after_release);
    }

    #[test]
    fn sale_create_rejects_bad_values() {
        // Each refusal with its exact message.
        for (bad, why) in [
            (
                "sale create --sku A --stock 0 --starts-at now --ends-at now+1h",
                "--stock \"0\": expected an integer from 1 to 100000000",
            ),
            (
                "sale create --sku A --stock -5 --starts-at now --ends-at now+1h",
                "--stock \"-5\": expected an integer from 1 to 100000000",
            ),
            (
                "sale create --sku A --stock 1000000000 --starts-at now --ends-at now+1h",
                "--stock \"1000000000\": expected an integer from 1 to 100000000",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now+1h --ends-at now",
                "--ends-at must be after --starts-at",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now --ends-at now",
                "--ends-at must be after --starts-at",
            ),
            (
                "sale create --sku A --stock 5 --starts-at yesterday --ends-at now+1h",
                "--starts-at \"yesterday\": expected RFC 3339 (2026-11-29T20:00:00Z), now or now+30s",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now --ends-at now+1000d",
                "the sale window is longer than 366 days",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now+99999999999999s --ends-at now+1h",
                "--starts-at \"now+99999999999999s\": more than 10 years ahead",
            ),
            (
                "sale create --sku a/b --stock 5 --starts-at now --ends-at now+1h",
                "--sku \"a/b\": expected 1-64 characters of A-Z a-z 0-9 _ . -",
            ),
            (
                "sale create --stock 5 --starts-at now --ends-at now+1h",
                "--sku is required",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now --ends-at now+1h --price-cents 1e9",
                "--price-cents: \"1e9\" is not a non-negative integer",
            ),
            (
                "sale create --sku A --stock 5 --starts-at now --ends-at now+1h --colour red",
                "unexpected option --colour",
            ),
            (
                "sale load x",
                "sale id: \"x\" is not a non-negative integer",
            ),
            (
                "sale frobnicate 1",
                "unknown command: sale frobnicate 1",
            ),
        ] {
            assert_eq!(p(bad).unwrap_err().to_string(), why, "{bad}");
        }
    }

    #[test]
    fn simple_commands_parse() {
        assert_eq!(p("migrate").unwrap(), Command::Migrate);
        assert_eq!(p("sale load 42").unwrap(), Command::SaleLoad(42, None));
        assert_eq!(
            p("sale load 42 --shards 3").unwrap(),
            Command::SaleLoad(42, Some(3))
        );
        assert_eq!(
            p("sale load 42 --shards 1").unwrap(),
            Command::SaleLoad(42, Some(1))
        );
        assert_eq!(p("sale rebalance 9").unwrap(), Command::SaleRebalance(9));
        let c = p("sale create --sku A --stock 9 --starts-at now --ends-at now+1h --shards 3");
        let Ok(Command::SaleCreate(c)) = c else {
            panic!("{c:?}")
        };
        assert_eq!(c.shards, 3);
        for bad in ["0", "65", "x"] {
            let e = p(&format!(
                "sale create --sku A --stock 9 --starts-at now --ends-at now+1h --shards {bad}"
            ));
            assert!(e.unwrap_err().0.contains("--shards"), "{bad}");
        }
        let c = p("sale create --sku A --stock 9 --starts-at now --ends-at now+1h --shards 2 --payment-window 1m");
        let Ok(Command::SaleCreate(c)) = c else {
            panic!("{c:?}")
        };
        assert_eq!((c.shards, c.payment_window_ms), (2, Some(60_000)));
        assert_eq!(p("sale show 7").unwrap(), Command::SaleShow(7));
        assert_eq!(
            p("sale repair 7 --by alice").unwrap(),
            Command::SaleRepair(RepairArgs {
                sale_id: 7,
                by: "alice".into(),
                note: None
            })
        );
        assert_eq!(
            p("sale archive 7 --by alice").unwrap(),
            Command::SaleArchive(7, "alice".into())
        );
        assert_eq!(
            p("sale archive 7").unwrap_err().to_string(),
            "--by NAME is required"
        );
        assert_eq!(
            p("sale repair 7").unwrap_err().to_string(),
            "--by NAME is required"
        );
        assert_eq!(p("--help").unwrap(), Command::Help);
        assert_eq!(p("run").unwrap(), Command::Run);
        assert_eq!(p("bench-read 3").unwrap(), Command::BenchRead(3));
    }

    #[test]
    fn findings_and_resolve_parse_and_validate() {
        assert_eq!(
            p("findings").unwrap(),
            Command::Findings(FindingsArgs {
                state: Some(FindingState::Open),
                sale: None,
                json: false
            })
        );
        assert_eq!(
            p("findings --state all --sale 4 --json").unwrap(),
            Command::Findings(FindingsArgs {
                state: None,
                sale: Some(4),
                json: true
            })
        );
        assert_eq!(
            p("resolve 12 --rollback --by alice --dry-run").unwrap(),
            Command::Resolve(ResolveArgs {
                finding_id: 12,
                action: ResolveAction::Rollback,
                by: "alice".into(),
                note: None,
                dry_run: true,
            })
        );
        // Each refusal with its exact message.
        for (bad, why) in [
            (
                "findings --state closed",
                "--state \"closed\": expected open, auto_fixed, resolved or all",
            ),
            (
                "resolve 1 --by alice",
                "resolve needs exactly one of --reorder, --rollback, --dismiss",
            ),
            (
                "resolve 1 --reorder --rollback --by alice",
                "resolve needs exactly one of --reorder, --rollback, --dismiss",
            ),
            ("resolve 1 --dismiss", "--by NAME is required"),
            (
                "resolve 0 --dismiss --by alice",
                "finding id: \"0\" is not a positive integer",
            ),
            (
                "resolve 1 --dismiss --by a/b",
                "--by \"a/b\": expected 1-64 characters of A-Z a-z 0-9 _ . - @",
            ),
            (
                "resolve 1 --dismiss=yes --by alice",
                "--dismiss takes no value",
            ),
            ("run --json", "unexpected option --json"),
        ] {
            assert_eq!(p(bad).unwrap_err().to_string(), why, "{bad}");
        }
    }
}
