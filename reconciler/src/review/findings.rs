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
use crate::stored::stored_enum;
use rusqlite::{params, OptionalExtension, Row};
use serde::Serialize;

stored_enum! {
    /// A kind of finding (`findings.kind`), in the order of
    /// [`crate::review::RunCounts::by_kind`].
    pub enum Kind {
        /// A Redis flow record with no order that is not on its way (undersell).
        FlowWithoutOrder => "flow_without_order",
        /// An order with no stock deduction in the MySQL ledger.
        OrderWithoutLedger => "order_without_ledger",
        /// An order whose Redis flow record is missing.
        OrderWithoutFlow => "order_without_flow",
        /// Totals that disagree (MySQL books, Redis stock, oversell).
        StockMismatch => "stock_mismatch",
        /// A message in the dead-letter list.
        DeadLetter => "dead_letter",
        /// A sale live in Redis (in `seckill:sales`, stock or meta present) that
        /// MySQL does not hold: every unit it sells is dead-lettered, never an
        /// order (critical).
        SaleMissingInMysql => "sale_missing_in_mysql",
        /// Redis is behind MySQL's marks for a sale (it lost reservations) and
        /// the sale is paused until `sale repair` (critical).
        RedisDataLoss => "redis_data_loss",
        /// An order MySQL released (expired, cancelled) whose flow record
        /// Redis still holds: the release's Redis step did not happen. Fixed
        /// automatically by doing it (`auto_fixed`).
        ReleasedInMysqlHeldInRedis => "released_in_mysql_held_in_redis",
        /// A payment received after its order's deadline, or for an order
        /// expired or cancelled: refund it, or re-create the order by hand
        /// if stock allows.
        LatePayment => "late_payment",
        /// A payment whose amount is not the sale's price; the order stays
        /// pending.
        PaymentAmountMismatch => "payment_amount_mismatch",
        /// A payment for a reservation MySQL has no order of.
        PaymentUnknownReservation => "payment_unknown_reservation",
        /// A payment for an order paid already or final without a payment
        /// (a double charge: refund it).
        PaymentNotPayable => "payment_not_payable",
        /// A `payment_id` applied before, delivered again for another
        /// reservation or amount: the first payment stands; check with the
        /// payment service (a reused id, or a forged or corrupted message).
        PaymentConflict => "payment_conflict",
        /// A stock-ledger deduction with no order (the order row was lost
        /// in MySQL while its deduction stayed): the books count a unit no
        /// order holds (critical). Fixed by re-creating the order from the
        /// ledger row, never by a rollback.
        LedgerWithoutOrder => "ledger_without_order",
        /// A payment received for an order its buyer had cancelled before
        /// the payment was applied: refund it (not late: the buyer cancelled).
        PaymentAfterCancellation => "payment_after_cancellation",
        /// A buyer whose orders holding units in MySQL sum to more than the
        /// sale's per-buyer limit (`sales.per_user_limit`): Redis's
        /// allowance was bypassed or lost (critical). A person decides which
        /// order to cancel and refund.
        BuyerOverLimit => "buyer_over_limit",
        /// An order holding units whose reservation time is outside its
        /// sale's window (`reserved_at` before `sales.starts_at`, or at or
        /// after `sales.ends_at`): Redis took it while MySQL records the
        /// sale closed. A person decides whether it stands.
        OrderOutsideWindow => "order_outside_window",
    }
}

impl Kind {
    /// Its index in [`Kind::ALL`].
    pub fn index(self) -> usize {
        Kind::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }

    /// Whether its subject is a payment (a payment not applied as `paid`,
    /// or a conflicting delivery), not the reservation it names: each one
    /// needs its own decision (a refund, a word with the payment service),
    /// so it never settles with another finding of that reservation
    /// ([`Review::open_siblings`]).
    pub fn is_about_a_payment(self) -> bool {
        matches!(
            self,
            Kind::LatePayment
                | Kind::PaymentAmountMismatch
                | Kind::PaymentUnknownReservation
                | Kind::PaymentNotPayable
                | Kind::PaymentConflict
                | Kind::PaymentAfterCancellation
        )
    }
}

stored_enum! {
    /// How much a finding matters (`findings.severity`).
    pub enum Severity {
        /// A person should look.
        Normal => "normal",
        /// Stock was oversold or a sale's units cannot become orders: look now.
        Critical => "critical",
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
    /// Its kind.
    pub kind: Kind,
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
    pub severity: Severity,
    /// What was seen (JSON).
    pub evidence: serde_json::Value,
    /// `open`, `auto_fixed` or `resolved`.
    pub state: FindingState,
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
    pub resolution: Option<Resolution>,
    /// The operator's note.
    pub note: Option<String>,
}

stored_enum! {
    /// The state of a finding (`findings.state`).
    pub enum FindingState {
        /// A person must act.
        Open => "open",
        /// The reconciler compensated it.
        AutoFixed => "auto_fixed",
        /// An operator acted, or a later run no longer observed it.
        Resolved => "resolved",
    }
}

/// How a finding was resolved (`findings.resolution`): by the operator
/// action that settled it, stored under the action's name, or because a run
/// no longer observed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The action (`reorder`, `rollback`, `dismiss`, `repair`) settled it.
    By(ActionKind),
    /// A run no longer observed the discrepancy.
    NoLongerObserved,
}

impl Resolution {
    /// The name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::By(a) => a.as_str(),
            Resolution::NoLongerObserved => "no_longer_observed",
        }
    }

    /// Whether a run that observes the finding again reopens it: the
    /// action did not cure it (a dismissed finding stays closed).
    pub fn reopens(self) -> bool {
        matches!(
            self,
            Resolution::By(
                ActionKind::Reorder
                    | ActionKind::Rollback
                    | ActionKind::Recreate
                    | ActionKind::Repair
                    | ActionKind::RequeuePayment
                    | ActionKind::DropPayment
                    | ActionKind::DropDeadLetter
            ) | Resolution::NoLongerObserved
        )
    }
}

impl std::str::FromStr for Resolution {
    type Err = crate::stored::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "no_longer_observed" => Ok(Resolution::NoLongerObserved),
            _ => s
                .parse()
                .map(Resolution::By)
                .map_err(|_| crate::stored::UnknownName {
                    what: "Resolution",
                    name: s.to_string(),
                }),
        }
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Resolution {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl rusqlite::types::ToSql for Resolution {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl rusqlite::types::FromSql for Resolution {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        v.as_str()?
            .parse()
            .map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

impl Finding {
    /// Whether it is [`FindingState::Open`].
    pub fn is_open(&self) -> bool {
        self.state == FindingState::Open
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
    /// Whether this is its first observation (a reopened finding is not new:
    /// see `reopened`).
    pub is_new: bool,
    /// Its state after recording.
    pub state: FindingState,
    /// Whether a closed finding was opened again (see `record_observation`).
    pub reopened: bool,
}

impl Review {
    /// Records `obs` as seen by run `run_id` at `now`: inserts it, or updates
    /// `last_seen` of the existing finding of the same kind, sale and subject.
    /// An `open` finding may become `auto_fixed`. A closed one stays closed,
    /// with one exception: a finding closed by `reorder`, `rollback`,
    /// `recreate`, `repair` or `no_longer_observed` and observed again by a run that started after it
    /// was closed is opened again (the action did not cure it, e.g. the
    /// re-queued message was dead-lettered again), so a person sees it. A
    /// dismissed or auto-fixed finding is never reopened.
    pub fn record_observation(
        &self,
        obs: &Observation,
        run_id: i64,
        now: &str,
    ) -> Result<Recorded, ReviewError> {
        let existed: Option<(i64, FindingState, Option<Resolution>, Option<String>)> = self
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
                *state == FindingState::Resolved && how.reopens() && started.as_str() > at.as_str()
            }
            _ => false,
        };
        let state = if obs.fixed.is_some() {
            FindingState::AutoFixed
        } else {
            FindingState::Open
        };
        let (id, state_after): (i64, FindingState) = self.db.query_row(
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
                if obs.critical {
                    Severity::Critical
                } else {
                    Severity::Normal
                },
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
            is_new: existed.is_none(),
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
            self.set_resolved(*id, "reconciler", Resolution::NoLongerObserved, None, now)?;
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
        resolution: Resolution,
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

    /// The open findings of the same sale and reservation as finding `f`,
    /// other than `f` itself (an action on a reservation settles them all).
    /// Findings about a payment ([`Kind::is_about_a_payment`]) are nobody's
    /// siblings and have none: dismissing one `payment_conflict` of a
    /// reservation closes that one only, and a rollback of the reservation
    /// leaves its payments' findings open.
    pub fn open_siblings(&self, f: &Finding) -> Result<Vec<i64>, ReviewError> {
        let Some(rid) = &f.reservation_id else {
            return Ok(Vec::new());
        };
        if f.kind.is_about_a_payment() {
            return Ok(Vec::new());
        }
        let mut st = self.db.prepare(
            "SELECT id, kind FROM findings WHERE sale_id = ?1 AND reservation_id = ?2
               AND state = 'open' AND id <> ?3",
        )?;
        let rows = st.query_map(params![f.sale_id, rid, f.id], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, Kind>(1)?))
        })?;
        let mut ids = Vec::new();
        for row in rows {
            let (id, kind) = row?;
            if !kind.is_about_a_payment() {
                ids.push(id);
            }
        }
        Ok(ids)
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
        state: Option<FindingState>,
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
