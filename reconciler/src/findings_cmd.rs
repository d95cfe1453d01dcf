//! Owns `seckill-reconciler findings`: the review store's findings as a
//! readable table (default) or as JSON for scripts (`--json`: an array of
//! objects with the fields of `review::findings::Finding`). It only reads an
//! existing review file (see `Review::open_existing`), and a reader that
//! closes the pipe early (`| head`) ends the output quietly.

use crate::cli::FindingsArgs;
use crate::error::RunError;
use crate::output::write_stdout;
use crate::review::findings::{Finding, Severity};
use crate::review::Review;
use seckill_common::Config;
use std::io::{self, Write};

/// Widest evidence text shown in the table (the JSON has all of it).
const EVIDENCE_WIDTH: usize = 100;

/// Prints the findings selected by `args`; exit code 0.
///
/// Errors: no review file at `SECKILL_REVIEW_DB` ([`RunError::Review`]), a
/// SQLite failure, or stdout failing other than by a closed pipe
/// ([`RunError::Output`]).
pub fn findings(config: &Config, args: &FindingsArgs) -> Result<u8, RunError> {
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

fn write_table(w: &mut dyn Write, rows: &[Finding]) -> io::Result<()> {
    if rows.is_empty() {
        return writeln!(w, "no findings");
    }
    writeln!(
        w,
        "{:>5}  {:<10}  {:<20}  {:>6}  {:<32}  {:<12}  {:>6}  {:<24}  {:>5}  evidence",
        "id", "state", "kind", "sale", "subject", "user", "order", "last seen", "seen"
    )?;
    for f in rows {
        let mut evidence = f.fix.clone().unwrap_or_else(|| f.evidence.to_string());
        if f.severity == Severity::Critical {
            evidence = format!("CRITICAL {evidence}");
        }
        if evidence.chars().count() > EVIDENCE_WIDTH {
            evidence = evidence.chars().take(EVIDENCE_WIDTH).collect::<String>() + "...";
        }
        writeln!(
            w,
            "{:>5}  {:<10}  {:<20}  {:>6}  {:<32}  {:<12}  {:>6}  {:<24}  {:>5}  {}",
            f.id,
            f.state,
            f.kind,
            f.sale_id,
            f.subject,
            f.user_id.as_deref().unwrap_or("-"),
            f.order_id
                .map_or_else(|| "-".to_string(), |o| o.to_string()),
            f.last_seen,
            f.times_seen,
            evidence
        )?;
    }
    Ok(())
}
