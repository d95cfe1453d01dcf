//! Owns reading the audit log (`actions`) back: the rows of one finding
//! for `findings show`, and the rows of actions on the payment queue's
//! dead letters (`cmd/payment_dlq.rs`), which name neither a finding nor a
//! sale.

use crate::review::{ActionKind, ActionStatus, Review, ReviewError};
use rusqlite::{params, OptionalExtension};
use serde::Serialize;

/// One row of `actions`, as stored (the action's and the result's names as
/// text: a row a newer build wrote is shown, not refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActionRow {
    /// `actions.id`.
    pub id: i64,
    /// When (RFC 3339 UTC).
    pub at: String,
    /// Who acted (`--by`, or `reconciler`).
    pub actor: String,
    /// What was done (`reorder`, `dismiss`, `requeue_payment`...).
    pub action: String,
    /// The result (`started`, `done`, `no_change`, `refused`, `failed`).
    pub result: String,
    /// The `started` row this row completes.
    pub completes: Option<i64>,
    /// What happened, in one line.
    pub detail: String,
}

/// A `started` action on the payment queue without its completion row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPaymentAction {
    /// `actions.id` of the started row.
    pub id: i64,
    /// When it was written.
    pub at: String,
    /// Who acted.
    pub actor: String,
    /// What it does.
    pub action: ActionKind,
}

impl PendingPaymentAction {
    /// The mark its effect leaves (`ACTION_ID@TIME`), as a reorder's.
    pub fn mark(&self) -> String {
        format!("{}@{}", self.id, self.at)
    }
}

/// The kinds of action on the payment queue's dead letters.
const PAYMENT_ACTIONS: [ActionKind; 2] = [ActionKind::RequeuePayment, ActionKind::DropPayment];

impl Review {
    /// Every row about finding `id`, oldest first.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn actions_of(&self, finding_id: i64) -> Result<Vec<ActionRow>, ReviewError> {
        let mut st = self.db.prepare(
            "SELECT id, at, actor, action, result, completes, detail FROM actions
             WHERE finding_id = ?1 ORDER BY id",
        )?;
        let rows = st.query_map(params![finding_id], |r| {
            Ok(ActionRow {
                id: r.get(0)?,
                at: r.get(1)?,
                actor: r.get(2)?,
                action: r.get(3)?,
                result: r.get(4)?,
                completes: r.get(5)?,
                detail: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Appends a row of an action on the payment queue (no finding, no
    /// sale); returns its id.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn record_payment_action(
        &self,
        now: &str,
        actor: &str,
        action: ActionKind,
        detail: &str,
        result: ActionStatus,
        completes: Option<i64>,
    ) -> Result<i64, ReviewError> {
        self.insert_action(&crate::review::ActionRow {
            now,
            actor,
            subject: crate::review::Subject::PaymentQueue,
            action,
            detail,
            result,
            completes,
        })
    }

    /// The open `dead_letter` finding of the payment queue's entry named
    /// `subject` (`payment:ID`, `cancel:RESERVATION`), if there is one.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn open_payment_dead_letter(&self, subject: &str) -> Result<Option<i64>, ReviewError> {
        Ok(self
            .db
            .query_row(
                "SELECT id FROM findings WHERE kind = 'dead_letter' AND sale_id = 0
                   AND subject = ?1 AND state = 'open'",
                params![subject],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// The open `dead_letter` finding of sale `sale_id` named `subject`
    /// (`entry:HEX` for an entry naming no reservation), if there is one.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn open_sale_dead_letter(
        &self,
        sale_id: u64,
        subject: &str,
    ) -> Result<Option<i64>, ReviewError> {
        Ok(self
            .db
            .query_row(
                "SELECT id FROM findings WHERE kind = 'dead_letter' AND sale_id = ?1
                   AND subject = ?2 AND state = 'open'",
                params![sale_id as i64, subject],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Every `started` action on the payment queue without its completion
    /// row, oldest first.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn pending_payment_actions(&self) -> Result<Vec<PendingPaymentAction>, ReviewError> {
        let mut st = self.db.prepare(
            "SELECT s.id, s.at, s.actor, s.action FROM actions s
             WHERE s.result = 'started' AND s.finding_id IS NULL AND s.sale_id IS NULL
               AND s.action IN (?1, ?2)
               AND NOT EXISTS (SELECT 1 FROM actions c WHERE c.completes = s.id)
             ORDER BY s.id",
        )?;
        let rows = st.query_map(
            params![PAYMENT_ACTIONS[0].as_str(), PAYMENT_ACTIONS[1].as_str()],
            |r| {
                Ok(PendingPaymentAction {
                    id: r.get(0)?,
                    at: r.get(1)?,
                    actor: r.get(2)?,
                    action: r.get(3)?,
                })
            },
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
