//! Owns `seckill-reconciler run`: one pass over every sale that is active or
//! ended within `SECKILL_RECONCILE_LOOKBACK` (by MySQL, whether or not Redis
//! still holds it; each scanned on the replica first when there is one,
//! `replica_read.rs`), then over every sale Redis knows that MySQL does not
//! (`rules/sale_missing_in_mysql.rs`), under the run lock, recording findings, compensations
//! and the run itself in the review store, and one summary line on stderr
//! for the journal. Before reading anything it completes the operator
//! actions an interruption left `started` (`settle.rs`) and the archives
//! it left without their Redis step (`sale_archive.rs`). An archived sale is
//! checked for its payments only. After the pass it archives the sales it
//! found ready `SECKILL_ARCHIVE_AFTER` past their end (`sale_archive.rs`).
//!
//! The steps: [`pass`] (the pass under the run lock, one function per
//! step), [`record`] (one sale's observations into the review store); this
//! file opens the run, records its end, its metrics file and its summary.
//!
//! A run that reaches no writable MySQL server (the primary down, no
//! replica promoted yet) records nothing: a finding is decided on the
//! primary. It says so, with whether the replica answers and the runbook
//! to promote it, and its metrics file's `seckill_reconciler_mysql_primary_up`
//! is 0, which the alert `SeckillMysqlPrimaryDown` pages on
//! (`primary_down.rs`). The read-only commands read the replica meanwhile.
//!
//! Exit codes: 0 no open findings, 1 open findings exist (in any sale, old
//! ones included: they wait for a person), 2 could not run.

mod pass;
mod record;

use crate::config::Config;
use crate::error::RunError;
use crate::metrics_file::{self, RunFigures, SaleProgress};
use crate::replica_read::ReplicaFigures;
use crate::review::findings::Kind;
use crate::review::{Review, RunCounts};
use seckill_common::timefmt::format_ms;
use seckill_common::{now_ms, Shutdown};
use std::path::Path;
use std::time::Instant;

/// Runs one reconciliation pass; returns the exit code (0 or 1).
///
/// Errors: anything that stopped the pass (recorded in `runs` when the review
/// store could be opened).
pub fn run(config: &Config, shutdown: &Shutdown) -> Result<u8, RunError> {
    let started = Instant::now();
    let review = Review::open(&config.review_db)?;
    let run_id = review.start_run(&format_ms(now_ms()))?;
    let mut counts = RunCounts::default();
    let mut progress = Vec::new();
    let mut replica = None;
    let result = pass::pass(
        config,
        shutdown,
        &review,
        run_id,
        &mut counts,
        &mut progress,
        &mut replica,
    );
    let open_after = match &result {
        Ok(()) => Some(review.open_count()?),
        Err(_) => None,
    };
    let error = result.as_ref().err().map(|e| e.to_string());
    let finished_ms = now_ms();
    review.finish_run(
        run_id,
        &format_ms(finished_ms),
        &counts,
        open_after,
        error.as_deref(),
    )?;
    let primary_down = result
        .as_ref()
        .err()
        .is_some_and(crate::primary_down::is_down);
    if let Some(path) = &config.reconciler_metrics_file {
        let elapsed = started.elapsed().as_secs_f64();
        let figures = (finished_ms, result.is_ok(), elapsed, !primary_down);
        write_metrics(&review, path, figures, &counts, progress, replica);
    }
    let mut summary = summary(run_id, &counts, open_after, started.elapsed().as_secs_f64())
        + &replica.map_or_else(String::new, |r| replica_summary(&r));
    if primary_down {
        summary += &crate::primary_down::advice(config);
    }
    match result {
        Ok(()) => {
            eprintln!("seckill-reconciler: {summary}");
            Ok(if open_after == Some(0) { 0 } else { 1 })
        }
        Err(e) => {
            eprintln!("seckill-reconciler: {summary}: failed: {e}");
            Err(e)
        }
    }
}

/// Writes the metrics file at `path` for node_exporter; `(finished_ms,
/// succeeded, seconds, a writable primary answered)` of the run. The run's result stands whatever
/// happens to its metrics file (logged): a missing file shows as a stale
/// reconciler in the alerts.
fn write_metrics(
    review: &Review,
    path: &Path,
    (finished_ms, succeeded, seconds, primary_up): (u64, bool, f64, bool),
    counts: &RunCounts,
    progress: Vec<SaleProgress>,
    replica: Option<ReplicaFigures>,
) {
    let written = RunFigures::read(review, finished_ms, succeeded, seconds, counts, progress)
        .map(|f| RunFigures {
            replica,
            mysql_primary_up: primary_up,
            mysql_refused_writable: seckill_common::mysql_writable::refused_writable(),
            ..f
        })
        .map_err(|e| e.to_string())
        .and_then(|f| metrics_file::render(&f).map_err(|e| e.to_string()))
        .and_then(|text| metrics_file::write(path, &text).map_err(|e| e.to_string()));
    if let Err(e) = written {
        log::error!("metrics file {}: {e}", path.display());
    }
}

/// The run's one line for the journal (`open_after`: `None` when the pass
/// failed; `young`: flow records the grace period skipped).
fn summary(run_id: i64, counts: &RunCounts, open_after: Option<u64>, seconds: f64) -> String {
    let by_kind: Vec<String> = Kind::ALL
        .iter()
        .zip(counts.by_kind)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!(
        "run {run_id}: {} sales checked, observed [{}], {} new, {} reopened, {} auto-fixed, {} open, {} young, {seconds:.2}s",
        counts.sales_checked,
        by_kind.join(", "),
        counts.new_findings,
        counts.reopened,
        counts.auto_fixed,
        open_after.map_or_else(|| "?".to_string(), |n| n.to_string()),
        counts.young,
    )
}

/// What the run read from, for its journal line: the replica (and how long
/// it waited for it) or the primary, and the sales the primary re-read.
fn replica_summary(r: &ReplicaFigures) -> String {
    format!(
        ", read {} (replica wait {} ms, {} sales re-read on the primary, {} of them clean)",
        if r.used { "the replica" } else { "the primary" },
        (r.wait_s * 1000.0).round(),
        r.confirmed_on_primary,
        r.cleared_by_primary
    )
}

/// What `run` does first, alone: creates the review file at `path` (mode
/// 0600) when missing and applies its migrations. For the tests, which
/// stand for an installed system where the timer's first `run` made it
/// before any operator command.
///
/// Errors: as `run`'s opening of the file.
pub fn create_review_file(path: &Path) -> Result<(), RunError> {
    Review::open(path)?;
    Ok(())
}
