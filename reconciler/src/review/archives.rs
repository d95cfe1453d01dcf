//! Owns the review store's statements about archived sales (`sale
//! archive`, `sale_archive.rs`): what the archive's checks read (a sale's
//! open findings, a finished run since a time) and its audit rows, the
//! `archive` actions, which name a sale rather than a finding; the
//! partial index `actions_archived_once` lets each sale have one `done`
//! row at most.

use crate::review::{ActionKind, ActionStatus, Review, ReviewError};
use rusqlite::params;

impl Review {
    /// The open findings of sale `sale_id`.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn open_count_of(&self, sale_id: u64) -> Result<u64, ReviewError> {
        let n: i64 = self.db.query_row(
            "SELECT COUNT(*) FROM findings WHERE sale_id = ?1 AND state = 'open'",
            params![sale_id as i64],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }

    /// Whether a run that did not fail started after `at` (RFC 3339 UTC,
    /// as stored) and finished.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn run_finished_since(&self, at: &str) -> Result<bool, ReviewError> {
        let n: i64 = self.db.query_row(
            "SELECT COUNT(*) FROM runs WHERE started_at > ?1
               AND outcome IN ('clean', 'open_findings')",
            params![at],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    /// Whether sale `sale_id` has its `done` archive row.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn archive_recorded(&self, sale_id: u64) -> Result<bool, ReviewError> {
        let n: i64 = self.db.query_row(
            "SELECT COUNT(*) FROM actions
             WHERE action = 'archive' AND result = 'done' AND sale_id = ?1",
            params![sale_id as i64],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    /// Appends an `archive` row for sale `sale_id`; returns whether it was
    /// written (a second `done` row for a sale is not: another process
    /// recorded that archive first).
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn record_archive(
        &self,
        now: &str,
        actor: &str,
        sale_id: u64,
        detail: &str,
        result: ActionStatus,
    ) -> Result<bool, ReviewError> {
        let n = self.db.execute(
            "INSERT OR IGNORE INTO actions (at, actor, finding_id, action, detail, result, sale_id)
             VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6)",
            params![
                now,
                actor,
                ActionKind::Archive.as_str(),
                detail,
                result.as_str(),
                sale_id as i64
            ],
        )?;
        Ok(n == 1)
    }
}
