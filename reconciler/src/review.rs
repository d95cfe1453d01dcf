//! Owns the SQLite review store: opening the file (mode 0600, WAL), its
//! versioned schema and migrations, the `runs` table and the append-only
//! `actions` audit log. Findings live in `review_findings.rs`.
//!
//! Tables (times are RFC 3339 UTC text with ms, e.g.
//! `2026-11-29T20:00:00.123Z`, so they sort and read well in `sqlite3`):
//!
//! - `runs`: one row per `run`: start, end, sales checked, findings observed
//!   by kind, auto-fixes, open findings after the run, outcome.
//! - `findings`: one row per kind + sale + subject (see `review_findings.rs`).
//! - `actions`: who did what to which finding, when, and the result; triggers
//!   refuse `UPDATE` and `DELETE`.

use rusqlite::{params, Connection, OpenFlags};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a writer waits for another process's write lock on the file
/// (a `run` under the timer and an operator's `resolve` at the same time).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The schema migrations, applied in order and recorded in `user_version`.
/// Never edit a released one; append.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  started_at TEXT NOT NULL,
  finished_at TEXT,
  sales_checked INTEGER NOT NULL DEFAULT 0,
  flow_without_order INTEGER NOT NULL DEFAULT 0,
  order_without_ledger INTEGER NOT NULL DEFAULT 0,
  order_without_flow INTEGER NOT NULL DEFAULT 0,
  stock_mismatch INTEGER NOT NULL DEFAULT 0,
  dead_letter INTEGER NOT NULL DEFAULT 0,
  new_findings INTEGER NOT NULL DEFAULT 0,
  auto_fixed INTEGER NOT NULL DEFAULT 0,
  open_after INTEGER,
  outcome TEXT NOT NULL DEFAULT 'running'
    CHECK (outcome IN ('running', 'clean', 'open_findings', 'failed')),
  error TEXT
);
CREATE TABLE findings (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('flow_without_order', 'order_without_ledger',
    'order_without_flow', 'stock_mismatch', 'dead_letter')),
  sale_id INTEGER NOT NULL,
  subject TEXT NOT NULL,
  reservation_id TEXT,
  user_id TEXT,
  order_id INTEGER,
  severity TEXT NOT NULL CHECK (severity IN ('normal', 'critical')),
  evidence TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('open', 'auto_fixed', 'resolved')),
  fix TEXT,
  first_seen TEXT NOT NULL,
  last_seen TEXT NOT NULL,
  first_run_id INTEGER,
  last_run_id INTEGER,
  times_seen INTEGER NOT NULL DEFAULT 1,
  resolved_by TEXT,
  resolved_at TEXT,
  resolution TEXT,
  note TEXT,
  UNIQUE (kind, sale_id, subject)
);
CREATE INDEX findings_state ON findings (state, sale_id);
CREATE INDEX findings_reservation ON findings (sale_id, reservation_id);
CREATE TABLE actions (
  id INTEGER PRIMARY KEY,
  at TEXT NOT NULL,
  actor TEXT NOT NULL,
  finding_id INTEGER NOT NULL REFERENCES findings (id),
  action TEXT NOT NULL
    CHECK (action IN ('compensate', 'reorder', 'rollback', 'dismiss', 'close')),
  detail TEXT NOT NULL,
  result TEXT NOT NULL CHECK (result IN ('done', 'no_change', 'refused', 'failed'))
);
CREATE INDEX actions_finding ON actions (finding_id);
CREATE TRIGGER actions_no_update BEFORE UPDATE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
"#];

/// Why the review store could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReviewError {
    /// The file could not be created or its mode set.
    File(std::io::Error),
    /// SQLite refused an operation.
    Sqlite(rusqlite::Error),
    /// The file's schema is newer than this build knows.
    TooNew(i64),
    /// No finding has this id.
    NoSuchFinding(i64),
    /// `findings` or `resolve` found no review file at this path (only `run`
    /// creates one).
    Missing(PathBuf),
    /// The file at this path exists but no `run` ever wrote a review store
    /// into it (SQLite `user_version` 0, e.g. an empty file).
    NeverRun(PathBuf),
}

impl fmt::Display for ReviewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReviewError::File(e) => write!(f, "review store: {e}"),
            ReviewError::Sqlite(e) => write!(f, "review store: sqlite: {e}"),
            ReviewError::TooNew(v) => write!(
                f,
                "review store: schema version {v} is newer than this build ({})",
                MIGRATIONS.len()
            ),
            ReviewError::NoSuchFinding(id) => write!(f, "review store: no finding {id}"),
            ReviewError::Missing(p) => write!(
                f,
                "no review file at {}: set SECKILL_REVIEW_DB (the reconciler's `run` creates it)",
                p.display()
            ),
            ReviewError::NeverRun(p) => write!(
                f,
                "no review store in {} (no `run` has written it): set SECKILL_REVIEW_DB \
                 to the file the reconciler's `run` writes",
                p.display()
            ),
        }
    }
}

impl std::error::Error for ReviewError {}

impl From<rusqlite::Error> for ReviewError {
    fn from(e: rusqlite::Error) -> Self {
        ReviewError::Sqlite(e)
    }
}

/// An open review store.
pub struct Review {
    /// The SQLite connection (WAL mode, foreign keys on, busy timeout set).
    pub db: Connection,
}

/// The finding counts of one run, by kind, plus what the run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Sales reconciled.
    pub sales_checked: u64,
    /// Observations of each kind in this run, in [`crate::review_findings::KINDS`] order.
    pub by_kind: [u64; 5],
    /// Findings seen for the first time.
    pub new_findings: u64,
    /// Compensations done in this run.
    pub auto_fixed: u64,
}

impl Review {
    /// Opens (creating with mode 0600 when missing) the review file at
    /// `path`, switches it to WAL and applies missing migrations. Only `run`
    /// uses this: it is the command that writes the review store.
    ///
    /// Errors: [`ReviewError::File`], [`ReviewError::Sqlite`],
    /// [`ReviewError::TooNew`].
    pub fn open(path: &Path) -> Result<Review, ReviewError> {
        create_private(path).map_err(ReviewError::File)?;
        Review::open_retrying(path, true)
    }

    /// Opens the review file a `run` wrote at `path`, never creating one:
    /// `findings` and `resolve` use it, so an operator who forgot
    /// `SECKILL_REVIEW_DB` is told so instead of seeing "no findings" in a
    /// new empty file. Applies missing migrations to an older store.
    ///
    /// Errors: [`ReviewError::Missing`] when there is no file,
    /// [`ReviewError::NeverRun`] when it holds no review store (schema
    /// version 0), [`ReviewError::File`], [`ReviewError::Sqlite`],
    /// [`ReviewError::TooNew`].
    pub fn open_existing(path: &Path) -> Result<Review, ReviewError> {
        match std::fs::metadata(path) {
            Ok(_) => Review::open_retrying(path, false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ReviewError::Missing(path.to_path_buf()))
            }
            Err(e) => Err(ReviewError::File(e)),
        }
    }

    /// Opens the existing file at `path`; `fresh_ok`: a file without a
    /// schema (just created by [`Review::open`]) is set up rather than refused.
    fn open_retrying(path: &Path, fresh_ok: bool) -> Result<Review, ReviewError> {
        // Switching a fresh file to WAL takes an exclusive lock and SQLite
        // does not always call the busy handler for it: two processes opening
        // a new file at once get SQLITE_BUSY, so retry within BUSY_TIMEOUT.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match Review::open_once(path, fresh_ok) {
                Err(ReviewError::Sqlite(e))
                    if is_busy(&e) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    fn open_once(path: &Path, fresh_ok: bool) -> Result<Review, ReviewError> {
        // No SQLITE_OPEN_CREATE: the file exists (created by `open`, or
        // checked by `open_existing`); if it vanished meanwhile this fails.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let db = Connection::open_with_flags(path, flags)?;
        db.busy_timeout(BUSY_TIMEOUT)?;
        if !fresh_ok {
            // Checked before the WAL switch below, which would write to it.
            let version: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            if version == 0 {
                return Err(ReviewError::NeverRun(path.to_path_buf()));
            }
        }
        let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            log::warn!("review store: journal_mode is {mode}, not wal");
        }
        db.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = NORMAL;")?;
        let mut review = Review { db };
        review.migrate()?;
        Ok(review)
    }

    fn migrate(&mut self) -> Result<(), ReviewError> {
        // BEGIN IMMEDIATE: two processes opening a fresh file at once must not
        // both apply migration 1.
        let tx = self
            .db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version > MIGRATIONS.len() as i64 {
            return Err(ReviewError::TooNew(version));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            tx.execute_batch(sql)?;
            tx.execute_batch(&format!("PRAGMA user_version = {}", i + 1))?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records the start of a run; returns its id.
    pub fn start_run(&self, now: &str) -> Result<i64, ReviewError> {
        self.db
            .execute("INSERT INTO runs (started_at) VALUES (?1)", params![now])?;
        Ok(self.db.last_insert_rowid())
    }

    /// Records the end of run `id`: its counts, the open findings after it and
    /// the outcome (`clean`, `open_findings` or `failed` with `error`).
    pub fn finish_run(
        &self,
        id: i64,
        now: &str,
        counts: &RunCounts,
        open_after: Option<u64>,
        error: Option<&str>,
    ) -> Result<(), ReviewError> {
        let outcome = match (error, open_after) {
            (Some(_), _) => "failed",
            (None, Some(0)) => "clean",
            (None, _) => "open_findings",
        };
        let k = &counts.by_kind;
        self.db.execute(
            "UPDATE runs SET finished_at = ?2, sales_checked = ?3, flow_without_order = ?4,
               order_without_ledger = ?5, order_without_flow = ?6, stock_mismatch = ?7,
               dead_letter = ?8, new_findings = ?9, auto_fixed = ?10, open_after = ?11,
               outcome = ?12, error = ?13
             WHERE id = ?1",
            params![
                id,
                now,
                counts.sales_checked as i64,
                k[0] as i64,
                k[1] as i64,
                k[2] as i64,
                k[3] as i64,
                k[4] as i64,
                counts.new_findings as i64,
                counts.auto_fixed as i64,
                open_after.map(|n| n as i64),
                outcome,
                error,
            ],
        )?;
        Ok(())
    }

    /// Appends one row to the audit log.
    pub fn record_action(
        &self,
        now: &str,
        actor: &str,
        finding_id: i64,
        action: &str,
        detail: &str,
        result: &str,
    ) -> Result<(), ReviewError> {
        self.db.execute(
            "INSERT INTO actions (at, actor, finding_id, action, detail, result)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![now, actor, finding_id, action, detail, result],
        )?;
        Ok(())
    }

    /// The number of findings in state `open`, over every sale.
    pub fn open_count(&self) -> Result<u64, ReviewError> {
        let n: i64 = self.db.query_row(
            "SELECT COUNT(*) FROM findings WHERE state = 'open'",
            [],
            |r| r.get(0),
        )?;
        Ok(n.max(0) as u64)
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Creates `path` with mode 0600 when it does not exist; an existing file is
/// left as it is (an operator may have chosen other rights on purpose).
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
