//! Owns step 6 of a sale's scan (`scan.rs`): which flow records without an
//! order are not in flight either, read without any call that holds Redis
//! for more than a few milliseconds whatever the backlog. The candidates
//! are kept as 16 bytes each; the lists are read in pages, up to
//! [`PASSES`] times, each read followed by a MySQL and a flow re-check; the
//! few left are checked in one atomic script while the lists are short
//! (`seckill_common::in_flight`).

use crate::error::RunError;
use crate::mysql_read::{self, rid_to_u128, u128_to_rid};
use crate::redis_read;
use crate::scan::{Bits, Unordered};
use seckill_common::in_flight::still_in_flight;
use seckill_common::keys::{SaleKeys, WORKERS};
use seckill_common::redis_target::Con;
use std::collections::BTreeSet;

/// Reads of every list at most before a candidate is judged not in
/// flight. A message is missed by one read only when it moves during that
/// read (taken from the queue before the read reached it, then applied,
/// reclaimed or requeued; or shifted by an `LREM` ahead of the read):
/// an applied one is cleared by the MySQL re-check that follows each read,
/// and one still moving is found by the next read.
pub const PASSES: usize = 3;

/// Flow records with no order, older than the grace period: their
/// reservation ids, 16 bytes each (ids that are not ours kept as text).
pub struct Candidates {
    ids: Vec<u128>,
    gone: Bits,
    left: usize,
    odd: BTreeSet<String>,
}

impl Candidates {
    /// No candidate.
    pub fn new() -> Candidates {
        Candidates {
            ids: Vec::new(),
            gone: Bits::new(0),
            left: 0,
            odd: BTreeSet::new(),
        }
    }

    /// Adds reservation id `rid` (call [`Candidates::seal`] after the last).
    pub fn add(&mut self, rid: &[u8]) {
        match rid_to_u128(rid) {
            Some(v) => self.ids.push(v),
            None => {
                self.odd.insert(String::from_utf8_lossy(rid).into_owned());
            }
        }
    }

    /// Sorts the ids (an `HSCAN` may return a field twice).
    pub fn seal(&mut self) {
        self.ids.sort_unstable();
        self.ids.dedup();
        self.gone = Bits::new(self.ids.len());
        self.left = self.ids.len();
    }

    /// Candidates left.
    pub fn len(&self) -> usize {
        self.left + self.odd.len()
    }

    /// True when none is left.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Clears reservation id `rid` (no-op when not a candidate).
    pub fn remove(&mut self, rid: &[u8]) {
        match rid_to_u128(rid) {
            Some(v) => {
                if let Ok(i) = self.ids.binary_search(&v) {
                    if !self.gone.get(i) {
                        self.gone.set(i);
                        self.left -= 1;
                    }
                }
            }
            None => {
                self.odd.remove(String::from_utf8_lossy(rid).as_ref());
            }
        }
    }

    /// The reservation ids left, sorted.
    pub fn remaining(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .ids
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.gone.get(*i))
            .map(|(_, v)| u128_to_rid(*v))
            .chain(self.odd.iter().cloned())
            .collect();
        out.sort_unstable();
        out
    }
}

/// The lists of bucket `k`: its queue, then every registered worker's
/// processing list (read in this order, a message a worker takes during
/// the queue's read is in a processing list, or applied, when those are
/// read).
fn lists(con: &mut Con, k: SaleKeys) -> redis::RedisResult<Vec<String>> {
    let mut lists = vec![k.queue()];
    for w in redis_read::set_members(con, WORKERS)? {
        lists.push(k.processing(&w));
    }
    Ok(lists)
}

/// Clears the candidates whose order MySQL now holds, and those whose flow
/// record Redis no longer holds (released meanwhile); returns the flow
/// records of the ones left, in the order of [`Candidates::remaining`].
fn recheck(
    con: &mut Con,
    mysql: &mut mysql::Conn,
    k: SaleKeys,
    c: &mut Candidates,
) -> Result<(Vec<String>, Vec<String>), RunError> {
    for o in mysql_read::order_details(mysql, &c.remaining())? {
        c.remove(o.reservation_id.as_bytes());
    }
    let rids = c.remaining();
    let flows = redis_read::hash_values(con, &k.flow(), &rids)?;
    let mut kept = (Vec::new(), Vec::new());
    for (rid, flow) in rids.into_iter().zip(flows) {
        match flow {
            Some(f) => {
                kept.0.push(rid);
                kept.1.push(f);
            }
            None => c.remove(rid.as_bytes()),
        }
    }
    Ok(kept)
}

/// Step 6 for bucket `k`: the candidates neither in flight nor ordered
/// meanwhile nor released meanwhile, with their status, in reservation id
/// order. `tick` runs after each list's read.
pub fn unordered(
    con: &mut Con,
    mysql: &mut mysql::Conn,
    k: SaleKeys,
    mut c: Candidates,
    tick: &mut dyn FnMut() -> Result<(), RunError>,
) -> Result<Vec<Unordered>, RunError> {
    let mut lists_read = Vec::new();
    for _ in 0..PASSES {
        if c.is_empty() {
            return Ok(Vec::new());
        }
        lists_read = lists(con, k)?;
        for list in &lists_read {
            redis_read::for_each_in_list(con, list, |raw| {
                if let Some(rid) = redis_read::message_rid(raw) {
                    c.remove(rid);
                }
            })?;
            tick()?;
        }
        recheck(con, mysql, k, &mut c)?;
    }
    if c.is_empty() {
        return Ok(Vec::new());
    }
    // The few left: one atomic look at every list, while they are short
    // enough for it to stay brief.
    let (rids, texts) = recheck(con, mysql, k, &mut c)?;
    let text_refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    if let Some(flags) = still_in_flight(con, &lists_read, &text_refs)? {
        for (rid, _) in rids.iter().zip(flags).filter(|(_, f)| *f) {
            c.remove(rid.as_bytes());
        }
    }
    // An order committed, or a release, during the atomic look.
    let (rids, texts) = recheck(con, mysql, k, &mut c)?;
    let statuses = redis_read::hash_values(con, &k.status(), &rids)?;
    Ok(rids
        .into_iter()
        .zip(texts)
        .zip(statuses)
        .map(|((reservation_id, flow_record), status)| Unordered {
            reservation_id,
            flow_record,
            status,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::Candidates;

    #[test]
    fn candidates_clear_once_and_list_what_is_left() {
        let mut c = Candidates::new();
        let a = b"0000000000000000000000000000000a";
        let b = b"0000000000000000000000000000000b";
        c.add(b);
        c.add(a);
        c.add(a);
        c.add(b"not-ours");
        c.seal();
        assert_eq!(c.len(), 3);
        c.remove(a);
        c.remove(a);
        c.remove(b"ffffffffffffffffffffffffffffffff");
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.remaining(),
            ["0000000000000000000000000000000b", "not-ours"]
        );
        c.remove(b"not-ours");
        c.remove(b);
        assert!(c.is_empty());
    }
}
