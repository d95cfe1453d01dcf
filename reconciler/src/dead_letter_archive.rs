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
//!
//! An action settles only the entries that existed when it started
//! ([`Existing`]): an entry its own effect causes (a re-queued message
//! dead-lettered again, at once) stays in the list, and the next run
//! reports it as a new `dead_letter` finding.

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

/// Which of a reservation's dead-letter entries an action settles: those
/// that existed when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// Exactly these entries, read just before the action's effect (under
    /// the review file's write lock, [`entries_of`]).
    Entries(Vec<String>),
    /// The entries dead-lettered before this time, Unix ms: an interrupted
    /// action completed later, whose `started` row (written before its
    /// effect) has this time. The worker stamps the entry with its own
    /// clock, so this relies on the hosts' clocks agreeing to well within
    /// the time between an action's start and its effect; an entry read as
    /// later stays in the list and is reported (never hidden).
    Before(u64),
    /// Every entry of the reservation (`sale repair`: its released
    /// duplicates can no longer be dead-lettered).
    All,
}

impl Existing {
    fn settles(&self, raw: &str, d: &DeadLetter) -> bool {
        match self {
            Existing::Entries(v) => v.iter().any(|e| e == raw),
            Existing::Before(ms) => d.at_ms < *ms,
            Existing::All => true,
        }
    }
}

/// The dead-letter entries of reservation `rid` of sale `sale_id`, verbatim,
/// from every bucket's list.
///
/// Errors: Redis failures.
pub fn entries_of(con: &mut Con, sale_id: u64, rid: &str) -> redis::RedisResult<Vec<String>> {
    let n = seckill_common::buckets::count(con, sale_id)?.unwrap_or(1);
    let mut out = Vec::new();
    for k in seckill_common::buckets::all(sale_id, n) {
        out.extend(
            entries_in(con, k, rid, &Existing::All)?
                .into_iter()
                .map(|(raw, _)| raw),
        );
    }
    Ok(out)
}

/// Moves the dead-letter entries of reservation `rid` of sale `sale_id`
/// that `existing` names to the archive, wrapped with `by`; returns how
/// many moved. A sale split over buckets has a list per bucket: each is
/// read, and an entry goes to its own bucket's archive.
///
/// Errors: Redis failures (entries moved before the failure stay moved; a
/// repeat moves the rest).
pub fn archive_entries_of(
    con: &mut Con,
    sale_id: u64,
    rid: &str,
    existing: &Existing,
    by: &SettledBy<'_>,
) -> redis::RedisResult<u64> {
    let n = seckill_common::buckets::count(con, sale_id)?.unwrap_or(1);
    let mut moved = 0;
    for k in seckill_common::buckets::all(sale_id, n) {
        moved += archive_entries_in(con, k, rid, existing, by)?;
    }
    Ok(moved)
}

/// The entries of `rid` in bucket `k`'s dead-letter list that `existing`
/// names, verbatim.
fn entries_in(
    con: &mut Con,
    k: SaleKeys,
    rid: &str,
    existing: &Existing,
) -> redis::RedisResult<Vec<(String, DeadLetter)>> {
    let mut mine = Vec::new();
    redis_read::for_each_in_list(con, &k.dead_letter(), |raw| {
        let Some(d) = DeadLetter::parse(raw) else {
            return;
        };
        let text = String::from_utf8_lossy(raw);
        if d.reservation_id.as_deref() == Some(rid) && existing.settles(&text, &d) {
            mine.push((text.into_owned(), d));
        }
    })?;
    Ok(mine)
}

/// [`archive_entries_of`] in bucket `k` of a split sale only (its own
/// dead-letter list and archive).
///
/// Errors: as [`archive_entries_of`].
pub fn archive_entries_in(
    con: &mut Con,
    k: SaleKeys,
    rid: &str,
    existing: &Existing,
    by: &SettledBy<'_>,
) -> redis::RedisResult<u64> {
    let mine = entries_in(con, k, rid, existing)?;
    let mut moved = 0;
    for (entry, _) in mine {
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
