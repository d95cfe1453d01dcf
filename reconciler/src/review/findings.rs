//! Owns the `findings` table of the review store: recording what a run
//! observed without ever duplicating a finding or reopening a closed one,
//! closing findings that are no longer observed, reading them back for the
//! operator, and state changes made by `resolve`.
//!
//! A finding is keyed by kind + sale + subject (the reservation id, the
//! dead-letter entry, or the name of a total such as `mysql_books`). Seeing it
//! again updates `last_seen`, `last_run_id`, `times_seen` and (while open) the
//! evidence. States: `open` (a person must act), `auto_fixed` (the reconciler
//! compensated), `resolved` (an operator acted, or a later run no longer
//! observed it). `auto_fixed` and `resolved` are final for runs.

use crate::review::{ActionKind, ActionStatus, Review, ReviewError};
use rusqlite::{params, OptionalExtension, Row};
use serde::Serialize;

/// The kinds of finding, in the order of [`crate::review::RunCounts::by_kind`].
pub const KINDS: [&str; 7] = [
    "flow_without_order",
    "order_without_ledger",
    "order_without_flow",
    "stock_mismatch",
    "dead_letter",
    "sale_missing_in_mysql",
    "redis_data_loss",
];

/// A kind of finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A Redis flow record with no order that is not on its way (undersell).
    FlowWithoutOrder,
    /// An order with no stock deduction in the MySQL ledger.
    OrderWithoutLedger,
    /// An order whose Redis flow record is missing.
    OrderWithoutFlow,
    /// Totals that disagree (MySQL books, Redis stock, oversell).
    StockMismatch,
    /// A message in the dead-letter list.
    DeadLetter,
    /// A sale live in Redis (in `seckill:sales`, stock or meta present) that
    /// MySQL does not hold: every unit it sells is dead-lettered, never an
    /// order (critical).
    SaleMissingInMysql,
    /// Redis is behind MySQL's marks for a sale (it lost reservations) and
    /// the sale is paused until `sale repair` (critical).
    RedisDataLoss,
}

impl Kind {
    /// The kind's name as stored.
    pub fn as_str(self) -> &'static str {
        KINDS[self.index()]
    }
    /// Its index in [`KINDS`].
    pub fn index(self) -> usize {
        match self {
            Kind::FlowWithoutOrder => 0,
            Kind::OrderWithoutLedger => 1,
            Kind::OrderWithoutFlow => 2,
            Kind::StockMismatch => 3,
            Kind::DeadLetter => 4,
            Kind::SaleMissingInMysql => 5,
            Kind::RedisDataLoss => 6,
        }
    }
}

/// One thing a run observed, before it is recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// What kind of discrepancy.
    pub kind: Kind,
    /// The sale.
    pub sale_id: u64,
    /// What it is about, unique within kind and sale.
    pub subject: String,
    /// The reservation concerned, if one is.
    pub reservation_id: Option<String>,
    /// The buyer concerned, if known.
    pub user_id: Option<String>,
    /// MySQL `orders.id`, if an order is concerned.
    pub order_id: Option<u64>,
    /// Oversell is critical; everything else normal.
    pub critical: bool,
    /// What was seen, as JSON.
    pub evidence: serde_json::Value,
    /// `None` when a person must act; `Some(what was done)` when the run
    /// fixed it.
    pub fixed: Option<String>,
}

/// A finding as stored (the JSON shape of `findings --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    /// Row id, the `FINDING_ID` of `resolve`.
    pub id: i64,
    /// One of [`KINDS`].
    pub kind: String,
    /// The sale.
    pub sale_id: i64,
    /// What it is about.
    pub subject: String,
    /// The reservation concerned.
    pub reservation_id: Option<String>,
    /// The buyer concerned.
    pub user_id: Option<String>,
    /// MySQL `orders.id`.
    pub order_id: Option<i64>,
    /// `normal` or `critical`.
    pub severity: String,
    /// What was seen (JSON).
    pub evidence: serde_json::Value,
    /// `open`, `auto_fixed` or `resolved`.
    pub state: String,
    /// What the reconciler did, for `auto_fixed`.
    pub fix: Option<String>,
    /// First and last time a run observed it (RFC 3339 UTC).
    pub first_seen: String,
    /// See `first_seen`.
    pub last_seen: String,
    /// How many runs observed it.
    pub times_seen: i64,
    /// Who closed it (an operator's `--by`, or `reconciler`).
    pub resolved_by: Option<String>,
    /// When it was closed.
    pub resolved_at: Option<String>,
    /// How: `reorder`, `rollback`, `dismiss` or `no_longer_observed`.
    pub resolution: Option<String>,
    /// The operator's note.
    pub note: Option<String>,
}

/// The state of a finding (`findings.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingState {
    /// A person must act.
    Open,
    /// The reconciler compensated it.
    AutoFixed,
    /// An operator acted, or a later run no longer observed it.
    Resolved,
}

impl FindingState {
    /// The name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingState::Open => "open",
            FindingState::AutoFixed => "auto_fixed",
            FindingState::Resolved => "resolved",
        }
    }
}

impl Finding {
    /// Whether it is [`FindingState::Open`].
    pub fn is_open(&self) -> bool {
        self.state == FindingState::Open.as_str()
    }
}

const COLUMNS: &str = "id, kind, sale_id, subject, reservation_id, user_id, order_id, severity,
  evidence, state, fix, first_seen, last_seen, times_seen, resolved_by, resolved_at,
  resolution, note";

fn finding_from_row(r: &Row<'_>) -> rusqlite::Result<Finding> {
    let evidence: String = r.get(8)?;
    Ok(Finding {
        id: r.get(0)?,
        kind: r.get(1)?,
        sale_id: r.get(2)?,
        subject: r.get(3)?,
        reservation_id: r.get(4)?,
        user_id: r.get(5)?,
        order_id: r.get(6)?,
        severity: r.get(7)?,
        evidence: serde_json::from_str(&evidence).unwrap_or(serde_json::Value::String(evidence)),
        state: r.get(9)?,
        fix: r.get(10)?,
        first_seen: r.get(11)?,
        last_seen: r.get(12)?,
        times_seen: r.get(13)?,
        resolved_by: r.get(14)?,
        resolved_at: r.get(15)?,
        resolution: r.get(16)?,
        note: r.get(17)?,
    })
}

/// What recording one observation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The finding's id.
    pub id: i64,
    /// Whether this is its first observation.
    pub is_new: bool,
    /// Its state after recording.
    pub state: String,
    /// Whether a closed finding was opened again (see `record_observation`).
    pub reopened: bool,
}

impl Review {
    /// Records `obs` as seen by run `run_id` at `now`: inserts it, or updates
    /// `last_seen` of the existing finding of the same kind, sale and subject.
    /// An `open` finding may become `auto_fixed`. A closed one stays closed,
    /// with one exception: a finding closed by `reorder`, `rollback`,
    /// `repair` or `no_longer_observed` and observed again by a run that started after it
    /// was closed is opened again (the action did not cure it, e.g. the
    /// re-queued message was dead-lettered again), so a person sees it. A
    /// dismissed or auto-fixed finding is never reopened.
    pub fn record_observation(
        &self,
        obs: &Observation,
        run_id: i64,
        now: &str,
    ) -> Result<Recorded, ReviewError> {
        let existed: Option<(i64, String, Option<String>, Option<String>)> = self
            .db
            .query_row(
                "SELECT id, state, resolution, resolved_at FROM findings
                 WHERE kind = ?1 AND sale_id = ?2 AND subject = ?3",
                params![obs.kind.as_str(), obs.sale_id as i64, obs.subject],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let run_started: Option<String> = self
            .db
            .query_row(
                "SELECT started_at FROM runs WHERE id = ?1",
                params![run_id],
                |r| r.get(0),
            )
            .optional()?;
        let reopen = match (&existed, &run_started) {
            (Some((_, state, Some(how), Some(at))), Some(started)) => {
                state == FindingState::Resolved.as_str()
                    && matches!(
                        how.as_str(),
                        "reorder" | "rollback" | "repair" | "no_longer_observed"
                    )
                    && started.as_str() > at.as_str()
            }
            _ => false,
        };
        let state = if obs.fixed.is_some() {
            FindingState::AutoFixed
        } else {
            FindingState::Open
        }
        .as_str();
        let (id, state_after): (i64, String) = self.db.query_row(
            "INSERT INTO findings (kind, sale_id, subject, reservation_id, user_id, order_id,
               severity, evidence, state, fix, first_seen, last_seen, first_run_id, last_run_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, ?12, ?12)
             ON CONFLICT (kind, sale_id, subject) DO UPDATE SET
               last_seen = excluded.last_seen,
               last_run_id = excluded.last_run_id,
               times_seen = findings.times_seen + 1,
               evidence = CASE WHEN findings.state = 'open' OR ?13
                               THEN excluded.evidence ELSE findings.evidence END,
               fix = CASE WHEN findings.state = 'open' OR ?13
                          THEN excluded.fix ELSE findings.fix END,
               state = CASE WHEN findings.state = 'open' OR ?13
                            THEN excluded.state ELSE findings.state END
             RETURNING id, state",
            params![
                obs.kind.as_str(),
                obs.sale_id as i64,
                obs.subject,
                obs.reservation_id,
                obs.user_id,
                obs.order_id.map(|n| n as i64),
                if obs.critical { "critical" } else { "normal" },
                obs.evidence.to_string(),
                state,
                obs.fixed,
                now,
                run_id,
                reopen,
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Recorded {
            id,
            is_new: existed.is_none() || reopen,
            state: state_after,
            reopened: reopen,
        })
    }

    /// Closes the open findings of `sale_id` that run `run_id` did not
    /// observe (the discrepancy went away: a message arrived late, an operator
    /// fixed it outside this tool). Each close is logged in `actions`.
    /// Returns how many were closed.
    pub fn close_unobserved(
        &self,
        sale_id: u64,
        run_id: i64,
        now: &str,
    ) -> Result<u64, ReviewError> {
        let ids: Vec<i64> = {
            let mut st = self.db.prepare(
                "SELECT id FROM findings WHERE sale_id = ?1 AND state = 'open'
                   AND (last_run_id IS NULL OR last_run_id <> ?2)",
            )?;
            let rows = st.query_map(params![sale_id as i64, run_id], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        for id in &ids {
            self.set_resolved(*id, "reconciler", "no_longer_observed", None, now)?;
            self.record_action(
                now,
                "reconciler",
                *id,
                ActionKind::Close,
                "a run no longer observed this discrepancy",
                ActionStatus::Done,
                None,
            )?;
        }
        Ok(ids.len() as u64)
    }

    /// Marks finding `id` resolved by `by` (unless already resolved).
    /// Returns whether its state changed.
    pub fn set_resolved(
        &self,
        id: i64,
        by: &str,
        resolution: &str,
        note: Option<&str>,
        now: &str,
    ) -> Result<bool, ReviewError> {
        let n = self.db.execute(
            "UPDATE findings SET state = 'resolved', resolved_by = ?2, resolved_at = ?3,
               resolution = ?4, note = ?5
             WHERE id = ?1 AND state <> 'resolved'",
            params![id, by, now, resolution, note],
        )?;
        Ok(n > 0)
    }

    /// The open findings of the same sale and reservation as finding `id`,
    /// other than `id` itself (an action on a reservation settles them all).
    pub fn open_siblings(&self, f: &Finding) -> Result<Vec<i64>, ReviewError> {
        let Some(rid) = &f.reservation_id else {
            return Ok(Vec::new());
        };
        let mut st = self.db.prepare(
            "SELECT id FROM findings WHERE sale_id = ?1 AND reservation_id = ?2
               AND state = 'open' AND id <> ?3",
        )?;
        let rows = st.query_map(params![f.sale_id, rid, f.id], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Finding `id`.
    ///
    /// Errors: [`ReviewError::NoSuchFinding`].
    pub fn finding(&self, id: i64) -> Result<Finding, ReviewError> {
        self.db
            .query_row(
                &format!("SELECT {COLUMNS} FROM findings WHERE id = ?1"),
                params![id],
                finding_from_row,
            )
            .optional()?
            .ok_or(ReviewError::NoSuchFinding(id))
    }

    /// Findings in `state` (`None`: every state), of `sale` when given,
    /// newest first.
    pub fn list_findings(
        &self,
        state: Option<&str>,
        sale: Option<u64>,
    ) -> Result<Vec<Finding>, ReviewError> {
        let mut st = self.db.prepare(&format!(
            "SELECT {COLUMNS} FROM findings
             WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR sale_id = ?2)
             ORDER BY id DESC"
        ))?;
        let rows = st.query_map(params![state, sale.map(|s| s as i64)], finding_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
