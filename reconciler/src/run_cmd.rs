//! Owns `seckill-reconciler run`: one pass over every sale that is active or
//! ended within `SECKILL_RECONCILE_LOOKBACK` (by MySQL, whether or not Redis
//! still holds it; each scanned on the replica first when there is one,
//! `replica_read.rs`), then over every sale Redis knows that MySQL does not
//! (`rules/sale_missing_in_mysql.rs`), under the run lock, recording findings, compensations
//! and the run itself in the review store, and one summary line on stderr
//! for the journal. Before reading anything it completes the operator
//! actions an interruption left `started` (`settle.rs`) and the archives
//! it left without their Redis step (`archive_cmd.rs`). An archived sale is
//! checked for its payments only. After the pass it archives the sales it
//! found ready `SECKILL_ARCHIVE_AFTER` past their end (`archive_cmd.rs`).
//!
//! Exit codes: 0 no open findings, 1 open findings exist (in any sale, old
//! ones included: they wait for a person), 2 could not run.

use crate::error::RunError;
use crate::lock::{RunLock, LOCK_WAIT};
use crate::metrics_file::{self, RunFigures, SaleProgress};
use crate::replica_read::{Reads, ReplicaFigures};
use crate::review::findings::Kind;
use crate::review::{ActionKind, ActionStatus};
use crate::review::{Review, RunCounts};
use seckill_common::keys::SALES;
use seckill_common::redis_target::Con;
use seckill_common::timefmt::format_ms;
use seckill_common::{now_ms, Config, Shutdown};
use std::collections::HashSet;
use std::time::Instant;

/// Opens a Redis connection with the configured timeouts and checks the
/// server (`seckill_common::redis_server`: an eviction policy that can
/// delete the sale's keys is refused, exit 2).
pub fn redis_connect(config: &Config) -> Result<Con, RunError> {
    let (con, _) = seckill_common::redis_server::connect(&config.redis_url, config.redis_timeout)?;
    Ok(con)
}

/// Opens one MySQL connection with the configured URL and timeout.
///
/// Errors: the URL or the connection ([`RunError::Mysql`] and kin).
pub fn mysql_connect(config: &Config) -> Result<mysql::Conn, RunError> {
    Ok(seckill_common::schema::connect(
        &config.mysql_url,
        config.mysql_timeout,
    )?)
}

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
    let result = pass(
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
    if let Some(path) = &config.reconciler_metrics_file {
        // The run's result stands whatever happens to its metrics file; a
        // missing file shows as a stale reconciler in the alerts.
        let written = RunFigures::read(
            &review,
            finished_ms,
            result.is_ok(),
            started.elapsed().as_secs_f64(),
            &counts,
            progress,
        )
        .map(|f| RunFigures { replica, ..f })
        .map_err(|e| e.to_string())
        .and_then(|f| metrics_file::render(&f).map_err(|e| e.to_string()))
        .and_then(|text| metrics_file::write(path, &text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            log::error!("metrics file {}: {e}", path.display());
        }
    }
    let by_kind: Vec<String> = Kind::ALL
        .iter()
        .zip(counts.by_kind)
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let summary = format!(
        "run {run_id}: {} sales checked, observed [{}], {} new, {} reopened, {} auto-fixed, {} open, {:.2}s",
        counts.sales_checked,
        by_kind.join(", "),
        counts.new_findings,
        counts.reopened,
        counts.auto_fixed,
        open_after.map_or_else(|| "?".to_string(), |n| n.to_string()),
        started.elapsed().as_secs_f64()
    ) + &replica.map_or_else(String::new, |r| {
        format!(
            ", read {} (replica wait {} ms, {} sales re-read on the primary, {} of them clean)",
            if r.used { "the replica" } else { "the primary" },
            (r.wait_s * 1000.0).round(),
            r.confirmed_on_primary,
            r.cleared_by_primary
        )
    });
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

fn pass(
    config: &Config,
    shutdown: &Shutdown,
    review: &Review,
    run_id: i64,
    counts: &mut RunCounts,
    progress: &mut Vec<SaleProgress>,
    replica: &mut Option<ReplicaFigures>,
) -> Result<(), RunError> {
    let mut redis = redis_connect(config)?;
    let mut mysql = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let mut lock = RunLock::acquire(redis_connect(config)?, LOCK_WAIT)?;
    let outcome = (|| -> Result<(), RunError> {
        // An action interrupted after its effect must be on record before a
        // run reads the state it changed.
        crate::settle::complete_pending(
            review,
            || redis_connect(config),
            || mysql_connect(config),
        )?;
        crate::payment_dlq_cmd::complete_pending(review, &mut redis)?;
        crate::archive_cmd::complete_interrupted(review, &mut redis, &mut mysql)?;
        crate::sale_admin_cmd::complete_pending(review, &mut redis, &mut mysql)?;
        // Every sale MySQL says is in play, whether or not Redis still knows
        // it: a Redis that lost its data must show up as findings, not as
        // silence. And every sale Redis sells, whether or not MySQL knows it.
        let sales: Vec<u64> =
            crate::mysql_read::sales_to_check(&mut mysql, config.reconcile_lookback)?;
        // After the actions above: the replica catches up with them too.
        let mut reads = Reads::open(config, &mut mysql);
        let in_mysql: HashSet<u64> = sales.iter().copied().collect();
        let redis_only: Vec<u64> = crate::redis_read::set_members(&mut redis, SALES)?
            .iter()
            .filter_map(|s| s.parse::<u64>().ok())
            .filter(|id| !in_mysql.contains(id))
            .collect();
        for &sale_id in &redis_only {
            if shutdown.is_triggered() {
                return Err(RunError::Interrupted);
            }
            lock.keep()?;
            let Some(observations) = crate::rules::sale_missing_in_mysql::observe(
                &mut redis,
                &mut mysql,
                sale_id,
                config.reconcile_lookback,
            )?
            else {
                continue;
            };
            record(review, run_id, sale_id, &observations, counts, true)?;
            counts.sales_checked += 1;
        }
        // One sale whose keys Redis refuses (a key of the wrong type) is
        // reported and skipped; the others are still checked.
        let mut skipped: Vec<String> = Vec::new();
        let mut checked: Vec<u64> = Vec::new();
        for sale_id in sales {
            let mut one = || -> Result<(), RunError> {
                let mut tick = || -> Result<(), RunError> {
                    if shutdown.is_triggered() {
                        return Err(RunError::Interrupted);
                    }
                    lock.keep()?;
                    Ok(())
                };
                tick()?;
                // An archived sale's Redis state is gone on purpose: only
                // its payments are still checked (a late one is a finding).
                if crate::archive_cmd::is_archived(&mut mysql, sale_id)? {
                    crate::archive_cmd::remove_again(&mut redis, &mut mysql, sale_id)?;
                    let odd = crate::mysql_read::odd_payments(&mut mysql, Some(sale_id))?;
                    let observations = crate::rules::payments::observe(sale_id, &odd);
                    record(review, run_id, sale_id, &observations, counts, true)?;
                    counts.sales_checked += 1;
                    return Ok(());
                }
                // A paused sale (Redis lost data of it) is one finding until
                // it is repaired; its other findings stay as they are.
                if let Some(paused) =
                    crate::rules::redis_data_loss::observe(&mut redis, &mut mysql, sale_id)?
                {
                    record(review, run_id, sale_id, &[paused], counts, false)?;
                    counts.sales_checked += 1;
                    return Ok(());
                }
                let Some(report) = reads.reconcile(
                    &mut redis,
                    &mut mysql,
                    config.reconcile_grace,
                    &mut tick,
                    sale_id,
                )?
                else {
                    return Ok(());
                };
                log::debug!(
                    "sale {sale_id}: {} flow records, {} orders, {} young, {} observations",
                    report.flow_records,
                    report.orders,
                    report.young,
                    report.observations.len()
                );
                record(review, run_id, sale_id, &report.observations, counts, true)?;
                counts.sales_checked += 1;
                progress.push(report.progress);
                Ok(())
            };
            match one() {
                Ok(()) => checked.push(sale_id),
                Err(RunError::Redis(e)) if seckill_common::is_error_reply(&e) => {
                    log::error!("sale {sale_id}: not checked: Redis refused: {e}");
                    skipped.push(format!("{sale_id} ({e})"));
                }
                Err(e) => return Err(e),
            }
        }
        *replica = reads.figures;
        // Payments the worker could tie to no sale (an unknown reservation)
        // are money received for nothing, and the payment queue's dead
        // letters are payments and cancellations never applied: findings
        // of "sale 0", recorded together (recording closes the unseen).
        lock.keep()?;
        let orphans = crate::mysql_read::odd_payments(&mut mysql, None)?;
        let mut observations = crate::rules::payments::observe(0, &orphans);
        let dead = crate::redis_read::payment_dead_letters(&mut redis)?;
        observations.extend(crate::rules::payment_dead_letter::observations(&dead));
        record(review, run_id, 0, &observations, counts, true)?;
        if let Some(after) = config.archive_after {
            lock.keep()?;
            let grace = config.reconcile_grace;
            crate::archive_cmd::archive_due(
                review, &mut redis, &mut mysql, &checked, after, grace,
            )?;
        }
        if !skipped.is_empty() {
            return Err(RunError::Refused(format!(
                "sales not checked, Redis refused a command on their keys: {}",
                skipped.join("; ")
            )));
        }
        Ok(())
    })();
    let released = lock.release();
    outcome?;
    released?;
    Ok(())
}

/// Records one sale's observations in one SQLite transaction, logs each
/// compensation in `actions`, and (with `close_unseen`) closes the sale's
/// findings no longer seen.
fn record(
    review: &Review,
    run_id: i64,
    sale_id: u64,
    observations: &[crate::review::findings::Observation],
    counts: &mut RunCounts,
    close_unseen: bool,
) -> Result<(), RunError> {
    let now = format_ms(now_ms());
    review.immediate(|| -> Result<(), RunError> {
        for o in observations {
            let rec = review.record_observation(o, run_id, &now)?;
            counts.by_kind[o.kind.index()] += 1;
            if rec.is_new {
                counts.new_findings += 1;
            }
            if rec.reopened {
                counts.reopened += 1;
                log::warn!(
                    "finding {} reopened: observed again after it was closed",
                    rec.id
                );
            }
            if let Some(fix) = &o.fixed {
                counts.auto_fixed += 1;
                review.record_action(
                    &now,
                    "reconciler",
                    rec.id,
                    ActionKind::Compensate,
                    fix,
                    ActionStatus::Done,
                    None,
                )?;
            }
        }
        if close_unseen {
            review.close_unobserved(sale_id, run_id, &now)?;
        }
        Ok(())
    })
}
