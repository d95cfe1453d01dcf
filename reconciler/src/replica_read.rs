//! Owns where `run` reads each sale's MySQL side: from the replica
//! (`SECKILL_MYSQL_REPLICA_URL`) once it has applied everything the primary
//! had when the run began (`seckill_common::mysql_replica::catch_up`,
//! bounded by `SECKILL_MYSQL_REPLICA_WAIT`), else from the primary, which
//! the run says in its log and its metrics file.
//!
//! The replica screens, the primary decides: a sale whose scan on the
//! replica shows anything at all (a discrepancy, or something a rule would
//! fix: an order without ledger row, a released order Redis still holds)
//! is scanned again on the primary, and only the primary's result is
//! recorded or acted on. A sale the replica finds clean is recorded from
//! its scan only when its rows there are the primary's (a fingerprint of
//! each, `replica_rows.rs`): a replica that missed an event, and so reads
//! clean where the primary does not, has the sale re-read on the primary.
//! A replica whose position cannot be checked (a primary without a binary
//! log) is not read at all (`mysql_replica::catch_up`).
//!
//! A sale split over buckets is read on the primary: its scan completes
//! half-done transfers in Redis, an action. A replica that fails during the
//! run is dropped and the rest of the run reads the primary.

use crate::config::Config;
use crate::error::RunError;
use crate::rules::{self, SaleReport};
use crate::scan::{self, Ctx};
use seckill_common::mysql_replica::{catch_up, NotCaughtUp};
use seckill_common::redis_target::Con;
use std::time::Duration;

/// What the run did with the replica, for the metrics file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaFigures {
    /// Whether the scans read the replica (`false`: it fell back to the
    /// primary).
    pub used: bool,
    /// How long the catch-up took (or waited before giving up), s.
    pub wait_s: f64,
    /// Sales the replica's scan flagged and the primary re-read.
    pub confirmed_on_primary: u64,
    /// Of those, sales the primary found clean (the replica was behind).
    pub cleared_by_primary: u64,
}

/// The run's reading side: the replica session when it caught up.
pub struct Reads {
    replica: Option<mysql::Conn>,
    /// `None` without a configured replica.
    pub figures: Option<ReplicaFigures>,
}

impl Reads {
    /// Catches the configured replica up with `primary` (see the module
    /// doc); without `SECKILL_MYSQL_REPLICA_URL`, reads the primary
    /// silently. Never fails: a replica that cannot be read is a warning
    /// and the run reads the primary.
    pub fn open(config: &Config, primary: &mut mysql::Conn) -> Reads {
        let Some(url) = &config.mysql_replica_url else {
            return Reads {
                replica: None,
                figures: None,
            };
        };
        match catch_up(
            primary,
            url,
            config.services.mysql_timeout,
            config.mysql_replica_wait,
        ) {
            Ok(c) => {
                log::info!(
                    "reading from the replica at {}: reached the primary's GTID position {:?} in {} ms",
                    seckill_common::redact::redacted(url),
                    c.position,
                    c.waited.as_millis()
                );
                Reads {
                    replica: Some(c.conn),
                    figures: Some(figures(true, c.waited)),
                }
            }
            Err(e) => {
                let waited = match &e {
                    NotCaughtUp::Behind { waited, .. } => *waited,
                    _ => Duration::ZERO,
                };
                log::warn!("reading from the primary: {e}");
                Reads {
                    replica: None,
                    figures: Some(figures(false, waited)),
                }
            }
        }
    }

    /// Reconciles `sale_id` (`rules::reconcile_sale`), screening it on the
    /// replica first when there is one; `None` when MySQL has no such sale.
    ///
    /// Errors: as `rules::reconcile_sale` on the primary.
    pub fn reconcile(
        &mut self,
        redis: &mut Con,
        primary: &mut mysql::Conn,
        grace: Duration,
        tick: &mut dyn FnMut() -> Result<(), RunError>,
        sale_id: u64,
    ) -> Result<Option<SaleReport>, RunError> {
        if let Some(replica) = self.replica.as_mut() {
            let mut ctx = Ctx {
                redis: &mut *redis,
                mysql: replica,
                grace,
                tick: &mut *tick,
            };
            let screened = match screen(&mut ctx, sale_id) {
                Ok(Screen::Clean(report)) => {
                    // The primary's first, so that a row written meanwhile
                    // makes them differ rather than agree; its failure is
                    // the run's.
                    let mine = crate::replica_rows::fingerprint(primary, sale_id)?;
                    match crate::replica_rows::fingerprint(replica, sale_id) {
                        Ok(theirs) if theirs == mine => Ok(Screen::Clean(report)),
                        Ok(_) => {
                            log::warn!(
                                "sale {sale_id}: the replica's rows differ from the primary's \
                                 (an event it missed, a row changed on one side, or a write \
                                 since the run began): read on the primary"
                            );
                            Ok(Screen::Flagged(0))
                        }
                        Err(e) => Err(RunError::Mysql(e)),
                    }
                }
                other => other,
            };
            match screened {
                Ok(Screen::Clean(report)) => return Ok(Some(report)),
                Ok(Screen::Flagged(seen)) => {
                    let report = on_primary(redis, primary, grace, tick, sale_id)?;
                    let found = report.as_ref().map_or(0, |r| r.observations.len());
                    // More on the replica than on the primary: the replica
                    // was behind during the scan, or differs from the primary.
                    if seen > found {
                        log::warn!(
                            "sale {sale_id}: the replica showed {seen} discrepancies; \
                             the primary confirmed {found}"
                        );
                    }
                    if let Some(f) = self.figures.as_mut() {
                        f.confirmed_on_primary += 1;
                        if found == 0 {
                            f.cleared_by_primary += 1;
                        }
                    }
                    return Ok(report);
                }
                Err(RunError::Mysql(e)) => {
                    log::warn!(
                        "reading from the primary from sale {sale_id} on: the replica failed: {}",
                        seckill_common::mysql_error::explain_replica(&e)
                    );
                    self.replica = None;
                    if let Some(f) = self.figures.as_mut() {
                        f.used = false;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        on_primary(redis, primary, grace, tick, sale_id)
    }
}

fn figures(used: bool, waited: Duration) -> ReplicaFigures {
    ReplicaFigures {
        used,
        wait_s: waited.as_secs_f64(),
        confirmed_on_primary: 0,
        cleared_by_primary: 0,
    }
}

fn on_primary(
    redis: &mut Con,
    primary: &mut mysql::Conn,
    grace: Duration,
    tick: &mut dyn FnMut() -> Result<(), RunError>,
    sale_id: u64,
) -> Result<Option<SaleReport>, RunError> {
    let mut ctx = Ctx {
        redis,
        mysql: primary,
        grace,
        tick,
    };
    rules::reconcile_sale(&mut ctx, sale_id)
}

/// What the replica's scan of one sale says.
enum Screen {
    /// Nothing to report or fix: the report to record.
    Clean(SaleReport),
    /// Something (this many observations, 0 when not screened: a sale over
    /// buckets, or one the replica lacks): read it on the primary.
    Flagged(usize),
}

/// Scans `sale_id` on `ctx` (the replica) and applies the rules that only
/// judge, acting on nothing.
fn screen(ctx: &mut Ctx<'_>, sale_id: u64) -> Result<Screen, RunError> {
    if seckill_common::buckets::count(ctx.redis, sale_id)?.unwrap_or(1) != 1 {
        return Ok(Screen::Flagged(0));
    }
    let Some(s) = scan::scan(ctx, sale_id, 1)? else {
        return Ok(Screen::Flagged(0));
    };
    let seen = rules::flow_without_order::observe(&s).len()
        + rules::order_without_flow::observe(&s).len()
        + rules::ledger_without_order::observe(&s).len()
        + rules::payments::observe(sale_id, &s.odd_payments).len()
        + rules::stock_mismatch::observe(&s).len()
        + rules::buyer_over_limit::observe(ctx.mysql, sale_id, s.books.per_user_limit)?.len()
        + rules::order_outside_window::observe(ctx.mysql, sale_id)?.len()
        + s.no_ledger.len()
        + s.released_held.len()
        + s.dead.entries.len()
        + s.dead.foreign.len();
    if seen > 0 {
        return Ok(Screen::Flagged(seen));
    }
    Ok(Screen::Clean(SaleReport {
        observations: Vec::new(),
        young: s.young,
        flow_records: s.flow_records,
        orders: s.orders,
        progress: crate::metrics_file::SaleProgress::of(sale_id, &s.totals, &s.books),
    }))
}

/// A MySQL session for a read-only operator command (`sale list`, `sale
/// show`): the replica once it has caught up with the primary's position
/// (so the command shows every change made before it started), else the
/// primary, with a warning saying why; while the primary is down, the
/// replica as it is, with a warning that it may be behind.
///
/// Errors: the primary's connection ([`RunError`]).
pub fn read_only_connect(config: &Config) -> Result<mysql::Conn, RunError> {
    let mut primary = match crate::connect::mysql(&config.services) {
        Ok(c) => c,
        Err(e) => return crate::primary_down::replica_instead(config, &e).ok_or(e),
    };
    let Some(url) = &config.mysql_replica_url else {
        return Ok(primary);
    };
    match catch_up(
        &mut primary,
        url,
        config.services.mysql_timeout,
        config.mysql_replica_wait,
    ) {
        Ok(c) => Ok(c.conn),
        Err(e) => {
            log::warn!("reading from the primary: {e}");
            Ok(primary)
        }
    }
}
