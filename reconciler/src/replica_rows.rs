//! Owns the check that a sale's rows on the replica are the primary's: a
//! fingerprint of each table a scan reads (the sale's row, its orders, its
//! ledger rows), taken on both servers and compared. A
//! replica can have reached the primary's GTID position and still lack a
//! row (an event it skipped, a write made on the primary with
//! `sql_log_bin = 0`, a row changed on the replica alone); such a sale is
//! read on the primary (`replica_read.rs`), so the replica never makes a
//! sale look better than it is.

use mysql::prelude::Queryable;

/// The fingerprint: per table, the row count and the XOR of each row's
/// CRC32 over the columns the rules read.
const FINGERPRINT: &str = "
SELECT COUNT(*), CAST(COALESCE(BIT_XOR(CRC32(CONCAT_WS('|', id, available_stock, total_stock,
  ends_at, IFNULL(paused_at, '-'), IFNULL(archived_at, '-')))), 0) AS UNSIGNED)
  FROM sales WHERE id = ?
UNION ALL
SELECT COUNT(*), CAST(COALESCE(BIT_XOR(CRC32(CONCAT_WS('|', id, reservation_id, user_id,
  quantity, status, IFNULL(reserved_at, '-'), IFNULL(paid_at, '-'), IFNULL(released_at, '-'),
  IFNULL(redis_released_at, '-')))), 0) AS UNSIGNED)
  FROM orders WHERE sale_id = ?
UNION ALL
SELECT COUNT(*), CAST(COALESCE(BIT_XOR(CRC32(CONCAT_WS('|', id, reservation_id, delta,
  reason))), 0) AS UNSIGNED)
  FROM stock_ledger WHERE sale_id = ?";

/// The fingerprint of `sale_id`'s rows on `db`.
///
/// Errors: MySQL failures.
pub fn fingerprint<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
) -> Result<Vec<(u64, u64)>, mysql::Error> {
    db.exec(FINGERPRINT, (sale_id, sale_id, sale_id))
}
