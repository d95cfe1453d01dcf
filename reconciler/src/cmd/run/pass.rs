//! Owns the pass of `run` under the run lock, one function per step:
//! complete what interruptions left ([`complete_interrupted`]), the sales
//! Redis sells that MySQL does not know ([`sales_missing_in_mysql`]), each
//! sale MySQL says is in play ([`check_sale`]), the payments of no sale
//! ([`payments_of_no_sale`]), then the archive of the sales found ready.

use super::record::record;
use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::lock::{RunLock, LOCK_WAIT};
use crate::metrics_file::SaleProgress;
use crate::replica_read::{Reads, ReplicaFigures};
use crate::review::{Review, RunCounts};
use seckill_common::keys::SALES;
use seckill_common::redis_target::Con;
use seckill_common::Shutdown;
use std::collections::HashSet;

/// What every step of one pass uses.
struct Pass<'a> {
    config: &'a Config,
    shutdown: &'a Shutdown,
    review: &'a Review,
    run_id: i64,
    counts: &'a mut RunCounts,
    redis: Con,
    mysql: mysql::Conn,
    lock: RunLock,
}

impl Pass<'_> {
    /// Stops the pass on a signal; keeps the run lock alive.
    fn tick(&mut self) -> Result<(), RunError> {
        if self.shutdown.is_triggered() {
            return Err(RunError::Interrupted);
        }
        self.lock.keep()?;
        Ok(())
    }
}

/// Runs the pass: takes the run lock, runs the steps, releases the lock.
///
/// Errors: anything that stopped a step; [`RunError::Unchecked`] when
/// every step ran but Redis refused a command on the keys of some sales.
pub fn pass(
    config: &Config,
    shutdown: &Shutdown,
    review: &Review,
    run_id: i64,
    counts: &mut RunCounts,
    progress: &mut Vec<SaleProgress>,
    replica: &mut Option<ReplicaFigures>,
) -> Result<(), RunError> {
    let redis = connect::redis(&config.services)?;
    let mysql = connect::mysql(&config.services)?;
    let lock = RunLock::acquire(connect::redis(&config.services)?, LOCK_WAIT)?;
    let mut p = Pass {
        config,
        shutdown,
        review,
        run_id,
        counts,
        redis,
        mysql,
        lock,
    };
    let outcome = steps(&mut p, progress, replica);
    let released = p.lock.release();
    outcome?;
    released?;
    Ok(())
}

/// The steps in their order.
fn steps(
    p: &mut Pass<'_>,
    progress: &mut Vec<SaleProgress>,
    replica: &mut Option<ReplicaFigures>,
) -> Result<(), RunError> {
    complete_interrupted(p)?;
    // Every sale MySQL says is in play, whether or not Redis still knows
    // it: a Redis that lost its data must show up as findings, not as
    // silence. And every sale Redis sells, whether or not MySQL knows it.
    let sales: Vec<u64> =
        crate::mysql_read::sales_to_check(&mut p.mysql, p.config.reconcile_lookback)?;
    sales_missing_in_mysql(p, &sales)?;
    // After the actions above: the replica catches up with them too.
    let mut reads = Reads::open(p.config, &mut p.mysql);
    // One sale whose keys Redis refuses (a key of the wrong type) is
    // reported and skipped; the others are still checked.
    let mut skipped: Vec<String> = Vec::new();
    let mut checked: Vec<u64> = Vec::new();
    for sale_id in sales {
        match check_sale(p, &mut reads, sale_id, progress) {
            Ok(()) => checked.push(sale_id),
            Err(RunError::Redis(e)) if seckill_common::is_error_reply(&e) => {
                log::error!("sale {sale_id}: not checked: Redis refused: {e}");
                skipped.push(format!("{sale_id} ({e})"));
            }
            Err(e) => return Err(e),
        }
    }
    *replica = reads.figures;
    payments_of_no_sale(p)?;
    if let Some(after) = p.config.archive_after {
        p.lock.keep()?;
        let grace = p.config.reconcile_grace;
        crate::sale_archive::archive_due(
            p.review,
            &mut p.redis,
            &mut p.mysql,
            &checked,
            after,
            grace,
        )?;
    }
    if !skipped.is_empty() {
        return Err(RunError::Unchecked(format!(
            "Redis refused a command on their keys: {}",
            skipped.join("; ")
        )));
    }
    Ok(())
}

/// Puts on record what interruptions left half done: an action
/// interrupted after its effect must be on record before a run reads the
/// state it changed.
fn complete_interrupted(p: &mut Pass<'_>) -> Result<(), RunError> {
    let config = p.config;
    crate::settle::complete_pending(
        p.review,
        || connect::redis(&config.services),
        || connect::mysql(&config.services),
    )?;
    crate::payment_dead_letters::complete_pending(p.review, &mut p.redis, || {
        connect::mysql(&config.services)
    })?;
    crate::sale_archive::complete_interrupted(p.review, &mut p.redis, &mut p.mysql)?;
    crate::sale_admin_settle::complete_pending(p.review, &mut p.redis, &mut p.mysql)?;
    Ok(())
}

/// The sales Redis sells that MySQL (`in_mysql`: the sales in play) does
/// not know (`rules/sale_missing_in_mysql.rs`).
fn sales_missing_in_mysql(p: &mut Pass<'_>, in_mysql: &[u64]) -> Result<(), RunError> {
    let in_mysql: HashSet<u64> = in_mysql.iter().copied().collect();
    let redis_only: Vec<u64> = crate::redis_read::set_members(&mut p.redis, SALES)?
        .iter()
        .filter_map(|s| s.parse::<u64>().ok())
        .filter(|id| !in_mysql.contains(id))
        .collect();
    for sale_id in redis_only {
        p.tick()?;
        let Some(observations) = crate::rules::sale_missing_in_mysql::observe(
            &mut p.redis,
            &mut p.mysql,
            sale_id,
            p.config.reconcile_lookback,
        )?
        else {
            continue;
        };
        record(p.review, p.run_id, sale_id, &observations, p.counts, true)?;
        p.counts.sales_checked += 1;
    }
    Ok(())
}

/// Checks sale `sale_id`: an archived one for its payments only, a paused
/// one as its one data-loss finding, any other by every rule.
fn check_sale(
    p: &mut Pass<'_>,
    reads: &mut Reads,
    sale_id: u64,
    progress: &mut Vec<SaleProgress>,
) -> Result<(), RunError> {
    p.tick()?;
    // An archived sale's Redis state is gone on purpose: only its payments
    // are still checked (a late one is a finding).
    if crate::sale_read::is_archived(&mut p.mysql, sale_id)? {
        crate::sale_archive::remove_again(&mut p.redis, &mut p.mysql, sale_id)?;
        let odd = crate::mysql_read::odd_payments(&mut p.mysql, Some(sale_id))?;
        let observations = crate::rules::payments::observe(sale_id, &odd);
        record(p.review, p.run_id, sale_id, &observations, p.counts, true)?;
        p.counts.sales_checked += 1;
        return Ok(());
    }
    // A paused sale (Redis lost data of it) is one finding until it is
    // repaired; its other findings stay as they are.
    if let Some(paused) =
        crate::rules::redis_data_loss::observe(&mut p.redis, &mut p.mysql, sale_id)?
    {
        record(p.review, p.run_id, sale_id, &[paused], p.counts, false)?;
        p.counts.sales_checked += 1;
        return Ok(());
    }
    let (shutdown, lock) = (p.shutdown, &mut p.lock);
    let mut tick = || -> Result<(), RunError> {
        if shutdown.is_triggered() {
            return Err(RunError::Interrupted);
        }
        lock.keep()?;
        Ok(())
    };
    let grace = p.config.reconcile_grace;
    let Some(report) = reads.reconcile(&mut p.redis, &mut p.mysql, grace, &mut tick, sale_id)?
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
    p.counts.young += report.young;
    record(
        p.review,
        p.run_id,
        sale_id,
        &report.observations,
        p.counts,
        true,
    )?;
    p.counts.sales_checked += 1;
    progress.push(report.progress);
    Ok(())
}

/// Payments the worker could tie to no sale (an unknown reservation) are
/// money received for nothing, and the payment queue's dead letters are
/// payments and cancellations never applied: findings of "sale 0",
/// recorded together (recording closes the unseen).
fn payments_of_no_sale(p: &mut Pass<'_>) -> Result<(), RunError> {
    p.lock.keep()?;
    let orphans = crate::mysql_read::odd_payments(&mut p.mysql, None)?;
    let mut observations = crate::rules::payments::observe(0, &orphans);
    let dead = crate::redis_read::payment_dead_letters(&mut p.redis)?;
    observations.extend(crate::rules::payment_dead_letter::observations(&dead));
    record(p.review, p.run_id, 0, &observations, p.counts, true)
}
