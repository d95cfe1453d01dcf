//! Owns `seckill-reconciler findings`: the review store's findings as a
//! readable table (default) or as JSON for scripts (`--json`: an array of
//! objects with the fields of `review::findings::Finding`), and `findings
//! show ID`: one finding whole (its evidence pretty-printed) and every
//! action row about it. It only reads an existing review file (see
//! `Review::open_existing`), and a reader that closes the pipe early
//! (`| head`) ends the output quietly.

use crate::cli::{err, parse_u64, Command, Opts, UsageError};
use crate::config::Config;
use crate::error::RunError;
use crate::output::write_stdout;
use crate::review::actions::ActionRow;
use crate::review::findings::FindingState;
use crate::review::findings::{Finding, Severity};
use crate::review::Review;
use std::io::{self, Write};

/// Widest evidence text shown in the table (the JSON has all of it).
const EVIDENCE_WIDTH: usize = 100;

/// Prints the findings selected by `args`; exit code 0.
///
/// Errors: no review file at `SECKILL_REVIEW_DB` ([`RunError::Review`]), a
/// SQLite failure, or stdout failing other than by a closed pipe
/// ([`RunError::Output`]).
pub fn run(config: &Config, args: &FindingsArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let rows = review.list_findings(args.state, args.sale)?;
    let written = if args.json {
        write_stdout(|w| {
            serde_json::to_writer_pretty(&mut *w, &rows).map_err(io::Error::from)?;
            writeln!(w)
        })
    } else {
        write_stdout(|w| write_table(w, &rows))
    };
    written.map_err(RunError::Output)?;
    Ok(0)
}

/// Prints finding `id` whole and every action row about it (`--json`: one
/// object, `{"finding": {...}, "actions": [...]}`); exit code 0.
///
/// Errors: as [`findings`], and [`crate::review::ReviewError::NoSuchFinding`].
pub fn show(config: &Config, id: i64, json: bool) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let f = review.finding(id)?;
    let actions = review.actions_of(id)?;
    let written = if json {
        write_stdout(|w| {
            let whole = serde_json::json!({"finding": f, "actions": actions});
            serde_json::to_writer_pretty(&mut *w, &whole).map_err(io::Error::from)?;
            writeln!(w)
        })
    } else {
        write_stdout(|w| write_one(w, &f, &actions))
    };
    written.map_err(RunError::Output)?;
    Ok(0)
}

/// One finding as `name: value` lines, the evidence pretty-printed, then
/// its actions as a table.
fn write_one(w: &mut dyn Write, f: &Finding, actions: &[ActionRow]) -> io::Result<()> {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let resolved = match (&f.resolved_at, &f.resolved_by, f.resolution) {
        (Some(at), Some(by), Some(how)) => format!("{at} by {by} ({how})"),
        _ => "-".to_string(),
    };
    let fields = [
        ("finding", f.id.to_string()),
        ("kind", f.kind.to_string()),
        ("severity", f.severity.to_string()),
        ("state", f.state.to_string()),
        ("sale", f.sale_id.to_string()),
        ("subject", f.subject.clone()),
        ("reservation", or_dash(f.reservation_id.clone())),
        ("user", or_dash(f.user_id.clone())),
        ("order", or_dash(f.order_id.map(|o| o.to_string()))),
        ("first seen", f.first_seen.clone()),
        (
            "last seen",
            format!("{} (runs: {})", f.last_seen, f.times_seen),
        ),
        ("fix", or_dash(f.fix.clone())),
        ("resolved", resolved),
        ("note", or_dash(f.note.clone())),
    ];
    for (name, value) in fields {
        writeln!(w, "{:<12} {value}", format!("{name}:"))?;
    }
    let evidence = serde_json::to_string_pretty(&f.evidence).map_err(io::Error::from)?;
    writeln!(w, "evidence:")?;
    for l in evidence.lines() {
        writeln!(w, "  {l}")?;
    }
    if actions.is_empty() {
        return writeln!(w, "actions:     none");
    }
    writeln!(w, "actions:")?;
    let width = |get: fn(&ActionRow) -> String, header: &str| {
        actions
            .iter()
            .map(|a| get(a).chars().count())
            .chain([header.len()])
            .max()
            .unwrap_or(0)
    };
    let id_w = width(|a| a.id.to_string(), "id");
    let actor_w = width(|a| a.actor.clone(), "actor");
    let action_w = width(|a| a.action.clone(), "action");
    let result_w = width(|a| a.result.clone(), "result");
    let completes_w = width(
        |a| a.completes.map_or_else(|| "-".into(), |c| c.to_string()),
        "completes",
    );
    writeln!(
        w,
        "  {:>id_w$}  {:<24}  {:<actor_w$}  {:<action_w$}  {:<result_w$}  {:>completes_w$}  detail",
        "id", "at", "actor", "action", "result", "completes"
    )?;
    for a in actions {
        let completes = a.completes.map_or_else(|| "-".into(), |c| c.to_string());
        writeln!(
            w,
            "  {:>id_w$}  {:<24}  {:<actor_w$}  {:<action_w$}  {:<result_w$}  {completes:>completes_w$}  {}",
            a.id, a.at, a.actor, a.action, a.result, a.detail
        )?;
    }
    Ok(())
}

/// The findings as a table, one line each, every column as wide as its
/// widest cell (kinds such as `payment_unknown_reservation` and payment
/// subjects are longer than the others), evidence last and cut at
/// [`EVIDENCE_WIDTH`] characters.
fn write_table(w: &mut dyn Write, rows: &[Finding]) -> io::Result<()> {
    if rows.is_empty() {
        return writeln!(w, "no findings");
    }
    const HEADER: [&str; 9] = [
        "id",
        "state",
        "kind",
        "sale",
        "subject",
        "user",
        "order",
        "last seen",
        "seen",
    ];
    // Right-aligned: the numbers.
    const RIGHT: [bool; 9] = [true, false, false, true, false, false, true, false, true];
    let cells: Vec<([String; 9], String)> = rows
        .iter()
        .map(|f| {
            let mut evidence = f.fix.clone().unwrap_or_else(|| f.evidence.to_string());
            if f.severity == Severity::Critical {
                evidence = format!("CRITICAL {evidence}");
            }
            if evidence.chars().count() > EVIDENCE_WIDTH {
                evidence = evidence.chars().take(EVIDENCE_WIDTH).collect::<String>() + "...";
            }
            let row = [
                f.id.to_string(),
                f.state.to_string(),
                f.kind.to_string(),
                f.sale_id.to_string(),
                f.subject.clone(),
                f.user_id.clone().unwrap_or_else(|| "-".to_string()),
                f.order_id
                    .map_or_else(|| "-".to_string(), |o| o.to_string()),
                f.last_seen.clone(),
                f.times_seen.to_string(),
            ];
            (row, evidence)
        })
        .collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for (row, _) in &cells {
        for (wd, c) in widths.iter_mut().zip(row) {
            *wd = (*wd).max(c.chars().count());
        }
    }
    let line = |w: &mut dyn Write, row: [&str; 9], last: &str| -> io::Result<()> {
        for ((c, &wd), &right) in row.iter().zip(&widths).zip(&RIGHT) {
            if right {
                write!(w, "{c:>wd$}  ")?;
            } else {
                write!(w, "{c:<wd$}  ")?;
            }
        }
        writeln!(w, "{last}")
    };
    line(w, HEADER, "evidence")?;
    for (row, evidence) in &cells {
        line(w, row.each_ref().map(String::as_str), evidence)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::findings::{FindingState, Kind};

    fn finding(id: i64, kind: Kind, subject: &str) -> Finding {
        Finding {
            id,
            kind,
            sale_id: 7,
            subject: subject.to_string(),
            reservation_id: None,
            user_id: Some("carol".to_string()),
            order_id: None,
            severity: Severity::Normal,
            evidence: serde_json::json!({"reason": "test"}),
            state: FindingState::Open,
            fix: None,
            first_seen: "2026-12-01T20:00:00.000Z".to_string(),
            last_seen: "2026-12-01T20:00:00.000Z".to_string(),
            times_seen: 1,
            resolved_by: None,
            resolved_at: None,
            resolution: None,
            note: None,
        }
    }

    #[test]
    fn every_column_starts_where_its_header_does_whatever_the_kind() {
        let rows = [
            finding(1, Kind::DeadLetter, "entry:00ff"),
            finding(
                12,
                Kind::PaymentUnknownReservation,
                "pay-bob-1/9f86d081884c7d65000000000000002a/2999",
            ),
        ];
        let mut out = Vec::new();
        write_table(&mut out, &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // The user, the last-seen time and the evidence start at the same
        // column on every line, however long a kind or subject.
        let at = |l: &str, what: &str| l.find(what).unwrap();
        let user = at(lines[0], "user");
        let seen = at(lines[0], "last seen");
        let evidence = at(lines[0], "evidence");
        for l in &lines[1..] {
            assert_eq!(at(l, "carol"), user, "{text}");
            assert_eq!(at(l, "2026-12-01T20"), seen, "{text}");
            assert_eq!(at(l, "{\"reason\""), evidence, "{text}");
        }
    }
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

/// `findings [--state S] [--sale ID] [--json]`.
pub fn parse(opts: &mut Opts) -> Result<Command, UsageError> {
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
