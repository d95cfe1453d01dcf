//! Owns the MySQL side of the data-loss marks of each bucket of a split
//! sale (`buckets.rs`, `data_loss.rs`): the reservation sequence and the
//! checkpoint that a bucket's Redis can only fall behind by losing writes.
//!
//! Bucket 0's marks are the sale's own row of `sale_redis_state` (so a sale
//! of one bucket is exactly what it was before buckets), which also holds
//! the sale's one pause: a loss in any bucket pauses the whole sale.
//! Buckets 1 and above have a row each in `sale_bucket_marks` (migration
//! 4), written by the same watch pass that raises their checkpoints.

use mysql::prelude::Queryable;

/// The MySQL marks of one bucket (0 and 0 when it has none yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketMarks {
    /// The highest reservation sequence seen in this bucket's Redis.
    pub seq_high: u64,
    /// The highest checkpoint written to this bucket's meta.
    pub checkpoint_high: u64,
}

/// How many buckets MySQL has marks for: one above the highest bucket of
/// `sale_bucket_marks` for `sale_id`, 1 when it has none. What MySQL knows
/// of K even when Redis lost bucket 0's meta (which holds `buckets`).
///
/// Errors: MySQL failures.
pub fn known_buckets<Q: Queryable>(db: &mut Q, sale_id: u64) -> Result<u32, mysql::Error> {
    let top: Option<Option<u32>> = db.exec_first(
        "SELECT MAX(bucket) FROM sale_bucket_marks WHERE sale_id = ?",
        (sale_id,),
    )?;
    Ok(top.flatten().map_or(1, |b| b.saturating_add(1)))
}

/// The marks of buckets 1 .. `buckets` − 1 of `sale_id`, indexed by bucket
/// − 1 (a bucket without a row: zeros). Bucket 0's are the sale's row of
/// `sale_redis_state` (`data_loss::mysql_state`).
///
/// Errors: MySQL failures.
pub fn read_split<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    buckets: u32,
) -> Result<Vec<BucketMarks>, mysql::Error> {
    let mut out = vec![BucketMarks::default(); buckets.saturating_sub(1) as usize];
    if out.is_empty() {
        return Ok(out);
    }
    let rows: Vec<(u32, u64, u64)> = db.exec(
        "SELECT bucket, seq_high, checkpoint_high FROM sale_bucket_marks WHERE sale_id = ?",
        (sale_id,),
    )?;
    for (b, seq_high, checkpoint_high) in rows {
        if let Some(m) = (b as usize).checked_sub(1).and_then(|i| out.get_mut(i)) {
            *m = BucketMarks {
                seq_high,
                checkpoint_high,
            };
        }
    }
    Ok(out)
}

/// Raises the marks of buckets 1 and above (`(bucket, seq, checkpoint)`;
/// bucket 0 is ignored here) to at least the given values, never down; one
/// statement for all of them.
///
/// Errors: MySQL failures.
pub fn raise_split<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    marks: &[(u32, u64, u64)],
) -> Result<(), mysql::Error> {
    write_split(
        db,
        sale_id,
        marks,
        "GREATEST(seq_high, VALUES(seq_high))",
        "GREATEST(checkpoint_high, VALUES(checkpoint_high))",
    )
}

/// Sets the marks of buckets 1 and above to exactly the given values (the
/// repair, whose rebuilt Redis holds them). Bucket 0 is ignored here.
///
/// Errors: MySQL failures.
pub fn set_split<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    marks: &[(u32, u64, u64)],
) -> Result<(), mysql::Error> {
    write_split(
        db,
        sale_id,
        marks,
        "VALUES(seq_high)",
        "VALUES(checkpoint_high)",
    )
}

fn write_split<Q: Queryable>(
    db: &mut Q,
    sale_id: u64,
    marks: &[(u32, u64, u64)],
    seq: &str,
    ck: &str,
) -> Result<(), mysql::Error> {
    let rows: Vec<&(u32, u64, u64)> = marks.iter().filter(|m| m.0 > 0).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let values = vec!["(?, ?, ?, ?)"; rows.len()].join(",");
    let params: Vec<mysql::Value> = rows
        .iter()
        .flat_map(|&&(b, s, c)| [sale_id.into(), b.into(), s.into(), c.into()])
        .collect();
    db.exec_drop(
        format!(
            "INSERT INTO sale_bucket_marks (sale_id, bucket, seq_high, checkpoint_high)
             VALUES {values}
             ON DUPLICATE KEY UPDATE seq_high = {seq}, checkpoint_high = {ck},
               updated_at = UTC_TIMESTAMP(3)"
        ),
        params,
    )
}
