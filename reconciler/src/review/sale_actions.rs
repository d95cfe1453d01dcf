//! Owns the review store's statements about an operator's changes to a
//! sale (`sale pause | resume | end | extend | add-stock`,
//! `cmd/sale_admin.rs`): their audit rows, which name a sale rather than a
//! finding, the started ones still without completion, and what the
//! commands check in the store (an open `redis_data_loss` finding).

use crate::review::{ActionKind, ActionStatus, Review, ReviewError};
use rusqlite::params;

/// A sale action's `started` row that no completion row closes yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSaleAction {
    /// `actions.id` of the started row.
    pub id: i64,
    /// When it was written (RFC 3339 UTC).
    pub at: String,
    /// Who acted.
    pub actor: String,
    /// The sale acted on.
    pub sale_id: u64,
    /// What it does.
    pub action: ActionKind,
}

impl PendingSaleAction {
    /// The key of the action's change in MySQL (`sale_changes.action_key`,
    /// the add-stock's ledger row and Redis mark): 32 hex characters, the
    /// row id and an FNV-1a hash of its time, so two review files sharing a
    /// MySQL database do not collide on a row id.
    pub fn key(&self) -> String {
        action_key(self.id, &self.at)
    }
}

/// See [`PendingSaleAction::key`].
pub fn action_key(id: i64, at: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in at.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:016x}{h:016x}", id as u64)
}

impl Review {
    /// Appends one row about sale `sale_id` to the audit log; `completes`:
    /// the `started` row it completes, if any. Returns the row's id.
    ///
    /// Errors: [`ReviewError::Sqlite`] (a second completion of one started
    /// row included: `actions_completes` is unique).
    #[allow(clippy::too_many_arguments)] // one argument per column of the row
    pub fn record_sale_action(
        &self,
        now: &str,
        actor: &str,
        sale_id: u64,
        action: ActionKind,
        detail: &str,
        result: ActionStatus,
        completes: Option<i64>,
    ) -> Result<i64, ReviewError> {
        self.insert_action(&crate::review::ActionRow {
            now,
            actor,
            subject: crate::review::Subject::Sale(sale_id),
            action,
            detail,
            result,
            completes,
        })
    }

    /// Every `started` row naming a sale (not an archive, which completes
    /// itself from MySQL) without its completion row, oldest first; a
    /// stored action this build does not know is skipped.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn pending_sale_actions(&self) -> Result<Vec<PendingSaleAction>, ReviewError> {
        let mut st = self.db.prepare(
            "SELECT s.id, s.at, s.actor, s.sale_id, s.action FROM actions s
             WHERE s.result = 'started' AND s.sale_id IS NOT NULL AND s.finding_id IS NULL
               AND NOT EXISTS (SELECT 1 FROM actions c WHERE c.completes = s.id)
             ORDER BY s.id",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, at, actor, sale_id, action) = row?;
            if let Ok(action) = action.parse::<ActionKind>() {
                out.push(PendingSaleAction {
                    id,
                    at,
                    actor,
                    sale_id: sale_id.max(0) as u64,
                    action,
                });
            }
        }
        Ok(out)
    }

    /// The id of an open `redis_data_loss` finding of sale `sale_id`, if any.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn open_data_loss(&self, sale_id: u64) -> Result<Option<i64>, ReviewError> {
        let mut st = self.db.prepare(
            "SELECT id FROM findings WHERE sale_id = ?1 AND kind = 'redis_data_loss'
               AND state = 'open' ORDER BY id LIMIT 1",
        )?;
        let mut rows = st.query(params![sale_id as i64])?;
        Ok(match rows.next()? {
            Some(r) => Some(r.get(0)?),
            None => None,
        })
    }
}
