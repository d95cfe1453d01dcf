//! Owns the quarantine of cluster nodes that failed: after a master did not
//! answer (stopped, cut off, killed), the slot router does not try it again
//! until its quarantine ends, so its buckets' purchases get 503 at once and
//! the other masters' purchases stop waiting behind it.
//!
//! The rule: a node that failed is held for
//! `max(backoff, COST_FACTOR × what the failed try cost)`, the backoff
//! being [`HOLD_MIN`] doubling to [`HOLD_MAX`] per failure in a row (reset
//! when it answers). A refused connect costs nothing and is tried again in
//! 50 ms, so a promoted replica or a restarted master is found quickly; a
//! stalled master costs its `SECKILL_REDIS_TIMEOUT` per try and is then
//! held four of them, so it takes at most 1 / (1 + [`COST_FACTOR`]) = 20 %
//! of a Redis thread however long it stays stalled.
//!
//! One quarantine is shared by every connection of a process to one
//! cluster (`redis_target::Target`): a master one thread found stalled is
//! skipped by all, and when its hold ends only the first thread to ask
//! tries it ([`Quarantine::try_node`]) while the others go on skipping it.
//!
//! And a held node is watched ([`watch`]): a thread of its own connects to
//! it and sends `PING` every [`HOLD_MIN`], off every request's path, and
//! ends its hold as soon as it answers. A master stalled for a while and
//! then resumed answers the `PING` waiting on it at once, so it serves
//! again within a round trip instead of at the end of a hold of four
//! timeouts (a 2.5 s stall cost its buyers 6 s more of 503 after it was
//! back: `cluster_quarantine::a_stalled_master_that_resumes_sells_again_within_two_seconds`).

use crate::backoff::Backoff;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shortest hold after a failure (the gateway's Redis reconnect backoff).
pub const HOLD_MIN: Duration = Duration::from_millis(50);
/// Longest backoff part of a hold (the cost part can make it longer).
pub const HOLD_MAX: Duration = Duration::from_secs(1);
/// A node is held at least this many times what its failed try cost.
pub const COST_FACTOR: u32 = 4;

/// The nodes held back, by `"host:port"`.
#[derive(Debug, Default)]
pub struct Quarantine {
    held: HashMap<String, Hold>,
    /// The nodes a [`watch`] thread is trying.
    watched: HashSet<String>,
}

#[derive(Debug)]
struct Hold {
    until: Instant,
    backoff: Backoff,
    /// The last hold given: also how long the others keep skipping the
    /// node while one caller tries it.
    last: Duration,
}

impl Quarantine {
    /// How much longer `addr` is held at `now`, or `None` when the caller
    /// may try it. When a hold has just ended, the first caller gets
    /// `None` and the node stays held for the others for the length of the
    /// last hold, until that caller reports [`Quarantine::answered`] or
    /// [`Quarantine::failed`].
    pub fn try_node(&mut self, addr: &str, now: Instant) -> Option<Duration> {
        let h = self.held.get_mut(addr)?;
        if h.until > now {
            return Some(h.until - now);
        }
        h.until = now + h.last;
        None
    }

    /// Records that a try of `addr` failed at `now` after costing `cost`;
    /// returns how long it is held.
    pub fn failed(&mut self, addr: &str, cost: Duration, now: Instant) -> Duration {
        let h = self.held.entry(addr.to_string()).or_insert(Hold {
            until: now,
            backoff: Backoff::new(HOLD_MIN, HOLD_MAX),
            last: Duration::ZERO,
        });
        let hold = h.backoff.next_delay().max(cost.saturating_mul(COST_FACTOR));
        h.until = now + hold;
        h.last = hold;
        hold
    }

    /// Records that `addr` answered: its next failure starts the backoff
    /// over.
    pub fn answered(&mut self, addr: &str) {
        if !self.held.is_empty() {
            self.held.remove(addr);
        }
    }

    /// Forgets the nodes `keep` says no (after a failover the old master
    /// is out of the slot map: nothing routes to it any more).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.held.retain(|addr, _| keep(addr));
    }

    /// Whether any node has failed since it last answered (the slot map may
    /// be about to change: a failover).
    pub fn any(&self) -> bool {
        !self.held.is_empty()
    }
}

/// The quarantine behind `q` (a poisoned lock is taken over: a hold is
/// only a hint).
fn lock(q: &Mutex<Quarantine>) -> MutexGuard<'_, Quarantine> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts, unless one runs already, a thread that tries `addr` while it is
/// held in `q`: a connect and a `PING`, each with `timeout`, every
/// [`HOLD_MIN`]. The first answer ends the hold ([`Quarantine::answered`]);
/// the thread ends then, or as soon as `addr` is no longer held (it
/// answered another caller, or left the slot map). Never on a request's
/// path: a stalled node costs this thread its timeouts, nobody's purchase.
pub fn watch(q: &Arc<Mutex<Quarantine>>, addr: &str, timeout: Duration) {
    {
        let mut g = lock(q);
        if !g.held.contains_key(addr) || !g.watched.insert(addr.to_string()) {
            return;
        }
    }
    let (q, addr) = (q.clone(), addr.to_string());
    let spawned = std::thread::Builder::new()
        .name("redis-watch".into())
        .spawn({
            let (q, addr) = (q.clone(), addr.clone());
            move || loop {
                {
                    let mut g = lock(&q);
                    if !g.held.contains_key(&addr) {
                        g.watched.remove(&addr);
                        return;
                    }
                }
                if ping(&addr, timeout).is_ok() {
                    let mut g = lock(&q);
                    g.answered(&addr);
                    g.watched.remove(&addr);
                    log::info!("redis: node {addr} answers again");
                    return;
                }
                std::thread::sleep(HOLD_MIN);
            }
        });
    if spawned.is_err() {
        // No thread: the holds alone decide, as before.
        lock(&q).watched.remove(&addr);
    }
}

/// One `PING` of `addr` on a connection of its own.
fn ping(addr: &str, timeout: Duration) -> redis::RedisResult<()> {
    let mut c =
        redis::Client::open(format!("redis://{addr}/"))?.get_connection_with_timeout(timeout)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    redis::cmd("PING").query::<redis::Value>(&mut c).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_refused_node_backs_off_from_50_ms_and_a_stalled_one_is_held_four_tries() {
        let t0 = Instant::now();
        let mut q = Quarantine::default();
        assert_eq!(q.try_node("a:1", t0), None);
        assert!(!q.any());
        // Refused at once: 50, 100, 200 ms.
        assert_eq!(q.failed("a:1", Duration::ZERO, t0), 50 * MS);
        assert_eq!(q.try_node("a:1", t0 + 10 * MS), Some(40 * MS));
        // The hold ends: one caller tries it, the others skip it 50 ms more.
        assert_eq!(q.try_node("a:1", t0 + 50 * MS), None);
        assert_eq!(q.try_node("a:1", t0 + 60 * MS), Some(40 * MS));
        assert_eq!(q.failed("a:1", Duration::ZERO, t0), 100 * MS);
        assert_eq!(q.failed("a:1", Duration::ZERO, t0), 200 * MS);
        // A try that waited out a 300 ms timeout: held 4 × 300 ms.
        assert_eq!(q.failed("b:2", 300 * MS, t0), 1200 * MS);
        assert_eq!(q.try_node("b:2", t0 + 1199 * MS), Some(MS));
        assert_eq!(q.try_node("a:1", t0), Some(200 * MS));
        assert!(q.any());
        // An answer starts the backoff over.
        q.answered("a:1");
        assert_eq!(q.try_node("a:1", t0), None);
        assert_eq!(q.failed("a:1", Duration::ZERO, t0), 50 * MS);
        q.answered("a:1");
        q.retain(|addr| addr != "b:2");
        assert_eq!(q.try_node("b:2", t0), None);
        assert!(!q.any());
    }

    #[test]
    fn the_backoff_part_stops_at_one_second() {
        let t0 = Instant::now();
        let mut q = Quarantine::default();
        let holds: Vec<Duration> = (0..8)
            .map(|_| q.failed("a:1", Duration::ZERO, t0))
            .collect();
        assert_eq!(
            holds,
            [50, 100, 200, 400, 800, 1000, 1000, 1000].map(|m| m * MS)
        );
    }
}
