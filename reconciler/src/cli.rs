//! Owns the command line: raw arguments are lexed with lexopt, then
//! validated into a typed [`Command`] by the command's own `parse` (in
//! `cmd/`) from its match arm here, with the bounds and helpers they share;
//! nothing here touches the network. The help texts, and each command's
//! positional arguments, are in `cli_help.rs`: a command path is checked
//! there (a missing argument is named) before its match arm here reads it.

use crate::cli_help::{self, PROGRAM};
use crate::cmd::dead_letter::DeadLetterList;
use crate::cmd::findings::FindingsArgs;
use crate::cmd::payment_dlq::{PaymentDeadLetterAction, PaymentDeadLetterArgs};
use crate::cmd::repair::RepairArgs;
use crate::cmd::resolve::ResolveArgs;
use crate::cmd::sale_create::SaleCreate;
use crate::cmd::token::{TokenIssue, TokenKeygen};
use lexopt::prelude::*;
use std::ffi::OsString;
use std::fmt;

/// A validated command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print this help text (`--help`, `COMMAND --help`, `help`).
    Help(String),
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
    /// List every sale (`sale list`, `cmd/sale_list.rs`).
    SaleList,
    /// Pause, resume, end, extend a sale or add stock to it
    /// (`sale_admin_cli.rs`, `cmd/sale_admin.rs`).
    SaleAdmin(crate::sale_admin_cli::SaleAdminArgs),
    /// One reconciliation pass.
    Run,
    /// List findings.
    Findings(FindingsArgs),
    /// Show one finding whole (`findings show ID [--json]`): id, JSON.
    FindingsShow(i64, bool),
    /// Act on a finding.
    Resolve(ResolveArgs),
    /// `resolve all --kind KIND --sale ID ...`: every open finding of a kind.
    ResolveAll(crate::cmd::resolve_all::ResolveAllArgs),
    /// The reliable queues of one sale (`Some`) or every sale, and of
    /// payments.
    QueueShow(Option<u64>),
    /// List a dead-letter list.
    DeadLetterList(DeadLetterList),
    /// Requeue or drop a payment dead letter.
    PaymentDeadLetter(PaymentDeadLetterArgs),
    /// Drop a sale's dead letter that names no reservation.
    SaleDeadLetterDrop(crate::cmd::sale_dlq::SaleDeadLetterDropArgs),
    /// Add a new key to key files.
    TokenKeygen(TokenKeygen),
    /// Print a buyer token.
    TokenIssue(TokenIssue),
}

/// Longest `--note`, in characters.
pub const MAX_NOTE: usize = 1000;

/// Flags (options without a value) that the commands accept.
const FLAGS: &[&str] = &[
    "json",
    "reorder",
    "rollback",
    "recreate",
    "dismiss",
    "dry-run",
    "rebuy-after-release",
];

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

/// A command line that cannot be run: what is wrong, and the command whose
/// `--help` tells what is right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError {
    /// One line (a missing subcommand adds the list of them).
    pub message: String,
    /// The command path the pointer names (`resolve`, `sale`); empty for
    /// the top-level help.
    pub command: &'static str,
}

impl UsageError {
    /// An error of no particular command.
    pub fn new(message: impl Into<String>) -> UsageError {
        UsageError {
            message: message.into(),
            command: "",
        }
    }

    /// The same error, pointing at `command --help` unless it already
    /// points somewhere.
    fn within(mut self, command: &'static str) -> UsageError {
        if self.command.is_empty() {
            self.command = command;
        }
        self
    }

    /// The line after the message: where the usage is.
    pub fn pointer(&self) -> String {
        match self.command {
            "" => format!("run `{PROGRAM} --help` for usage"),
            c => format!("run `{PROGRAM} {c} --help` for usage"),
        }
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError::new(e.to_string())
    }
}

pub(crate) fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError::new(msg))
}

fn string(v: OsString, what: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError::new(format!("{what}: not valid UTF-8")))
}

/// The operator (`--by`, required: 1-64 of `A-Z a-z 0-9 _ . - @`) and the
/// note (`--note`, optional) of an audited action.
pub(crate) fn by_and_note(
    by: Option<String>,
    note: Option<String>,
) -> Result<(String, Option<String>), UsageError> {
    let by = by.ok_or_else(|| UsageError::new("--by NAME is required"))?;
    if !(1..=64).contains(&by.len())
        || !by
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-@".contains(&b))
    {
        return Err(UsageError::new(format!(
            "--by {by:?}: expected 1-64 characters of A-Z a-z 0-9 _ . - @"
        )));
    }
    if let Some(n) = &note {
        if n.chars().count() > MAX_NOTE || n.chars().any(|c| c.is_control() && c != '\n') {
            return Err(UsageError::new(format!(
                "--note: at most {MAX_NOTE} characters, no control characters"
            )));
        }
    }
    Ok((by, note))
}

pub(crate) fn parse_u64(v: &str, what: &str) -> Result<u64, UsageError> {
    v.parse()
        .map_err(|_| UsageError::new(format!("{what}: {v:?} is not a non-negative integer")))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    parse_at(args, seckill_common::now_ms())
}

/// The options of a command line, by name, in the order given (a flag's
/// value is empty); each is taken once by the command that knows it, and
/// any left over is an error.
pub struct Opts(Vec<(String, String)>);

impl Opts {
    /// Removes and returns the first value of option `--name`.
    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        let i = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(i).1)
    }
}

/// A lexed command line: its words, its options, and whether `--help` (or
/// `-h`) came (the words before it name the help asked for).
struct Lexed {
    words: Vec<String>,
    opts: Opts,
    help: bool,
}

/// Splits the arguments into words and options, up to a `--help`.
fn lex(args: impl IntoIterator<Item = OsString>) -> Result<Lexed, UsageError> {
    let mut p = lexopt::Parser::from_args(args);
    let mut words = Vec::new();
    let mut opts: Vec<(String, String)> = Vec::new();
    let mut help = false;
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => {
                help = true;
                break;
            }
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
            // A negative number where an id or a count goes (`add-stock 7
            // -5`) is a word, refused by that argument's own check and
            // help, not an unknown option `-5`.
            Short(c) if c.is_ascii_digit() => {
                let rest = match p.optional_value() {
                    Some(v) => string(v, "argument")?,
                    None => String::new(),
                };
                words.push(format!("-{c}{rest}"));
            }
            other => return Err(other.unexpected().into()),
        }
    }
    Ok(Lexed {
        words,
        opts: Opts(opts),
        help,
    })
}

/// The help text asked for by `WORDS --help` or `help WORDS`: the
/// command's own, a group's list of subcommands, or the overview.
fn help_for(words: &[&str]) -> String {
    if let Some(h) = cli_help::find(words).or_else(|| cli_help::partial(words)) {
        return h.full();
    }
    words
        .first()
        .and_then(|w| cli_help::group(w))
        .unwrap_or_else(cli_help::overview)
}

/// The command `words` name, with its positional arguments checked
/// against its help entry.
///
/// Errors: an unknown command, a group without its subcommand (listing
/// them), a missing argument (named) or one too many.
fn command_of<'w>(
    words: &'w [&'w str],
) -> Result<(&'static cli_help::Help, &'w [&'w str]), UsageError> {
    let Some(h) = cli_help::find(words) else {
        let unknown = format!("unknown command: {}", words.join(" "));
        return Err(
            match (words, words.first().and_then(|w| cli_help::group_name(w))) {
                ([_], Some(g)) => UsageError {
                    message: format!(
                        "{g}: missing SUBCOMMAND, one of:\n{}",
                        cli_help::subcommands(g)
                    ),
                    command: g,
                },
                (_, Some(g)) => UsageError {
                    // `dead-letter requeue` without its third word: say
                    // which words the command takes.
                    message: match cli_help::partial(words) {
                        Some(h) => format!(
                            "{}: expected {}",
                            words.join(" "),
                            h.usage().trim_start_matches("usage: ")
                        ),
                        None => unknown,
                    },
                    command: g,
                },
                (_, None) => UsageError::new(unknown),
            },
        );
    };
    let rest = &words[h.path.split(' ').count()..];
    if rest.len() < h.required() {
        return Err(
            UsageError::new(format!("{}: missing {}", h.path, h.args[rest.len()])).within(h.path),
        );
    }
    if rest.len() > h.args.len() {
        return Err(UsageError::new(format!(
            "{}: unexpected argument {:?}",
            h.path,
            rest[h.args.len()]
        ))
        .within(h.path));
    }
    Ok((h, rest))
}

/// [`parse`] with the clock given (for `now+30s`), so tests are exact.
pub fn parse_at(
    args: impl IntoIterator<Item = OsString>,
    now_ms: u64,
) -> Result<Command, UsageError> {
    let Lexed {
        words,
        mut opts,
        help,
    } = lex(args)?;
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    match words.as_slice() {
        _ if help => return Ok(Command::Help(help_for(&words))),
        [] | ["help"] => return Ok(Command::Help(cli_help::overview())),
        ["help", rest @ ..] => return Ok(Command::Help(help_for(rest))),
        _ => {}
    }
    let (h, rest) = command_of(&words)?;
    let cmd = command(h.path, rest, &mut opts, now_ms).map_err(|e| e.within(h.path))?;
    if let Some((name, _)) = opts.0.first() {
        return Err(UsageError::new(format!("unexpected option --{name}")).within(h.path));
    }
    Ok(cmd)
}

/// The match arm of each command: `path` is a [`cli_help::Help`] path,
/// `args` its positional arguments, as many as it declares.
fn command(path: &str, args: &[&str], opts: &mut Opts, now_ms: u64) -> Result<Command, UsageError> {
    Ok(match (path, args) {
        ("migrate", []) => Command::Migrate,
        ("sale create", []) => crate::cmd::sale_create::parse(opts, now_ms)?,
        ("sale load", [id]) => {
            let id = parse_u64(id, "sale id")?;
            Command::SaleLoad(id, shards_given(opts)?)
        }
        ("sale rebalance", [id]) => Command::SaleRebalance(parse_u64(id, "sale id")?),
        ("sale show", [id]) => Command::SaleShow(parse_u64(id, "sale id")?),
        (
            "sale list" | "sale pause" | "sale resume" | "sale end" | "sale extend"
            | "sale add-stock",
            _,
        ) => {
            let words: Vec<&str> = path.split(' ').chain(args.iter().copied()).collect();
            crate::sale_admin_cli::parse(&words, opts, now_ms)?
        }
        ("sale repair", [id]) => {
            let sale_id = parse_u64(id, "sale id")?;
            let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
            let dry_run = opts.take("dry-run").is_some();
            Command::SaleRepair(crate::cmd::repair::RepairArgs {
                sale_id,
                by,
                note,
                dry_run,
            })
        }
        ("sale archive", [id]) => {
            let sale_id = parse_u64(id, "sale id")?;
            let (by, _) = by_and_note(opts.take("by"), None)?;
            Command::SaleArchive(sale_id, by)
        }
        ("run", []) => Command::Run,
        ("findings", []) => crate::cmd::findings::parse(opts)?,
        ("findings show", [id]) => {
            Command::FindingsShow(finding_id(id)?, opts.take("json").is_some())
        }
        ("resolve", [id]) => crate::cmd::resolve::parse(id, opts)?,
        ("resolve all", []) => crate::cmd::resolve_all::parse(opts)?,
        ("token keygen", []) => crate::cmd::token::parse_keygen(opts)?,
        ("token issue", []) => crate::cmd::token::parse_issue(opts)?,
        ("queue show", []) => Command::QueueShow(None),
        ("queue show", [id]) => Command::QueueShow(Some(parse_u64(id, "sale id")?)),
        ("dead-letter list", ["payments"]) => Command::DeadLetterList(DeadLetterList::Payments),
        ("dead-letter list", [id]) => Command::DeadLetterList(DeadLetterList::Sale(parse_u64(
            id,
            "SALE (a sale id, or payments)",
        )?)),
        ("dead-letter requeue payments", [entry]) => {
            crate::cmd::payment_dlq::parse(PaymentDeadLetterAction::Requeue, entry, opts)?
        }
        ("dead-letter drop payments", [entry]) => {
            crate::cmd::payment_dlq::parse(PaymentDeadLetterAction::Drop, entry, opts)?
        }
        ("dead-letter drop", [sale, entry]) => crate::cmd::sale_dlq::parse(
            parse_u64(sale, "SALE (a sale id, or payments)")?,
            entry,
            opts,
        )?,
        _ => return err(format!("{path}: no match arm for {args:?}")),
    })
}

/// A finding id: a positive integer.
pub(crate) fn finding_id(id: &str) -> Result<i64, UsageError> {
    id.parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| UsageError::new(format!("finding id: {id:?} is not a positive integer")))
}

/// `--shards K`: 1 when absent.
pub(crate) fn shards(opts: &mut Opts) -> Result<u32, UsageError> {
    Ok(shards_given(opts)?.unwrap_or(1))
}

/// `--shards K`: `None` when absent.
pub(crate) fn shards_given(opts: &mut Opts) -> Result<Option<u32>, UsageError> {
    let max = seckill_common::buckets::MAX_BUCKETS;
    match opts.take("shards") {
        None => Ok(None),
        Some(k) => k
            .parse()
            .ok()
            .filter(|k| (1..=max).contains(k))
            .map(Some)
            .ok_or_else(|| {
                UsageError::new(format!(
                    "--shards {k:?}: expected an integer from 1 to {max}"
                ))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::resolve::ResolveAction;
    use crate::review::findings::FindingState;

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
                limits: seckill_common::sale::Limits::ONE,
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
            assert!(e.unwrap_err().message.contains("--shards"), "{bad}");
        }
        let c = p("sale create --sku A --stock 9 --starts-at now --ends-at now+1h --shards 2 --payment-window 1m");
        let Ok(Command::SaleCreate(c)) = c else {
            panic!("{c:?}")
        };
        assert_eq!((c.shards, c.payment_window_ms), (2, Some(60_000)));
        assert_eq!(p("sale show 7").unwrap(), Command::SaleShow(7));
    }

    #[test]
    fn sale_create_takes_unit_limits() {
        let base = "sale create --sku A --stock 9 --starts-at now --ends-at now+1h";
        let limits = |extra: &str| match p(&format!("{base} {extra}")) {
            Ok(Command::SaleCreate(c)) => Ok((c.limits.max_per_buyer, c.limits.max_per_purchase)),
            Ok(c) => panic!("{c:?}"),
            Err(e) => Err(e.message),
        };
        assert_eq!(limits(""), Ok((1, 1)));
        assert_eq!(limits("--max-per-buyer 4"), Ok((4, 4)));
        assert_eq!(limits("--max-per-buyer 4 --max-per-purchase 3"), Ok((4, 3)));
        assert_eq!(limits("--max-per-buyer 100 --shards 1"), Ok((100, 100)));
        assert_eq!(
            limits("--max-per-buyer 2 --max-per-purchase 3"),
            Err(
                "--max-per-purchase 3 is above --max-per-buyer 2: one purchase cannot take \
                 more than a buyer may hold"
                    .into()
            )
        );
        for bad in ["0", "101", "-1", "x", "2.5"] {
            assert_eq!(
                limits(&format!("--max-per-buyer {bad}")),
                Err(format!(
                    "--max-per-buyer {bad:?}: expected an integer from 1 to 100"
                ))
            );
        }
        assert_eq!(
            limits("--max-per-buyer 2 --max-per-purchase 0"),
            Err("--max-per-purchase \"0\": expected an integer from 1 to 100".into())
        );
        assert_eq!(limits("--max-per-buyer 2 --shards 3"), Ok((2, 2)));
        assert_eq!(limits("--max-per-buyer 1 --shards 3"), Ok((1, 1)));
        assert_eq!(
            p("sale repair 7 --by alice").unwrap(),
            Command::SaleRepair(RepairArgs {
                sale_id: 7,
                by: "alice".into(),
                note: None,
                dry_run: false
            })
        );
        assert_eq!(
            p("sale repair 7 --by alice --dry-run").unwrap(),
            Command::SaleRepair(RepairArgs {
                sale_id: 7,
                by: "alice".into(),
                note: None,
                dry_run: true
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
        assert!(matches!(p("--help").unwrap(), Command::Help(_)));
        assert_eq!(p("run").unwrap(), Command::Run);
    }

    #[test]
    fn the_help_of_a_three_word_command_asked_by_its_first_two_is_its_own() {
        let own = cli_help::find(&["dead-letter", "requeue", "payments"])
            .map(|h| h.full())
            .unwrap_or_default();
        assert!(own.contains("--by NAME"));
        for asked in ["dead-letter requeue --help", "help dead-letter requeue"] {
            assert_eq!(p(asked).unwrap(), Command::Help(own.clone()), "{asked}");
        }
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
                "resolve needs exactly one of --reorder, --rollback, --recreate, --dismiss",
            ),
            (
                "resolve 1 --reorder --rollback --by alice",
                "resolve needs exactly one of --reorder, --rollback, --recreate, --dismiss",
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

    #[test]
    fn a_group_lists_its_subcommands_and_a_missing_argument_is_named() {
        let e = p("sale").unwrap_err();
        assert_eq!(e.command, "sale");
        assert!(
            e.message
                .starts_with("sale: missing SUBCOMMAND, one of:\n  sale create "),
            "{e}"
        );
        assert_eq!(e.message.lines().count(), 1 + 12, "{e}");
        let e = p("resolve").unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.command),
            ("resolve: missing FINDING_ID", "resolve")
        );
        assert_eq!(
            e.pointer(),
            "run `seckill-reconciler resolve --help` for usage"
        );
        let e = p("token").unwrap_err();
        assert_eq!(e.command, "token");
        let e = p("frobnicate").unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.command),
            ("unknown command: frobnicate", "")
        );
        let e = p("sale frobnicate 1").unwrap_err();
        assert_eq!(e.command, "sale");
        let e = p("dead-letter requeue").unwrap_err();
        assert_eq!(
            (e.message.as_str(), e.command),
            (
                "dead-letter requeue: expected seckill-reconciler dead-letter requeue payments \
                 ENTRY --by NAME [--note TEXT] [--dry-run]",
                "dead-letter"
            )
        );
        let e = p("findings --state closed").unwrap_err();
        assert_eq!(e.command, "findings");
        let Ok(Command::Help(run)) = p("run --help") else {
            panic!("run --help")
        };
        assert!(
            run.starts_with("usage: seckill-reconciler run\n\n"),
            "{run}"
        );
        let Ok(Command::Help(create)) = p("sale create --help") else {
            panic!("sale create --help")
        };
        assert!(create.contains("--payment-window D") && !create.contains("--reorder"));
        assert_eq!(p("help sale create"), Ok(Command::Help(create)));
    }
}
