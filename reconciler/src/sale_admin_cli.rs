//! Owns the command lines of an operator's changes to a sale and of the
//! sale list (`sale list`, `sale pause | resume | end | extend |
//! add-stock`), validated into [`SaleAdminArgs`]; nothing here touches the
//! network. Their help entries are in `cli_help.rs`.

use crate::cli::{by_and_note, parse_u64, Command, Opts, UsageError, MAX_AHEAD_MS, MAX_STOCK};
use seckill_common::timefmt::parse_time_ms;

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

/// Parses `sale WORD ARGS...` for the commands of this file (their help
/// entries are in `cli_help.rs`).
pub fn parse(words: &[&str], opts: &mut Opts, now_ms: u64) -> Result<Command, UsageError> {
    let change = match words {
        ["sale", "list"] => return Ok(Command::SaleList),
        ["sale", "pause", _] => reason(opts).map(AdminChange::Pause),
        ["sale", "resume", _] => Ok(AdminChange::Resume),
        ["sale", "end", _] => Ok(AdminChange::End),
        ["sale", "extend", _] => ends_at(opts, now_ms).map(AdminChange::Extend),
        ["sale", "add-stock", _, n] => units(n).map(AdminChange::AddStock),
        _ => {
            return Err(UsageError::new(format!(
                "unknown command: {}",
                words.join(" ")
            )))
        }
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
        .ok_or_else(|| UsageError::new("--reason TEXT is required"))?;
    let n = r.chars().count();
    if n == 0 || n > MAX_REASON || r.chars().any(char::is_control) {
        return Err(UsageError::new(format!(
            "--reason: 1-{MAX_REASON} characters, no control characters"
        )));
    }
    Ok(r)
}

/// `--ends-at T`: required, after now, at most [`MAX_AHEAD_MS`] ahead.
fn ends_at(opts: &mut Opts, now_ms: u64) -> Result<u64, UsageError> {
    let t = opts
        .take("ends-at")
        .ok_or_else(|| UsageError::new("--ends-at T is required"))?;
    let ms =
        parse_time_ms(&t, now_ms).map_err(|e| UsageError::new(format!("--ends-at {t:?}: {e}")))?;
    if ms <= now_ms {
        return Err(UsageError::new(format!(
            "--ends-at {t:?}: not in the future (`sale end` ends a sale now)"
        )));
    }
    if ms - now_ms > MAX_AHEAD_MS {
        return Err(UsageError::new(format!(
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
            UsageError::new(format!(
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
            (
                "sale add-stock 7 -5 --by alice",
                "units: \"-5\": expected an integer from 1 to 100000000",
            ),
            (
                "sale pause -12 --reason x --by alice",
                "sale id: \"-12\" is not a non-negative integer",
            ),
            ("sale list --by alice", "unexpected option --by"),
            ("sale end 7 --by alice --note x", "unexpected option --note"),
        ] {
            assert_eq!(p(bad).unwrap_err().to_string(), why, "{bad}");
        }
    }
}
