//! Owns the archive of settled dead letters: once an operator action has
//! settled a reservation (released it, or queued its message again), its
//! entries leave the sale's dead-letter list for
//! `seckill:{sale:ID}:dlq:archive`, each wrapped with the action that settled
//! it. The reconciler reads only the dead-letter list, so a settled entry is
//! not reported again, and nothing is lost.
//!
//! Archive entry, one line of JSON:
//! `{"entry":"<the dead-letter entry, verbatim>","settled_by":{"action":"rollback","actor":"alice","finding_id":7,"action_id":12,"at":"2026-11-29T20:00:00.123Z"}}`
//!
//! Each entry moves in one atomic script ([`dead_letter::archive`]), so a
//! repeat, or two processes at once, move every entry exactly once.

use crate::redis_read;
use seckill_common::dead_letter::{self, DeadLetter};
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use serde_json::json;

/// The operator action that settled a reservation, as the archive records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledBy<'a> {
    /// `rollback` or `reorder`.
    pub action: &'a str,
    /// Who acted (`--by`).
    pub actor: &'a str,
    /// The finding acted on.
    pub finding_id: i64,
    /// The `started` row of the action in the review file's `actions`.
    pub action_id: i64,
    /// When it was settled (RFC 3339 UTC).
    pub at: &'a str,
}

/// Moves every dead-letter entry of reservation `rid` of sale `sale_id` to
/// the archive, wrapped with `by`; returns how many moved. A sale split
/// over buckets has a list per bucket: each is read, and an entry goes to
/// its own bucket's archive.
///
/// Errors: Redis failures (entries moved before the failure stay moved; a
/// repeat moves the rest).
pub fn archive_entries_of(
    con: &mut Con,
    sale_id: u64,
    rid: &str,
    by: &SettledBy<'_>,
) -> redis::RedisResult<u64> {
    let n = seckill_common::buckets::count(con, sale_id)?.unwrap_or(1);
    let mut moved = 0;
    for k in seckill_common::buckets::all(sale_id, n) {
        moved += archive_entries_in(con, k, rid, by)?;
    }
    Ok(moved)
}

/// [`archive_entries_of`] in bucket `k` of a split sale only (its own
/// dead-letter list and archive).
///
/// Errors: as [`archive_entries_of`].
pub fn archive_entries_in(
    con: &mut Con,
    k: SaleKeys,
    rid: &str,
    by: &SettledBy<'_>,
) -> redis::RedisResult<u64> {
    let mut mine: Vec<String> = Vec::new();
    redis_read::for_each_in_list(con, &k.dead_letter(), |raw| {
        if DeadLetter::parse(raw)
            .and_then(|d| d.reservation_id)
            .as_deref()
            == Some(rid)
        {
            mine.push(String::from_utf8_lossy(raw).into_owned());
        }
    })?;
    let mut moved = 0;
    for entry in mine {
        let wrapped = json!({
            "entry": entry,
            "settled_by": {"action": by.action, "actor": by.actor, "finding_id": by.finding_id,
                           "action_id": by.action_id, "at": by.at},
        })
        .to_string();
        moved += u64::from(dead_letter::archive_in(con, k, &entry, &wrapped)?);
    }
    Ok(moved)
}
