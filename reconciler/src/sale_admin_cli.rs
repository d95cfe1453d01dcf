//! Owns the command lines of an operator's changes to a sale and of the
//! sale list (`sale list`, `sale pause | resume | end | extend |
//! add-stock`): each parser next to its help text, validated into
//! [`SaleAdminArgs`]; nothing here touches the network.

use crate::cli::{by_and_note, parse_u64, Command, Opts, UsageError, MAX_AHEAD_MS, MAX_STOCK};
use seckill_common::timefmt::parse_time_ms;

/// `sale list --help`.
pub const LIST_HELP: &str = "\
usage: seckill-reconciler sale list

One line per sale in MySQL: id, SKU, window (UTC), state (upcoming, active,
sold_out, ended, paused, archived), units total / left / reserved / ordered /
paid, and who paused it and why. left: Redis's stock (every bucket), MySQL's
available stock when Redis does not hold the sale; reserved: units taken in
Redis (total - left); ordered: MySQL orders holding a unit; paid: of those,
paid. Changes nothing. Exit 0, 2 could not run.";

/// `sale pause --help`.
pub const PAUSE_HELP: &str = "\
usage: seckill-reconciler sale pause ID --reason TEXT --by NAME [--dry-run]

Refuses every purchase of sale ID (503 sale_paused, Retry-After) on every
gateway within a second, until `sale resume ID`. Reads, payments,
cancellations, expiries and the workers go on. Audited in the review store.
TEXT: 1-255 characters. Exit 0 paused (or paused already), 1 refused (nothing
changed), 2 could not run.";

/// `sale resume --help`.
pub const RESUME_HELP: &str = "\
usage: seckill-reconciler sale resume ID --by NAME [--dry-run]

Ends an operator's pause of sale ID: purchases are taken again within a
second. Refused while the sale is paused because Redis lost data of it (an
open redis_data_loss finding, or the data-loss pause in MySQL): `sale repair
ID --by NAME` ends that pause. Audited in the review store. Exit 0 resumed (or
not paused), 1 refused, 2 could not run.";

/// `sale end --help`.
pub const END_HELP: &str = "\
usage: seckill-reconciler sale end ID --by NAME [--dry-run]

Ends sale ID now (a sale not started yet: a millisecond after its start):
later purchases get 403 sale_ended within a second; payments, cancellations
and expiries of its orders go on. Audited in the review store. Exit 0 ended
(or ended already), 1 refused, 2 could not run.";

/// `sale extend --help`.
pub const EXTEND_HELP: &str = "\
usage: seckill-reconciler sale extend ID --ends-at T --by NAME [--dry-run]

Moves the end of sale ID later, to T (RFC 3339, now+2h): a sale that had
ended takes purchases again. T must be after now and after the current end
(`sale end` ends a sale earlier), the window at most 366 days. Audited in the
review store. Exit 0 extended, 1 refused, 2 could not run.";

/// `sale add-stock --help`.
pub const ADD_STOCK_HELP: &str = "\
usage: seckill-reconciler sale add-stock ID N --by NAME [--dry-run]

Puts N more units of sale ID on sale, in MySQL (total_stock and
available_stock, a stock_ledger row of reason add_stock) and in Redis (its
stock) at once; buyers see them within a second. A split sale's units go so
that each bucket holds its share of the new total (printed per bucket).
Refused for an ended or archived sale and while Redis lost data of it.
Audited in the review store. Exit 0 added, 1 refused, 2 could not run.";

/// The help text of `sale WORD`, for a command of this file.
pub fn help(word: &str) -> Option<&'static str> {
    Some(match word {
        "list" => LIST_HELP,
        "pause" => PAUSE_HELP,
        "resume" => RESUME_HELP,
        "end" => END_HELP,
        "extend" => EXTEND_HELP,
        "add-stock" => ADD_STOCK_HELP,
        _ => return None,
    })
}

/// The help text asked for by a command line `sale WORD ... --help` (or
/// `-h`) of a command of this file; `None` for any other line.
pub fn help_asked(args: &[std::ffi::OsString]) -> Option<&'static str> {
    let words: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    match words.as_slice() {
        ["sale", w, rest @ ..] if rest.iter().any(|a| *a == "--help" || *a == "-h") => help(w),
        _ => None,
    }
}

/// Longest `--reason`, in characters (`sales.paused_reason`).
pub const MAX_REASON: usize = 255;

/// What an operator changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminChange {
    /// `sale pause --reason TEXT`.
    Pause(String),
    /// `sale resume`.
    Resume,
    /// `sale end`.
    End,
    /// `sale extend --ends-at T` (Unix ms).
    Extend(u64),
    /// `sale add-stock ID N`.
    AddStock(u64),
}

/// Arguments of a sale change, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleAdminArgs {
    /// The sale.
    pub sale_id: u64,
    /// What changes.
    pub change: AdminChange,
    /// Who asks (`--by`), as for `resolve`.
    pub by: String,
    /// Print what would change and change nothing.
    pub dry_run: bool,
}

/// Parses `sale WORD ARGS...` for the commands of this file (those
/// [`help`] knows).
pub fn parse(words: &[&str], opts: &mut Opts, now_ms: u64) -> Result<Command, UsageError> {
    let change = match words {
        ["sale", "list"] => return Ok(Command::SaleList),
        ["sale", "pause", _] => reason(opts).map(AdminChange::Pause),
        ["sale", "resume", _] => Ok(AdminChange::Resume),
        ["sale", "end", _] => Ok(AdminChange::End),
        ["sale", "extend", _] => ends_at(opts, now_ms).map(AdminChange::Extend),
        ["sale", "add-stock", _, n] => units(n).map(AdminChange::AddStock),
        _ => return Err(UsageError(format!("unknown command: {}", words.join(" ")))),
    };
    change.and_then(|change| {
        let sale_id = parse_u64(words[2], "sale id")?;
        let (by, _) = by_and_note(opts.take("by"), None)?;
        let dry_run = opts.take("dry-run").is_some();
        Ok(Command::SaleAdmin(SaleAdminArgs {
            sale_id,
            change,
            by,
            dry_run,
        }))
    })
}

/// `--reason TEXT`: required, 1-[`MAX_REASON`] characters, no control
/// characters.
fn reason(opts: &mut Opts) -> Result<String, UsageError> {
    let r = opts
        .take("reason")
        .ok_or_else(|| UsageError("--reason TEXT is required".into()))?;
    let n = r.chars().count();
    if n == 0 || n > MAX_REASON || r.chars().any(char::is_control) {
        return Err(UsageError(format!(
            "--reason: 1-{MAX_REASON} characters, no control characters"
        )));
    }
    Ok(r)
}

/// `--ends-at T`: required, after now, at most [`MAX_AHEAD_MS`] ahead.
fn ends_at(opts: &mut Opts, now_ms: u64) -> Result<u64, UsageError> {
    let t = opts
        .take("ends-at")
        .ok_or_else(|| UsageError("--ends-at T is required".into()))?;
    let ms = parse_time_ms(&t, now_ms).map_err(|e| UsageError(format!("--ends-at {t:?}: {e}")))?;
    if ms <= now_ms {
        return Err(UsageError(format!(
            "--ends-at {t:?}: not in the future (`sale end` ends a sale now)"
        )));
    }
    if ms - now_ms > MAX_AHEAD_MS {
        return Err(UsageError(format!(
            "--ends-at {t:?}: more than 10 years ahead"
        )));
    }
    Ok(ms)
}

/// `N` of `add-stock`: 1 ..= [`MAX_STOCK`].
fn units(n: &str) -> Result<u64, UsageError> {
    n.parse()
        .ok()
        .filter(|n| (1..=MAX_STOCK).contains(n))
        .ok_or_else(|| {
            UsageError(format!(
                "units: {n:?}: expected an integer from 1 to {MAX_STOCK}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn p(s: &str) -> Result<Command, UsageError> {
        crate::cli::parse_at(s.split_whitespace().map(OsString::from), 1_790_000_000_000)
    }

    #[test]
    fn each_command_has_its_own_help() {
        let args =
            |s: &str| -> Vec<OsString> { s.split_whitespace().map(OsString::from).collect() };
        assert_eq!(help_asked(&args("sale pause 7 --help")), Some(PAUSE_HELP));
        assert_eq!(help_asked(&args("sale add-stock -h")), Some(ADD_STOCK_HELP));
        assert_eq!(help_asked(&args("sale list --help")), Some(LIST_HELP));
        assert_eq!(help_asked(&args("sale show 7 --help")), None);
        assert_eq!(help_asked(&args("sale end 7 --by a")), None);
        for w in ["list", "pause", "resume", "end", "extend", "add-stock"] {
            assert!(help(w)
                .is_some_and(|h| h.starts_with(&format!("usage: seckill-reconciler sale {w}"))));
        }
    }

    #[test]
    fn sale_changes_parse() {
        assert_eq!(p("sale list").unwrap(), Command::SaleList);
        let args = |change, dry_run| {
            Command::SaleAdmin(SaleAdminArgs {
                sale_id: 7,
                change,
                by: "alice".into(),
                dry_run,
            })
        };
        assert_eq!(
            p("sale pause 7 --reason fraud --by alice").unwrap(),
            args(AdminChange::Pause("fraud".into()), false)
        );
        assert_eq!(
            p("sale resume 7 --by alice --dry-run").unwrap(),
            args(AdminChange::Resume, true)
        );
        assert_eq!(
            p("sale end 7 --by alice").unwrap(),
            args(AdminChange::End, false)
        );
        assert_eq!(
            p("sale extend 7 --ends-at now+1h --by alice").unwrap(),
            args(AdminChange::Extend(1_790_003_600_000), false)
        );
        assert_eq!(
            p("sale add-stock 7 25 --by alice").unwrap(),
            args(AdminChange::AddStock(25), false)
        );
    }

    #[test]
    fn sale_changes_refuse_bad_values() {
        // Each refusal with its exact message.
        for (bad, why) in [
            ("sale pause 7 --by alice", "--reason TEXT is required"),
            ("sale pause 7 --reason x", "--by NAME is required"),
            (
                "sale end x --by alice",
                "sale id: \"x\" is not a non-negative integer",
            ),
            (
                "sale extend 7 --ends-at now --by alice",
                "--ends-at \"now\": not in the future (`sale end` ends a sale now)",
            ),
            ("sale extend 7 --by alice", "--ends-at T is required"),
            (
                "sale add-stock 7 0 --by alice",
                "units: \"0\": expected an integer from 1 to 100000000",
            ),
            ("sale list --by alice", "unexpected option --by"),
            ("sale end 7 --by alice --note x", "unexpected option --note"),
        ] {
            assert_eq!(p(bad).unwrap_err().to_string(), why, "{bad}");
        }
    }
}
