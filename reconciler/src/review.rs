//! Owns the SQLite review store: opening the file (mode 0600, WAL), its
//! versioned schema and migrations, the `runs` table and the append-only
//! `actions` audit log. Findings live in `review/findings.rs`.
//!
//! Tables (times are RFC 3339 UTC text with ms, e.g.
//! `2026-11-29T20:00:00.123Z`, so they sort and read well in `sqlite3`):
//!
//! - `runs`: one row per `run`: start, end, sales checked, findings observed
//!   by kind, auto-fixes, open findings after the run, outcome.
//! - `findings`: one row per kind + sale + subject (see `review/findings.rs`).
//! - `actions`: who did what to which finding, when, and the result; triggers
//!   refuse `UPDATE` and `DELETE`. An action with an effect outside SQLite
//!   (a Redis release, a re-queued message) is written ahead: a `started`
//!   row committed before the effect, then one completion row (`done`,
//!   `no_change`, `refused` or `failed`, its `completes` naming the started
//!   row, `UNIQUE`) after it; see `settle.rs`.

pub mod actions;
pub mod archives;
pub mod findings;
pub mod sale_actions;

use crate::stored::stored_enum;
use rusqlite::{params, Connection, OpenFlags};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a writer waits for another process's write lock on the file
/// (a `run` under the timer and an operator's `resolve` at the same time).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// The schema migrations, applied in order and recorded in `user_version`.
/// Never edit a released one; append.
const MIGRATIONS: &[&str] = &[
    r#"
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
"#,
    // 2 (Redis data loss): the kinds `sale_missing_in_mysql` and `redis_data_loss`,
    // the action `repair`, and the write-ahead audit:
    // result `started` and `completes` (the started row a completion closes).
    // SQLite cannot alter a CHECK, so both tables are rebuilt, ids kept; the
    // actions are parked in a plain copy while `findings` is swapped, so no
    // foreign key ever points at a missing table.
    r#"
ALTER TABLE runs ADD COLUMN sale_missing_in_mysql INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN redis_data_loss INTEGER NOT NULL DEFAULT 0;
CREATE TABLE findings_v2 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('flow_without_order', 'order_without_ledger',
    'order_without_flow', 'stock_mismatch', 'dead_letter', 'sale_missing_in_mysql',
    'redis_data_loss')),
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
INSERT INTO findings_v2 SELECT * FROM findings;
CREATE TABLE actions_parked AS SELECT * FROM actions;
DROP TRIGGER actions_no_update;
DROP TRIGGER actions_no_delete;
DROP TABLE actions;
DROP TABLE findings;
ALTER TABLE findings_v2 RENAME TO findings;
CREATE TABLE actions (
  id INTEGER PRIMARY KEY,
  at TEXT NOT NULL,
  actor TEXT NOT NULL,
  finding_id INTEGER NOT NULL REFERENCES findings (id),
  action TEXT NOT NULL
    CHECK (action IN ('compensate', 'reorder', 'rollback', 'dismiss', 'close', 'repair')),
  detail TEXT NOT NULL,
  result TEXT NOT NULL
    CHECK (result IN ('started', 'done', 'no_change', 'refused', 'failed')),
  completes INTEGER REFERENCES actions (id)
);
INSERT INTO actions (id, at, actor, finding_id, action, detail, result)
  SELECT id, at, actor, finding_id, action, detail, result FROM actions_parked ORDER BY id;
DROP TABLE actions_parked;
CREATE INDEX findings_state ON findings (state, sale_id);
CREATE INDEX findings_reservation ON findings (sale_id, reservation_id);
CREATE INDEX actions_finding ON actions (finding_id);
CREATE UNIQUE INDEX actions_completes ON actions (completes);
CREATE TRIGGER actions_no_update BEFORE UPDATE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
"#,
    // 3 (the order lifecycle): the kinds
    // `released_in_mysql_held_in_redis`, `late_payment`,
    // `payment_amount_mismatch`, `payment_unknown_reservation`,
    // `payment_not_payable`, rebuilt as in 2.
    r#"
ALTER TABLE runs ADD COLUMN released_in_mysql_held_in_redis INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN late_payment INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN payment_amount_mismatch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN payment_unknown_reservation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN payment_not_payable INTEGER NOT NULL DEFAULT 0;
CREATE TABLE findings_v3 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('flow_without_order', 'order_without_ledger',
    'order_without_flow', 'stock_mismatch', 'dead_letter', 'sale_missing_in_mysql',
    'redis_data_loss', 'released_in_mysql_held_in_redis', 'late_payment',
    'payment_amount_mismatch', 'payment_unknown_reservation', 'payment_not_payable')),
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
INSERT INTO findings_v3 SELECT * FROM findings;
CREATE TABLE actions_parked AS SELECT * FROM actions;
DROP TRIGGER actions_no_update;
DROP TRIGGER actions_no_delete;
DROP TABLE actions;
DROP TABLE findings;
ALTER TABLE findings_v3 RENAME TO findings;
CREATE TABLE actions (
  id INTEGER PRIMARY KEY,
  at TEXT NOT NULL,
  actor TEXT NOT NULL,
  finding_id INTEGER NOT NULL REFERENCES findings (id),
  action TEXT NOT NULL
    CHECK (action IN ('compensate', 'reorder', 'rollback', 'dismiss', 'close', 'repair')),
  detail TEXT NOT NULL,
  result TEXT NOT NULL
    CHECK (result IN ('started', 'done', 'no_change', 'refused', 'failed')),
  completes INTEGER REFERENCES actions (id)
);
INSERT INTO actions SELECT * FROM actions_parked ORDER BY id;
DROP TABLE actions_parked;
CREATE INDEX findings_state ON findings (state, sale_id);
CREATE INDEX findings_reservation ON findings (sale_id, reservation_id);
CREATE INDEX actions_finding ON actions (finding_id);
CREATE UNIQUE INDEX actions_completes ON actions (completes);
CREATE TRIGGER actions_no_update BEFORE UPDATE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
"#,
    // 4 (payments, archives): the kind `payment_conflict`; the action `archive`
    // (`sale archive`), an action on a sale rather than a finding:
    // `actions.finding_id` may be NULL and `actions.sale_id` names the
    // sale; one `done` archive row per sale at most. Rebuilt as in 2.
    r#"
ALTER TABLE runs ADD COLUMN payment_conflict INTEGER NOT NULL DEFAULT 0;
CREATE TABLE findings_v4 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('flow_without_order', 'order_without_ledger',
    'order_without_flow', 'stock_mismatch', 'dead_letter', 'sale_missing_in_mysql',
    'redis_data_loss', 'released_in_mysql_held_in_redis', 'late_payment',
    'payment_amount_mismatch', 'payment_unknown_reservation', 'payment_not_payable',
    'payment_conflict')),
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
INSERT INTO findings_v4 SELECT * FROM findings;
CREATE TABLE actions_parked AS SELECT * FROM actions;
DROP TRIGGER actions_no_update;
DROP TRIGGER actions_no_delete;
DROP TABLE actions;
DROP TABLE findings;
ALTER TABLE findings_v4 RENAME TO findings;
CREATE TABLE actions (
  id INTEGER PRIMARY KEY,
  at TEXT NOT NULL,
  actor TEXT NOT NULL,
  finding_id INTEGER REFERENCES findings (id),
  action TEXT NOT NULL
    CHECK (action IN ('compensate', 'reorder', 'rollback', 'dismiss', 'close', 'repair',
                      'archive')),
  detail TEXT NOT NULL,
  result TEXT NOT NULL
    CHECK (result IN ('started', 'done', 'no_change', 'refused', 'failed')),
  completes INTEGER REFERENCES actions (id),
  sale_id INTEGER,
  CHECK ((finding_id IS NULL) = (action = 'archive')),
  CHECK ((sale_id IS NULL) = (action <> 'archive'))
);
INSERT INTO actions (id, at, actor, finding_id, action, detail, result, completes)
  SELECT id, at, actor, finding_id, action, detail, result, completes
  FROM actions_parked ORDER BY id;
DROP TABLE actions_parked;
CREATE INDEX findings_state ON findings (state, sale_id);
CREATE INDEX findings_reservation ON findings (sale_id, reservation_id);
CREATE INDEX actions_finding ON actions (finding_id);
CREATE UNIQUE INDEX actions_completes ON actions (completes);
CREATE UNIQUE INDEX actions_archived_once ON actions (sale_id)
  WHERE action = 'archive' AND result = 'done';
CREATE TRIGGER actions_no_update BEFORE UPDATE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
"#,
    // 5: kinds and actions are not listed in CHECKs (the build writes
    // only the names its enums have, and reads past names it does not know),
    // so a new kind or action needs no table rebuild; per-kind counts of a
    // run go to `run_counts`, one row per kind observed; `runs.reopened`
    // counts findings a run opened again apart from the new ones. An action
    // names a finding, a sale, or neither (an action on the payments queue),
    // never both. Rebuilt as in 2.
    r#"
ALTER TABLE runs ADD COLUMN reopened INTEGER NOT NULL DEFAULT 0;
CREATE TABLE run_counts (
  run_id INTEGER NOT NULL REFERENCES runs (id),
  kind TEXT NOT NULL,
  observed INTEGER NOT NULL,
  PRIMARY KEY (run_id, kind)
);
CREATE TABLE findings_v5 (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind <> ''),
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
INSERT INTO findings_v5 SELECT * FROM findings;
CREATE TABLE actions_parked AS SELECT * FROM actions;
DROP TRIGGER actions_no_update;
DROP TRIGGER actions_no_delete;
DROP TABLE actions;
DROP TABLE findings;
ALTER TABLE findings_v5 RENAME TO findings;
CREATE TABLE actions (
  id INTEGER PRIMARY KEY,
  at TEXT NOT NULL,
  actor TEXT NOT NULL,
  finding_id INTEGER REFERENCES findings (id),
  action TEXT NOT NULL CHECK (action <> ''),
  detail TEXT NOT NULL,
  result TEXT NOT NULL
    CHECK (result IN ('started', 'done', 'no_change', 'refused', 'failed')),
  completes INTEGER REFERENCES actions (id),
  sale_id INTEGER,
  CHECK (finding_id IS NULL OR sale_id IS NULL)
);
INSERT INTO actions (id, at, actor, finding_id, action, detail, result, completes, sale_id)
  SELECT id, at, actor, finding_id, action, detail, result, completes, sale_id
  FROM actions_parked ORDER BY id;
DROP TABLE actions_parked;
CREATE INDEX findings_state ON findings (state, sale_id);
CREATE INDEX findings_reservation ON findings (sale_id, reservation_id);
CREATE INDEX actions_finding ON actions (finding_id);
CREATE INDEX actions_sale ON actions (sale_id);
CREATE UNIQUE INDEX actions_completes ON actions (completes);
CREATE UNIQUE INDEX actions_archived_once ON actions (sale_id)
  WHERE action = 'archive' AND result = 'done';
CREATE TRIGGER actions_no_update BEFORE UPDATE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
CREATE TRIGGER actions_no_delete BEFORE DELETE ON actions
  BEGIN SELECT RAISE(ABORT, 'actions is append-only'); END;
"#,
];

stored_enum! {
    /// What an action row records being done (`actions.action`).
    pub enum ActionKind {
        /// The reconciler's automatic ledger compensation.
        Compensate => "compensate",
        /// An operator queued a reservation's order message again.
        Reorder => "reorder",
        /// An operator released a reservation in Redis.
        Rollback => "rollback",
        /// An operator made the order of a stock-ledger deduction without
        /// order again (`resolve --recreate`).
        Recreate => "recreate",
        /// An operator closed a finding without any other change.
        Dismiss => "dismiss",
        /// The reconciler closed a finding a run no longer observed.
        Close => "close",
        /// An operator rebuilt a paused sale's Redis state from MySQL
        /// (`sale repair`).
        Repair => "repair",
        /// An operator, or `run` after `SECKILL_ARCHIVE_AFTER`, removed an
        /// ended sale's Redis keys (`sale archive`); names a sale, no finding.
        Archive => "archive",
        /// An operator put a payment dead letter back on the payment queue
        /// (`dead-letter requeue payments`); names neither finding nor sale.
        RequeuePayment => "requeue_payment",
        /// An operator removed a payment dead letter, kept in the payment
        /// queue's settled hash (`dead-letter drop payments`); names neither
        /// finding nor sale.
        DropPayment => "drop_payment",
        /// An operator removed a sale's dead letter that names no
        /// reservation, kept in the sale's archive (`dead-letter drop SALE
        /// ENTRY`); names a sale.
        DropDeadLetter => "drop_dead_letter",
        /// An operator paused a sale (`sale pause`); names a sale.
        Pause => "pause",
        /// An operator ended their pause of a sale (`sale resume`); names
        /// a sale.
        Resume => "resume",
        /// An operator ended a sale now (`sale end`); names a sale.
        End => "end",
        /// An operator moved a sale's end later (`sale extend`); names a
        /// sale.
        Extend => "extend",
        /// An operator put more units on sale (`sale add-stock`); names a
        /// sale.
        AddStock => "add_stock",
    }
}

stored_enum! {
    /// The status of an action row (`actions.result`).
    pub enum ActionStatus {
        /// Written ahead, before an effect outside SQLite; exactly one later row
        /// with `completes` = this row's id records how it ended.
        Started => "started",
        /// It changed what it set out to change (for a finding: open → closed;
        /// at most one such row per closing of a finding).
        Done => "done",
        /// Nothing was left to change (already released, already queued, the
        /// finding already settled).
        NoChange => "no_change",
        /// Not allowed; nothing changed.
        Refused => "refused",
        /// It did not happen (e.g. interrupted before its effect); nothing
        /// changed.
        Failed => "failed",
    }
}

stored_enum! {
    /// How a run ended (`runs.outcome`).
    pub enum RunOutcome {
        /// No open finding after it.
        Clean => "clean",
        /// Open findings remain for a person.
        OpenFindings => "open_findings",
        /// It could not finish (`runs.error` says why).
        Failed => "failed",
    }
}

/// A `started` action row that no completion row closes yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAction {
    /// `actions.id` of the started row.
    pub id: i64,
    /// When it was written (RFC 3339 UTC).
    pub at: String,
    /// Who acted.
    pub actor: String,
    /// The finding acted on.
    pub finding_id: i64,
    /// What it does.
    pub action: ActionKind,
}

impl PendingAction {
    /// The mark the effect leaves where it needs one (a reorder's entry in
    /// `seckill:{sale:ID}:reordered`): unique per review file and row.
    pub fn mark(&self) -> String {
        format!("{}@{}", self.id, self.at)
    }
}

/// Why the review store could not be used.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReviewError {
    /// The file at this path (`SECKILL_REVIEW_DB`) could not be created,
    /// read or its mode set.
    File(PathBuf, std::io::Error),
    /// SQLite refused an operation.
    Sqlite(rusqlite::Error),
    /// The file's schema is newer than this build knows.
    TooNew(i64),
    /// No finding has this id.
    NoSuchFinding(i64),
    /// A command other than `run` found no review file at this path (only
    /// `run` creates one).
    Missing(PathBuf),
    /// The file at this path exists but no `run` ever wrote a review store
    /// into it (SQLite `user_version` 0, e.g. an empty file).
    NeverRun(PathBuf),
}

impl fmt::Display for ReviewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReviewError::File(p, e) => {
                write!(f, "review store SECKILL_REVIEW_DB={}: ", p.display())?;
                match p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    Some(d) if e.kind() == std::io::ErrorKind::NotFound && !d.exists() => write!(
                        f,
                        "its directory {} does not exist: create it, or set \
                         SECKILL_REVIEW_DB to a file in an existing one",
                        d.display()
                    ),
                    _ => write!(f, "{e}"),
                }
            }
            ReviewError::Sqlite(e) => write!(f, "review store: sqlite: {e}"),
            ReviewError::TooNew(v) => write!(
                f,
                "review store: schema version {v} is newer than this build ({})",
                MIGRATIONS.len()
            ),
            ReviewError::NoSuchFinding(id) => write!(
                f,
                "review store: no finding {id}: `seckill-reconciler findings --state all` \
                 lists every finding of SECKILL_REVIEW_DB"
            ),
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

/// What an action row is about: `actions.finding_id` or `actions.sale_id`,
/// or neither for an action on the payment queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A finding (`resolve`, a compensation, a close).
    Finding(i64),
    /// A sale (`sale pause`, `sale add-stock`, ...).
    Sale(u64),
    /// The payment queue (`dead-letter requeue|drop payments`).
    PaymentQueue,
}

/// One action row to append.
struct ActionRow<'a> {
    now: &'a str,
    actor: &'a str,
    subject: Subject,
    action: ActionKind,
    detail: &'a str,
    result: ActionStatus,
    completes: Option<i64>,
}

/// An open review store.
pub struct Review {
    /// The SQLite connection (WAL mode, foreign keys on, busy timeout set).
    /// Private: every statement lives in this module, [`findings`] or
    /// [`archives`].
    db: Connection,
}

/// The finding counts of one run, by kind, plus what the run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Sales reconciled.
    pub sales_checked: u64,
    /// Observations of each kind in this run, in [`findings::Kind::ALL`]
    /// order; an observation of a finding an operator settled for good
    /// (dismissed, a payment dropped: it stays closed) is not counted.
    pub by_kind: [u64; findings::Kind::ALL.len()],
    /// Findings seen for the first time.
    pub new_findings: u64,
    /// Closed findings a run observed again and opened again (not new).
    pub reopened: u64,
    /// Compensations done in this run.
    pub auto_fixed: u64,
    /// Flow records without an order skipped as younger than
    /// `SECKILL_RECONCILE_GRACE` (their message may be on its way).
    pub young: u64,
}

impl Review {
    /// Opens (creating with mode 0600 when missing) the review file at
    /// `path`, switches it to WAL and applies missing migrations. Only `run`
    /// uses this: it is the command that writes the review store.
    ///
    /// Errors: [`ReviewError::File`], [`ReviewError::Sqlite`],
    /// [`ReviewError::TooNew`].
    pub fn open(path: &Path) -> Result<Review, ReviewError> {
        create_private(path).map_err(|e| ReviewError::File(path.to_path_buf(), e))?;
        Review::open_retrying(path, true)
    }

    /// Opens the review file a `run` wrote at `path`, never creating one:
    /// every command but `run` uses it (`findings` and every audited
    /// command), so an operator who forgot `SECKILL_REVIEW_DB` is told so
    /// instead of writing the audit to a stray file and seeing "no
    /// findings" in it. Applies missing migrations to an older store.
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
            Err(e) => Err(ReviewError::File(path.to_path_buf(), e)),
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

    /// Runs `f` in one write transaction (`BEGIN IMMEDIATE`, so two
    /// processes never interleave their writes): commits when `f` returns
    /// `Ok`, rolls back when it returns `Err` (a failed rollback is ignored:
    /// SQLite rolls back when the connection closes).
    ///
    /// Errors: `f`'s, or SQLite failing to begin or commit.
    pub fn immediate<T, E: From<ReviewError>>(
        &self,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.db
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| E::from(ReviewError::Sqlite(e)))?;
        match f() {
            Ok(v) => {
                self.db
                    .execute_batch("COMMIT")
                    .map_err(|e| E::from(ReviewError::Sqlite(e)))?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.db.execute_batch("ROLLBACK");
                Err(e)
            }
        }
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
            (Some(_), _) => RunOutcome::Failed,
            (None, Some(0)) => RunOutcome::Clean,
            (None, _) => RunOutcome::OpenFindings,
        };
        let k = &counts.by_kind;
        self.db.execute(
            "UPDATE runs SET finished_at = ?2, sales_checked = ?3, flow_without_order = ?4,
               order_without_ledger = ?5, order_without_flow = ?6, stock_mismatch = ?7,
               dead_letter = ?8, new_findings = ?9, auto_fixed = ?10, open_after = ?11,
               outcome = ?12, error = ?13, sale_missing_in_mysql = ?14, redis_data_loss = ?15,
               released_in_mysql_held_in_redis = ?16, late_payment = ?17,
               payment_amount_mismatch = ?18, payment_unknown_reservation = ?19,
               payment_not_payable = ?20, payment_conflict = ?21, reopened = ?22
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
                k[5] as i64,
                k[6] as i64,
                k[7] as i64,
                k[8] as i64,
                k[9] as i64,
                k[10] as i64,
                k[11] as i64,
                k[12] as i64,
                counts.reopened as i64,
            ],
        )?;
        // One row per kind observed: the place for every kind, those without
        // a column of their own in `runs` included.
        for (kind, n) in findings::Kind::ALL.iter().zip(k.iter()) {
            if *n > 0 {
                self.db.execute(
                    "INSERT OR REPLACE INTO run_counts (run_id, kind, observed)
                     VALUES (?1, ?2, ?3)",
                    params![id, kind.as_str(), *n as i64],
                )?;
            }
        }
        Ok(())
    }

    /// Appends one row about finding `finding_id` to the audit log;
    /// `completes`: the `started` row this row completes, if any (at most
    /// one completion per started row).
    #[allow(clippy::too_many_arguments)] // one argument per column of the row
    pub fn record_action(
        &self,
        now: &str,
        actor: &str,
        finding_id: i64,
        action: ActionKind,
        detail: &str,
        result: ActionStatus,
        completes: Option<i64>,
    ) -> Result<i64, ReviewError> {
        let row = ActionRow {
            now,
            actor,
            subject: Subject::Finding(finding_id),
            action,
            detail,
            result,
            completes,
        };
        self.insert_action(&row)
    }

    /// The one place an action row is written (every `record_*_action`
    /// calls it); returns the row's id.
    ///
    /// Errors: [`ReviewError::Sqlite`] (a second completion of one started
    /// row included: `actions_completes` is unique).
    fn insert_action(&self, row: &ActionRow<'_>) -> Result<i64, ReviewError> {
        let (finding_id, sale_id) = match row.subject {
            Subject::Finding(id) => (Some(id), None),
            Subject::Sale(id) => (None, Some(id as i64)),
            Subject::PaymentQueue => (None, None),
        };
        self.db.execute(
            "INSERT INTO actions (at, actor, finding_id, action, detail, result, completes, sale_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                row.now,
                row.actor,
                finding_id,
                row.action.as_str(),
                row.detail,
                row.result.as_str(),
                row.completes,
                sale_id
            ],
        )?;
        Ok(self.db.last_insert_rowid())
    }

    /// Every `started` row without its completion row, oldest first.
    pub fn pending_actions(&self) -> Result<Vec<PendingAction>, ReviewError> {
        let mut st = self.db.prepare(
            "SELECT s.id, s.at, s.actor, s.finding_id, s.action FROM actions s
             WHERE s.result = 'started' AND s.finding_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM actions c WHERE c.completes = s.id)
             ORDER BY s.id",
        )?;
        let rows = st.query_map([], |r| {
            Ok(PendingAction {
                id: r.get(0)?,
                at: r.get(1)?,
                actor: r.get(2)?,
                finding_id: r.get(3)?,
                action: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Whether `started` row `id` has its completion row.
    pub fn is_completed(&self, id: i64) -> Result<bool, ReviewError> {
        let n: i64 = self.db.query_row(
            "SELECT COUNT(*) FROM actions WHERE completes = ?1",
            params![id],
            |r| r.get(0),
        )?;
        Ok(n > 0)
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

    /// Open findings per (kind, severity), only the pairs that have some;
    /// a stored name this build does not know is skipped.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn open_by_kind(
        &self,
    ) -> Result<Vec<(findings::Kind, findings::Severity, u64)>, ReviewError> {
        let mut q = self.db.prepare(
            "SELECT kind, severity, COUNT(*) FROM findings WHERE state = 'open'
             GROUP BY kind, severity",
        )?;
        let rows = q.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (kind, severity, n) = row?;
            if let (Ok(k), Ok(sv)) = (kind.parse(), severity.parse()) {
                out.push((k, sv, n.max(0) as u64));
            }
        }
        Ok(out)
    }

    /// When the last run that did not fail finished (RFC 3339, as stored),
    /// `None` when none has.
    ///
    /// Errors: [`ReviewError::Sqlite`].
    pub fn last_success(&self) -> Result<Option<String>, ReviewError> {
        Ok(self.db.query_row(
            "SELECT MAX(finished_at) FROM runs WHERE outcome IN ('clean', 'open_findings')",
            [],
            |r| r.get(0),
        )?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stored_name_reads_back_as_its_variant_and_no_other() {
        use findings::{FindingState, Kind, Resolution, Severity};
        fn round<T: Copy + PartialEq + std::fmt::Debug + std::str::FromStr>(
            all: &[T],
            name: fn(T) -> &'static str,
        ) {
            for v in all {
                assert_eq!(name(*v).parse::<T>().ok(), Some(*v));
            }
            let names: std::collections::HashSet<_> = all.iter().map(|v| name(*v)).collect();
            assert_eq!(names.len(), all.len());
            assert!("no_such_name".parse::<T>().is_err());
        }
        round(Kind::ALL, Kind::as_str);
        round(FindingState::ALL, FindingState::as_str);
        round(Severity::ALL, Severity::as_str);
        round(ActionKind::ALL, ActionKind::as_str);
        round(ActionStatus::ALL, ActionStatus::as_str);
        round(RunOutcome::ALL, RunOutcome::as_str);
        let resolutions: Vec<Resolution> = ActionKind::ALL
            .iter()
            .map(|a| Resolution::By(*a))
            .chain([Resolution::NoLongerObserved])
            .collect();
        round(&resolutions, Resolution::as_str);
        assert_eq!(Kind::ALL.len(), 17);
        assert_eq!(Kind::RedisDataLoss.index(), 6);
    }

    #[test]
    fn a_version_1_store_migrates_keeping_its_rows_and_the_append_only_log() {
        let dir = std::env::temp_dir().join(format!(
            "seckill-review-migrate-{}-{}",
            std::process::id(),
            seckill_common::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("review.sqlite3");
        {
            let db = Connection::open(&path).unwrap();
            db.execute_batch(MIGRATIONS[0]).unwrap();
            db.execute_batch(
                "PRAGMA user_version = 1;
                 INSERT INTO findings (kind, sale_id, subject, severity, evidence, state,
                   first_seen, last_seen) VALUES ('dead_letter', 4, 'r1', 'normal', '{}',
                   'resolved', 't', 't');
                 INSERT INTO actions (at, actor, finding_id, action, detail, result)
                   VALUES ('t', 'alice', 1, 'rollback', 'released', 'done');",
            )
            .unwrap();
        }
        let review = Review::open(&path).unwrap();
        let version: i64 = review
            .db
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
        let kept: (i64, String) = review
            .db
            .query_row(
                "SELECT finding_id, actor FROM actions WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(kept, (1, "alice".to_string()));
        let started = review
            .record_action(
                "t2",
                "bob",
                1,
                ActionKind::Reorder,
                "x",
                ActionStatus::Started,
                None,
            )
            .unwrap();
        assert_eq!(review.pending_actions().unwrap().len(), 1);
        review
            .record_action(
                "t3",
                "bob",
                1,
                ActionKind::Reorder,
                "y",
                ActionStatus::Done,
                Some(started),
            )
            .unwrap();
        assert!(review.pending_actions().unwrap().is_empty());
        assert!(review
            .record_action(
                "t4",
                "bob",
                1,
                ActionKind::Reorder,
                "twice",
                ActionStatus::Done,
                Some(started),
            )
            .is_err());
        for sql in ["DELETE FROM actions", "UPDATE actions SET actor = 'x'"] {
            let e = review.db.execute(sql, []).unwrap_err().to_string();
            assert_eq!(e, "actions is append-only", "{sql}");
        }
        review
            .db
            .execute(
                "INSERT INTO findings (kind, sale_id, subject, severity, evidence, state,
                   first_seen, last_seen) VALUES ('sale_missing_in_mysql', 5, 'sale',
                   'critical', '{}', 'open', 't', 't')",
                [],
            )
            .unwrap();
        drop(review);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_version_4_store_with_rows_of_every_kind_migrates_keeping_each_row() {
        let dir = std::env::temp_dir().join(format!(
            "seckill-review-migrate4-{}-{}",
            std::process::id(),
            seckill_common::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("review.sqlite3");
        let dump = |db: &Connection, sql: &str| -> Vec<String> {
            let mut st = db.prepare(sql).unwrap();
            let n = st.column_count();
            st.query_map([], |r| {
                Ok((0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join("|"))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        };
        let v4_kinds = [
            "flow_without_order",
            "order_without_ledger",
            "order_without_flow",
            "stock_mismatch",
            "dead_letter",
            "sale_missing_in_mysql",
            "redis_data_loss",
            "released_in_mysql_held_in_redis",
            "late_payment",
            "payment_amount_mismatch",
            "payment_unknown_reservation",
            "payment_not_payable",
            "payment_conflict",
        ];
        let findings_sql = "SELECT * FROM findings ORDER BY id";
        let actions_sql = "SELECT id, at, actor, finding_id, action, detail, result, completes,
                             sale_id FROM actions ORDER BY id";
        let (findings, actions, runs) = {
            let db = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..4] {
                db.execute_batch(sql).unwrap();
            }
            db.execute_batch("PRAGMA user_version = 4").unwrap();
            db.execute(
                "INSERT INTO runs (started_at, finished_at, dead_letter, payment_conflict,
                   new_findings, outcome) VALUES ('t0', 't1', 2, 1, 3, 'open_findings')",
                [],
            )
            .unwrap();
            for (i, kind) in v4_kinds.iter().enumerate() {
                let state = ["open", "auto_fixed", "resolved"][i % 3];
                db.execute(
                    "INSERT INTO findings (kind, sale_id, subject, reservation_id, user_id,
                       order_id, severity, evidence, state, fix, first_seen, last_seen,
                       first_run_id, last_run_id, times_seen, resolved_by, resolved_at,
                       resolution, note)
                     VALUES (?1, ?2, ?3, 'r', 'u', 9, ?4, '{\"e\":1}', ?5, 'f', 't0', 't1',
                       1, 1, 3, 'alice', 't2', 'rollback', 'n')",
                    params![
                        kind,
                        i as i64 % 3 + 1,
                        format!("s{i}"),
                        ["normal", "critical"][i % 2],
                        state
                    ],
                )
                .unwrap();
            }
            db.execute_batch(
                "INSERT INTO actions (at, actor, finding_id, action, detail, result)
                   VALUES ('t', 'alice', 1, 'rollback', 'released', 'started');
                 INSERT INTO actions (at, actor, finding_id, action, detail, result, completes)
                   VALUES ('t', 'alice', 1, 'rollback', 'released', 'done', 1);
                 INSERT INTO actions (at, actor, finding_id, action, detail, result)
                   VALUES ('t', 'bob', 5, 'dismiss', 'seen', 'done');
                 INSERT INTO actions (at, actor, action, detail, result, sale_id)
                   VALUES ('t', 'carol', 'archive', 'sale 7', 'started', 7);
                 INSERT INTO actions (at, actor, action, detail, result, completes, sale_id)
                   VALUES ('t', 'carol', 'archive', 'sale 7', 'done', 4, 7);
                 INSERT INTO actions (at, actor, action, detail, result, sale_id)
                   VALUES ('t', 'carol', 'archive', 'sale 8', 'failed', 8);",
            )
            .unwrap();
            (
                dump(&db, findings_sql),
                dump(&db, actions_sql),
                dump(&db, "SELECT * FROM runs ORDER BY id"),
            )
        };
        assert_eq!(findings.len(), 13);
        let review = Review::open(&path).unwrap();
        let db = &review.db;
        assert_eq!(dump(db, findings_sql), findings);
        assert_eq!(dump(db, actions_sql), actions);
        // The old columns of runs as they were, then `reopened` 0.
        let runs_after: Vec<String> = dump(db, "SELECT * FROM runs ORDER BY id");
        assert_eq!(runs_after.len(), 1);
        assert_eq!(runs_after[0], format!("{}|Integer(0)", runs[0]));
        for sql in ["DELETE FROM actions", "UPDATE actions SET actor = 'x'"] {
            let e = db.execute(sql, []).unwrap_err().to_string();
            assert_eq!(e, "actions is append-only", "{sql}");
        }
        // Sale 7 is archived once; a second `done` archive row is refused,
        // a `started` one and sale 8's first `done` are taken.
        let archive = |sale: i64, result: &str| {
            db.execute(
                "INSERT INTO actions (at, actor, action, detail, result, sale_id)
                 VALUES ('t', 'dan', 'archive', 'again', ?2, ?1)",
                params![sale, result],
            )
        };
        assert!(archive(7, "done").is_err());
        archive(7, "started").unwrap();
        archive(8, "done").unwrap();
        assert!(archive(8, "done").is_err());
        // An action names a finding or a sale, never both.
        assert!(db
            .execute(
                "INSERT INTO actions (at, actor, finding_id, action, detail, result, sale_id)
                 VALUES ('t', 'dan', 1, 'dismiss', 'x', 'done', 7)",
                [],
            )
            .is_err());
        assert_eq!(
            review.pending_actions().unwrap().len(),
            0,
            "the started row 1 was completed by row 2"
        );
        drop(review);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_run_counts_every_kind_in_run_counts_and_a_reopened_finding_apart_from_new_ones() {
        use findings::{Kind, Observation, Resolution};
        let dir = std::env::temp_dir().join(format!(
            "seckill-review-counts-{}-{}",
            std::process::id(),
            seckill_common::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let review = Review::open(&dir.join("review.sqlite3")).unwrap();
        let obs = Observation {
            kind: Kind::LedgerWithoutOrder,
            sale_id: 7,
            subject: "r1".into(),
            reservation_id: Some("r1".into()),
            user_id: None,
            order_id: None,
            critical: true,
            evidence: serde_json::json!({"delta": -1}),
            fixed: None,
        };
        let run1 = review.start_run("2026-01-01T00:00:00.000Z").unwrap();
        let first = review
            .record_observation(&obs, run1, "2026-01-01T00:00:00.001Z")
            .unwrap();
        assert!(first.is_new && !first.reopened);
        let mut counts = RunCounts::default();
        counts.by_kind[Kind::LedgerWithoutOrder.index()] = 1;
        counts.new_findings = 1;
        review
            .finish_run(run1, "2026-01-01T00:00:00.002Z", &counts, Some(1), None)
            .unwrap();
        review
            .set_resolved(
                first.id,
                "alice",
                Resolution::NoLongerObserved,
                None,
                "2026-01-01T00:00:01.000Z",
            )
            .unwrap();
        let run2 = review.start_run("2026-01-01T00:00:02.000Z").unwrap();
        let again = review
            .record_observation(&obs, run2, "2026-01-01T00:00:02.001Z")
            .unwrap();
        assert_eq!(
            (again.id, again.is_new, again.reopened),
            (first.id, false, true)
        );
        let mut counts = RunCounts::default();
        counts.by_kind[Kind::LedgerWithoutOrder.index()] = 1;
        counts.reopened = 1;
        review
            .finish_run(run2, "2026-01-01T00:00:02.002Z", &counts, Some(1), None)
            .unwrap();
        let rows: Vec<(i64, String, i64)> = {
            let mut st = review
                .db
                .prepare("SELECT run_id, kind, observed FROM run_counts ORDER BY run_id")
                .unwrap();
            let rows = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap();
            rows.collect::<Result<_, _>>().unwrap()
        };
        let name = "ledger_without_order".to_string();
        assert_eq!(rows, vec![(run1, name.clone(), 1), (run2, name, 1)]);
        let (new, reopened): (i64, i64) = review
            .db
            .query_row(
                "SELECT new_findings, reopened FROM runs WHERE id = ?1",
                params![run2],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((new, reopened), (0, 1));
        // An action names a finding or a sale, never both.
        assert!(review
            .db
            .execute(
                "INSERT INTO actions (at, actor, finding_id, action, detail, result, sale_id)
                 VALUES ('t', 'bob', ?1, 'dismiss', 'x', 'done', 7)",
                params![first.id],
            )
            .is_err());
        drop(review);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
