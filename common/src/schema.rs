//! Owns the MySQL schema (sales, orders, stock ledger, payments) and its
//! idempotent migrations, plus the one way every binary opens a MySQL
//! connection.
//!
//! Migration 3 (the order lifecycle, `order.rs`): `sales.payment_window_ms`
//! (NULL: orders are final at creation, status `confirmed`) and
//! `sales.rebuy_after_release` (whether a buyer whose order expired or was
//! cancelled may buy again); `orders.pay_by`, `paid_at`, `payment_id`,
//! `released_at` (the MySQL step of a release) and `redis_released_at` (its
//! Redis step done); one order per buyer *holding a unit*
//! (`orders_sale_live_user` on the generated `live_user_id`, NULL once
//! released, replaces `orders_sale_user`); the index (`status`, `pay_by`)
//! the expiry sweep reads; `payments` keyed by `payment_id` (idempotency)
//! with the outcome of each payment.
//!
//! Migration 4 (`bucket_marks.rs`): `sale_bucket_marks`, the data-loss
//! marks of buckets 1 and above of a split sale (bucket 0's stay in
//! `sale_redis_state`, with the sale's one pause).
//!
//! Migration 5 (sales split over buckets, `buckets.rs`): `sales.buckets`,
//! the sale's K as `sale create --shards K` set it (NULL for a sale created
//! before it: `sale load ID` then takes `--shards`, default 1, and records
//! it), so `sale load ID` after Redis lost the sale needs no `--shards`, and
//! the lifecycle finds an order's bucket from MySQL alone.
//!
//! Migration 6: `payment_conflicts`, one row per delivery of a `payment_id`
//! already in `payments` with another reservation or amount (keyed by all
//! three, so a redelivery of the same conflicting message is one row; the
//! first payment stands, the reconciler reports each row as a
//! `payment_conflict`); `sales.archived_at` and `archived_by`, set when a
//! sale is archived (`seckill-reconciler sale archive`: the decision, its
//! Redis keys removed after it).
//!
//! Migration 7 (`load_record.rs`): `sales.loaded_at`, when `sale create`
//! or `sale load` put the sale into Redis. A loaded sale (not archived)
//! whose Redis keys are gone lost them, whether or not a worker ever wrote
//! a mark for it: the data-loss watch pauses it and `sale load` refuses it.
//!
//! Migration 8 (`seckill_common::sale_admin`): `sales.paused_reason`,
//! `paused_by`, `paused_at`, an operator's pause (`sale pause`; apart from
//! the data-loss pause in `sale_redis_state`), and `sale_changes`, one row
//! per operator change of a sale (pause, resume, end, extend, add-stock),
//! keyed by the audited action, written in the change's own transaction:
//! the evidence an interrupted command's change was made, and made once.
//! An add-stock also writes a `stock_ledger` row of reason `add_stock`
//! (delta +N, `reservation_id` the action key), which the books count into
//! `total_stock`, not as a deduction ([`ledger_deductions`]).
//!
//! Migration 9 (several units per purchase, `allowance.rs`): the CHECK
//! `sales_limit_one` gives way to `sales_limits`: `per_user_limit` (`L`,
//! the most units a buyer holds at once) from 1 to 100 and the new
//! `sales.max_per_purchase` (`Q`, default 1) from 1 to `L`; `orders.quantity`
//! is at least 1 (`orders_quantity_positive`). `orders.multi_unit`, set by
//! whoever inserts an order from its sale's `L > 1`, makes the generated
//! `live_user_id` the order's reservation id instead of its buyer: a sale of
//! one unit per buyer keeps one live order per buyer, a sale of several
//! holds one per reservation, its limit kept by Redis and checked by the
//! reconciler (`buyer_over_limit`). `RTRIM` turns the `CHAR` id into text
//! whose value no `sql_mode` changes, which a stored generated column needs.
//!
//! Migration 11 (`mysql_writable.rs`): `primary_generation`, one row
//! whose `generation` the promotion of a replica raises (docs/OPERATIONS.md,
//! "A MySQL failover"): of two writable servers in `SECKILL_MYSQL_URL`, the
//! one with the higher generation is the primary and the other is never
//! written to.
//!
//! Times are `DATETIME(3)` in UTC: every connection sets `time_zone` to
//! `+00:00`, so `UNIX_TIMESTAMP`, `FROM_UNIXTIME` and `UTC_TIMESTAMP(3)` agree.

use mysql::prelude::Queryable;
use mysql::{Conn, Opts, OptsBuilder};
use std::fmt;
use std::time::Duration;

/// The migrations, in order. Each is applied once and recorded by version in
/// `schema_migrations`; never edit a released one, append a new one.
pub const MIGRATIONS: &[(u32, &str, &str)] = &[
    (
        1,
        "sales, orders, stock ledger",
        r#"
CREATE TABLE IF NOT EXISTS sales (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  sku VARCHAR(64) NOT NULL,
  title VARCHAR(255) NOT NULL DEFAULT '',
  price_cents BIGINT UNSIGNED NOT NULL DEFAULT 0,
  total_stock INT UNSIGNED NOT NULL,
  available_stock INT NOT NULL,
  per_user_limit INT UNSIGNED NOT NULL DEFAULT 1,
  starts_at DATETIME(3) NOT NULL,
  ends_at DATETIME(3) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  CONSTRAINT sales_stock_nonneg CHECK (available_stock >= 0),
  CONSTRAINT sales_stock_le_total CHECK (available_stock <= total_stock),
  CONSTRAINT sales_limit_one CHECK (per_user_limit = 1),
  CONSTRAINT sales_window CHECK (ends_at > starts_at),
  KEY sales_ends_at (ends_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS orders (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  reservation_id CHAR(32) NOT NULL,
  sale_id BIGINT UNSIGNED NOT NULL,
  user_id VARCHAR(64) NOT NULL,
  quantity INT UNSIGNED NOT NULL DEFAULT 1,
  status VARCHAR(16) NOT NULL DEFAULT 'created',
  reserved_at DATETIME(3) NULL,
  created_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  UNIQUE KEY orders_reservation (reservation_id),
  UNIQUE KEY orders_sale_user (sale_id, user_id),
  KEY orders_sale_id (sale_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE IF NOT EXISTS stock_ledger (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  reservation_id CHAR(32) NOT NULL,
  sale_id BIGINT UNSIGNED NOT NULL,
  user_id VARCHAR(64) NOT NULL,
  delta INT NOT NULL,
  reason VARCHAR(16) NOT NULL,
  created_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  UNIQUE KEY ledger_reservation_reason (reservation_id, reason),
  KEY ledger_sale_id (sale_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"#,
    ),
    (
        2,
        "sale_redis_state: the marks Redis must never fall behind, the pause",
        r#"
CREATE TABLE IF NOT EXISTS sale_redis_state (
  sale_id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
  seq_high BIGINT UNSIGNED NOT NULL DEFAULT 0,
  checkpoint_high BIGINT UNSIGNED NOT NULL DEFAULT 0,
  paused_reason VARCHAR(64) NULL,
  paused_at DATETIME(3) NULL,
  updated_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"#,
    ),
    (
        3,
        "order lifecycle: status, deadline, payments, released units",
        r#"
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS payment_window_ms BIGINT UNSIGNED NULL,
  ADD COLUMN IF NOT EXISTS rebuy_after_release TINYINT(1) NOT NULL DEFAULT 0;
ALTER TABLE orders
  ADD COLUMN IF NOT EXISTS pay_by DATETIME(3) NULL,
  ADD COLUMN IF NOT EXISTS paid_at DATETIME(3) NULL,
  ADD COLUMN IF NOT EXISTS payment_id VARCHAR(64) NULL,
  ADD COLUMN IF NOT EXISTS released_at DATETIME(3) NULL,
  ADD COLUMN IF NOT EXISTS redis_released_at DATETIME(3) NULL,
  ADD COLUMN IF NOT EXISTS live_user_id VARCHAR(64)
    AS (IF(status IN ('expired', 'cancelled'), NULL, user_id)) PERSISTENT;
CREATE INDEX IF NOT EXISTS orders_status_pay_by ON orders (status, pay_by);
CREATE INDEX IF NOT EXISTS orders_status_redis_released ON orders (status, redis_released_at);
CREATE UNIQUE INDEX IF NOT EXISTS orders_sale_live_user ON orders (sale_id, live_user_id);
DROP INDEX IF EXISTS orders_sale_user ON orders;
CREATE TABLE IF NOT EXISTS payments (
  payment_id VARCHAR(64) NOT NULL PRIMARY KEY,
  reservation_id CHAR(32) NOT NULL,
  sale_id BIGINT UNSIGNED NULL,
  amount_cents BIGINT UNSIGNED NOT NULL,
  outcome VARCHAR(32) NOT NULL,
  received_at DATETIME(3) NOT NULL,
  applied_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  KEY payments_reservation (reservation_id),
  KEY payments_sale_outcome (sale_id, outcome)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"#,
    ),
    (
        4,
        "sale_bucket_marks: the data-loss marks of buckets 1.. of a split sale",
        r#"
CREATE TABLE IF NOT EXISTS sale_bucket_marks (
  sale_id BIGINT UNSIGNED NOT NULL,
  bucket INT UNSIGNED NOT NULL,
  seq_high BIGINT UNSIGNED NOT NULL DEFAULT 0,
  checkpoint_high BIGINT UNSIGNED NOT NULL DEFAULT 0,
  updated_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  PRIMARY KEY (sale_id, bucket)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"#,
    ),
    (
        5,
        "sales.buckets: the number of buckets of a split sale",
        r#"
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS buckets INT UNSIGNED NULL;
"#,
    ),
    (
        6,
        "payment conflicts, archived sales",
        r#"
CREATE TABLE IF NOT EXISTS payment_conflicts (
  payment_id VARCHAR(64) NOT NULL,
  reservation_id CHAR(32) NOT NULL,
  amount_cents BIGINT UNSIGNED NOT NULL,
  received_at DATETIME(3) NOT NULL,
  recorded_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  PRIMARY KEY (payment_id, reservation_id, amount_cents)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS archived_at DATETIME(3) NULL,
  ADD COLUMN IF NOT EXISTS archived_by VARCHAR(64) NULL;
"#,
    ),
    (
        7,
        "sales.loaded_at: when the sale was loaded into Redis",
        r#"
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS loaded_at DATETIME(3) NULL;
"#,
    ),
    (
        8,
        "operator pause of a sale, the operators' sale changes",
        r#"
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS paused_reason VARCHAR(255) NULL,
  ADD COLUMN IF NOT EXISTS paused_by VARCHAR(64) NULL,
  ADD COLUMN IF NOT EXISTS paused_at DATETIME(3) NULL;
CREATE TABLE IF NOT EXISTS sale_changes (
  action_key CHAR(32) NOT NULL PRIMARY KEY,
  sale_id BIGINT UNSIGNED NOT NULL,
  action VARCHAR(16) NOT NULL,
  actor VARCHAR(64) NOT NULL,
  detail VARCHAR(255) NOT NULL,
  units INT UNSIGNED NULL,
  total_before INT UNSIGNED NULL,
  made_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  KEY sale_changes_sale (sale_id, made_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
"#,
    ),
    (
        9,
        "several units per purchase: per-buyer and per-purchase limits, live order per reservation",
        r#"
ALTER TABLE sales DROP CONSTRAINT IF EXISTS sales_limit_one;
ALTER TABLE sales
  ADD COLUMN IF NOT EXISTS max_per_purchase INT UNSIGNED NOT NULL DEFAULT 1;
ALTER TABLE sales ADD CONSTRAINT IF NOT EXISTS sales_limits
  CHECK (per_user_limit BETWEEN 1 AND 100 AND max_per_purchase BETWEEN 1 AND per_user_limit);
ALTER TABLE orders
  ADD COLUMN IF NOT EXISTS multi_unit TINYINT(1) NOT NULL DEFAULT 0;
ALTER TABLE orders ADD CONSTRAINT IF NOT EXISTS orders_quantity_positive CHECK (quantity >= 1);
ALTER TABLE orders MODIFY COLUMN live_user_id VARCHAR(64)
  AS (IF(status IN ('expired', 'cancelled'), NULL,
         IF(multi_unit = 1, RTRIM(reservation_id), user_id))) PERSISTENT
"#,
    ),
    (
        10,
        "a buyer's orders of a sale by index, for the worker's check of a buyer's units",
        r#"
CREATE INDEX IF NOT EXISTS orders_sale_buyer ON orders (sale_id, user_id);
"#,
    ),
    (
        11,
        "the primary generation a promotion raises, fencing an old primary back writable",
        r#"
CREATE TABLE IF NOT EXISTS primary_generation (
  id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  generation BIGINT UNSIGNED NOT NULL,
  promoted_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
  CONSTRAINT primary_generation_one_row CHECK (id = 1)
) ENGINE=InnoDB;
INSERT IGNORE INTO primary_generation (id, generation) VALUES (1, 1)
"#,
    ),
];

/// Why the schema could not be applied or a connection opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum SchemaError {
    /// The URL is not a usable `mysql://` URL.
    BadUrl(String),
    /// The server refused or failed a statement.
    Mysql(mysql::Error),
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::BadUrl(d) => write!(f, "bad mysql url: {d}"),
            SchemaError::Mysql(e) => write!(f, "mysql: {}", crate::mysql_error::explain(e)),
        }
    }
}

impl std::error::Error for SchemaError {}

impl From<mysql::Error> for SchemaError {
    fn from(e: mysql::Error) -> Self {
        SchemaError::Mysql(e)
    }
}

/// Connection options for `url` with every session in UTC and the given
/// connect/read/write timeout.
///
/// Errors: [`SchemaError::BadUrl`].
pub fn mysql_opts(url: &str, timeout: Duration) -> Result<OptsBuilder, SchemaError> {
    // Several servers (`mysql_writable.rs`): each must parse; the first's.
    if let Some(urls) = crate::mysql_writable::servers(url) {
        let mut first = None;
        for u in &urls {
            let o = mysql_opts(u, timeout)?;
            first.get_or_insert(o);
        }
        return first.ok_or_else(|| SchemaError::BadUrl("no server".into()));
    }
    let opts = Opts::from_url(url).map_err(|e| SchemaError::BadUrl(e.to_string()))?;
    Ok(OptsBuilder::from_opts(opts)
        .tcp_connect_timeout(Some(timeout))
        .read_timeout(Some(timeout))
        .write_timeout(Some(timeout))
        .init(vec!["SET time_zone = '+00:00'"]))
}

/// `n` SQL placeholders joined by commas (`?,?,?`), for an `IN (...)` or a
/// multi-row `VALUES` list.
pub fn placeholders(n: usize) -> String {
    vec!["?"; n].join(",")
}

/// Units the stock ledger has deducted from `sale_id`: `-SUM(delta)` over
/// every row of the sale but the `add_stock` ones, which `total_stock`
/// holds (0 without rows).
///
/// Errors: MySQL failures.
pub fn ledger_deductions<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<i64, mysql::Error> {
    let v: Option<i64> = db.exec_first(
        "SELECT CAST(COALESCE(-SUM(delta), 0) AS SIGNED) FROM stock_ledger
         WHERE sale_id = ? AND reason <> 'add_stock'",
        (sale_id,),
    )?;
    Ok(v.unwrap_or(0))
}

/// Opens one MySQL connection (see [`mysql_opts`]); for a URL naming
/// several servers, to the first writable one (`mysql_writable.rs`).
/// A connect that times out fails with an I/O error of kind `TimedOut`
/// naming the server and the timeout.
pub fn connect(url: &str, timeout: Duration) -> Result<Conn, SchemaError> {
    connect_at(url, timeout).map(|(c, _)| c)
}

/// [`connect`], with the address of the server it reached (password
/// hidden), for the errors of the connection's later statements.
///
/// Errors: as [`connect`].
pub fn connect_at(url: &str, timeout: Duration) -> Result<(Conn, String), SchemaError> {
    if let Some(urls) = crate::mysql_writable::servers(url) {
        return crate::mysql_writable::connect_primary_at(&urls, timeout, false);
    }
    Conn::new(mysql_opts(url, timeout)?)
        .map(|c| (c, crate::redact::redacted(url)))
        .map_err(|e| SchemaError::Mysql(timed_out(url, e, timeout)))
}

/// `e` as an error of kind `TimedOut` saying the server and the timeout
/// when it is a timeout; `e` otherwise.
pub fn timed_out(url: &str, e: mysql::Error, timeout: Duration) -> mysql::Error {
    if !crate::mysql_error::is_timeout(&e) {
        return e;
    }
    mysql::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "{}: {}",
            crate::redact::redacted(url),
            crate::mysql_error::describe_within(&e, timeout)
        ),
    ))
}

/// The database named by `url` (the first server's, for a URL naming
/// several), if it names one.
pub fn database_name(url: &str) -> Option<String> {
    if let Some(urls) = crate::mysql_writable::servers(url) {
        return urls.first().and_then(|u| database_name(u));
    }
    Opts::from_url(url).ok()?.get_db_name().map(str::to_string)
}

/// Creates the database named in `url` when it does not exist, then applies
/// every migration not yet recorded. Returns the versions applied now (empty
/// when the schema was already current). Safe to run twice or concurrently
/// with itself: `CREATE ... IF NOT EXISTS` and the version table's key.
pub fn migrate(url: &str, timeout: Duration) -> Result<Vec<u32>, SchemaError> {
    if let Some(db) = database_name(url) {
        if !db
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$')
        {
            return Err(SchemaError::BadUrl(format!(
                "database name {db:?}: use A-Z a-z 0-9 _ $"
            )));
        }
        // The server level first: the database may not exist yet. With
        // several servers, on the primary (`mysql_writable.rs`), never on a
        // replica or an old primary.
        let mut c = match crate::mysql_writable::servers(url) {
            Some(urls) => crate::mysql_writable::connect_primary(&urls, timeout, true)?,
            None => Conn::new(mysql_opts(url, timeout)?.db_name(None::<String>))
                .map_err(|e| SchemaError::Mysql(timed_out(url, e, timeout)))?,
        };
        c.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        ))?;
        c.query_drop(format!("USE `{db}`"))?;
        return apply_migrations(&mut c);
    }
    let mut c = connect(url, timeout)?;
    apply_migrations(&mut c)
}

/// Applies on `c` (its database selected) every migration not yet recorded.
fn apply_migrations(c: &mut Conn) -> Result<Vec<u32>, SchemaError> {
    c.query_drop(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
           version INT UNSIGNED NOT NULL PRIMARY KEY,
           description VARCHAR(255) NOT NULL,
           applied_at DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3))
         ) ENGINE=InnoDB",
    )?;
    let done: Vec<u32> = c.query("SELECT version FROM schema_migrations")?;
    let mut applied = Vec::new();
    for (version, description, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        // DDL commits implicitly in MySQL, so each statement must be
        // idempotent on its own (IF NOT EXISTS) for a crash half-way.
        for stmt in sql.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            c.query_drop(stmt)?;
        }
        c.exec_drop(
            "INSERT IGNORE INTO schema_migrations (version, description) VALUES (?, ?)",
            (version, description),
        )?;
        applied.push(*version);
    }
    Ok(applied)
}
