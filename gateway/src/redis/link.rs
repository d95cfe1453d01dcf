//! Owns the gateway's Redis links: one connection of one thread
//! ([`Link`]), with reconnection and
//! backoff: while Redis is down, callers get [`Unavailable`] at once (the
//! client sees 503) instead of waiting on a connect per request, and the
//! next attempt comes after 50 ms, doubling up to 1 s
//! ([`seckill_common::backoff::Backoff`]). Each (re)connect
//! checks the server (`seckill_common::redis_server`: an eviction policy
//! that can delete the sale's keys is refused, so the gateway answers 503
//! until it is fixed) and loads the reservation script (`SCRIPT LOAD`), so
//! pipelined `EVALSHA` calls find it. And the fixed pool of links the
//! reading routes borrow ([`LinkPool`]).

use crate::metrics::Metrics;
use crossbeam_channel::{Receiver, Sender};
use redis::RedisError;
use seckill_common::backoff::Backoff;
use seckill_common::connections::{self, Held, Slot, Store};
use seckill_common::redis_server::{self, ServerError};
use seckill_common::redis_target::{Con, Target};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First wait after a failed connect.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between connects while Redis stays down.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Redis cannot be used right now (down, timing out, or in backoff).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

/// Why a link's last connect failed: what `/readyz` names in its 503 body
/// (`reason`), so an operator tells a Redis that is down from one the
/// gateway refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    /// Redis did not answer (refused, timed out, the connection broke).
    Unreachable,
    /// Redis answered, but its `maxmemory-policy` can evict the sale's
    /// keys (`redis_server::check`).
    EvictionPolicy,
    /// Redis answered, but refuses writes (a replica, `OOM`, too few
    /// replicas: `redis_server::check_writable`).
    NotWritable,
}

impl Down {
    /// The reason as `/readyz` writes it.
    pub fn reason(self) -> &'static str {
        match self {
            Down::Unreachable => "redis_unreachable",
            Down::EvictionPolicy => "redis_eviction_policy",
            Down::NotWritable => "redis_not_writable",
        }
    }

    /// The reason of a failed server check.
    pub fn of(e: &ServerError) -> Down {
        match e {
            ServerError::EvictionPolicy(_) => Down::EvictionPolicy,
            ServerError::NotWritable(_) => Down::NotWritable,
            _ => Down::Unreachable,
        }
    }
}

/// A lazily (re)connected Redis connection owned by one thread.
pub struct Link {
    client: Target,
    /// Connect, read and write timeout (`SECKILL_REDIS_TIMEOUT`).
    timeout: Duration,
    /// The connection, counted open while held; `slot` counts a connect
    /// after the first as a reconnect (`seckill_common::connections`).
    con: Option<Held<Con>>,
    slot: Slot,
    next_try: Instant,
    /// Wait after a failed connect: [`BACKOFF_MIN`] doubling to
    /// [`BACKOFF_MAX`], reset by a successful one.
    backoff: Backoff,
    /// `metrics.redis_connects` when the last connect failed: once another
    /// thread has connected since, the backoff is cut short.
    connects_seen: u64,
    /// Why the last connect failed (meaningful while `con` is `None`).
    down: Down,
    metrics: Arc<Metrics>,
}

impl Link {
    /// A link that connects on first use.
    pub fn new(client: Target, timeout: Duration, metrics: Arc<Metrics>) -> Link {
        Link {
            client,
            timeout,
            con: None,
            slot: Slot::new(Store::Redis),
            next_try: Instant::now(),
            backoff: Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
            connects_seen: 0,
            down: Down::Unreachable,
            metrics,
        }
    }

    /// Connects, checks the server (`redis_server::check`: a policy that
    /// can evict the sale's keys is refused) and loads the script.
    fn connect(&self) -> Result<Con, ServerError> {
        let mut con = self.client.connect(self.timeout)?;
        // On a cluster, reads skip a stalled master (`Con::route_reads`).
        con.route_reads();
        match redis_server::check(&mut con) {
            Ok(p) => {
                let off = i64::from(p.nothing());
                if off == 1 && self.metrics.redis_persistence_off.get() == 0 {
                    redis_server::warn_if_volatile(&p);
                }
                self.metrics.redis_persistence_off.set(off);
            }
            Err(e @ ServerError::EvictionPolicy(_)) => {
                self.metrics.redis_refused.inc();
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        con.load_script(seckill_common::reservation::reserve_script())?;
        Ok(con)
    }

    /// The connection, connecting first if needed and due.
    ///
    /// Errors: [`Unavailable`] when the connect fails or the backoff since
    /// the last failure has not passed yet.
    pub fn get(&mut self) -> Result<&mut Con, Unavailable> {
        if self.con.is_none() {
            let now = Instant::now();
            let others_connected = self.metrics.redis_connects.get() > self.connects_seen;
            if now < self.next_try && !others_connected {
                return Err(Unavailable);
            }
            match self.connect() {
                Ok(c) => {
                    self.con = Some(self.slot.hold(c));
                    self.backoff.reset();
                    self.metrics.redis_connects.inc();
                }
                Err(e) => {
                    self.connects_seen = self.metrics.redis_connects.get();
                    self.metrics.redis_errors.inc();
                    self.down = Down::of(&e);
                    let wait = self.backoff.next_delay();
                    log::warn!(
                        "redis at {}: connect: {e}; next attempt in {wait:?}",
                        self.client.address()
                    );
                    self.next_try = now + wait;
                    return Err(Unavailable);
                }
            }
        }
        self.con.as_deref_mut().ok_or(Unavailable)
    }

    /// Why Redis could not be used: the last connect's failure while no
    /// connection is open, else [`Down::Unreachable`] (a call on an open
    /// connection failed).
    pub fn down(&self) -> Down {
        if self.con.is_none() {
            self.down
        } else {
            Down::Unreachable
        }
    }

    /// Reports a failed call. Anything but an error reply from the server
    /// (a broken socket, a timeout with a reply possibly still in flight)
    /// closes the connection, so no later call reads a stale reply.
    ///
    /// On a cluster, a routed read whose master is held or was not reached,
    /// or a check of every master that meets a held one
    /// (`slot_router::stays_on_its_node`), keeps the connection: the slot
    /// router has dropped that master's connection itself, and a reconnect
    /// per call would fail the same way
    /// (`cluster_quarantine::reads_of_a_held_masters_buyers_do_not_reconnect_the_gateway`,
    /// `cluster_quarantine::readyz_polls_of_a_held_master_do_not_reconnect_the_gateway`).
    pub fn failed(&mut self, e: &RedisError) -> Unavailable {
        self.metrics.redis_errors.inc();
        if seckill_common::slot_router::stays_on_its_node(e) {
            log::warn!("redis: {e}");
        } else if !seckill_common::is_error_reply(e) {
            log::warn!("redis: {e}; reconnecting");
            self.con = None;
            self.next_try = Instant::now();
        } else {
            log::warn!("redis: error reply: {e}");
        }
        Unavailable
    }

    /// Runs `f` on the connection; a failure goes through [`Link::failed`].
    /// When a connection that had already been in use fails with anything
    /// but an error reply (typically: Redis restarted since), `f` runs once
    /// more on a fresh connection, so a restart costs no 503. Callers make
    /// `f` safe to repeat (reads, or a reservation with the same id).
    pub fn with<T>(
        &mut self,
        mut f: impl FnMut(&mut Con) -> redis::RedisResult<T>,
    ) -> Result<T, Unavailable> {
        let was_open = self.con.is_some();
        let con = self.get()?;
        // Counted in use while the call runs: two atomic adds per call.
        let _busy = connections::using(Store::Redis);
        match f(con) {
            Ok(v) => Ok(v),
            Err(e) => {
                let kept = seckill_common::is_error_reply(&e)
                    || seckill_common::slot_router::stays_on_its_node(&e);
                let u = self.failed(&e);
                if !was_open || kept {
                    return Err(u);
                }
                let con = self.get()?;
                f(con).map_err(|e| self.failed(&e))
            }
        }
    }
}

/// A fixed set of lazily connected Redis links that connection threads
/// borrow one at a time, so the number of Redis connections stays
/// `SECKILL_GATEWAY_THREADS` however many HTTP clients are connected.
pub struct LinkPool {
    free: Receiver<Link>,
    back: Sender<Link>,
    /// Longest wait for a free link: 3 × `SECKILL_REDIS_TIMEOUT` (as long
    /// as a purchase waits for its pipeline). On 2 cores, 3,000 clients
    /// reading at once starved the threads holding the links, and a 1 s
    /// wait answered thousands of reads 503 while Redis was healthy.
    wait: Duration,
}

impl LinkPool {
    /// `size` links (at least one), none connected yet.
    pub fn new(
        app_client: &Target,
        size: usize,
        timeout: Duration,
        metrics: &Arc<Metrics>,
    ) -> LinkPool {
        let size = size.max(1);
        let (back, free) = crossbeam_channel::bounded(size);
        for _ in 0..size {
            // Cannot fail: the channel has room for every link.
            let _ = back.send(Link::new(app_client.clone(), timeout, metrics.clone()));
        }
        LinkPool {
            free,
            back,
            wait: timeout * 3,
        }
    }

    /// Runs `f` on a borrowed link and gives the link back.
    ///
    /// Errors: [`Unavailable`] when no link is free within three Redis
    /// timeouts, or what `f` returns.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Link) -> Result<T, Unavailable>,
    ) -> Result<T, Unavailable> {
        let mut link = self.free.recv_timeout(self.wait).map_err(|_| Unavailable)?;
        let r = f(&mut link);
        // Cannot fail: this pool holds the receiver and there is room.
        let _ = self.back.send(link);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reading routes answer 503 on [`Unavailable`]; this is the pool's
    /// side of it: with every link borrowed, a read waits for one (at most
    /// three Redis timeouts) and then gives up, and the link once returned
    /// serves again.
    #[test]
    fn with_every_link_borrowed_a_read_is_unavailable_until_one_comes_back() {
        let client = match seckill_common::redis_target::Target::open("redis://127.0.0.1:1/") {
            Ok(c) => c,
            Err(e) => panic!("a valid URL: {e}"),
        };
        let metrics = Arc::new(Metrics::default());
        let pool = Arc::new(LinkPool::new(
            &client,
            1,
            Duration::from_millis(10),
            &metrics,
        ));
        let (held, is_held) = crossbeam_channel::bounded::<()>(0);
        let (release, released) = crossbeam_channel::bounded::<()>(0);
        let holder = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                pool.with(|_| {
                    let _ = held.send(());
                    let _ = released.recv();
                    Ok(1)
                })
            })
        };
        assert_eq!(is_held.recv(), Ok(()));
        assert_eq!(pool.with(|_| Ok(2)), Err(Unavailable));
        assert_eq!(release.send(()), Ok(()));
        assert_eq!(holder.join().ok(), Some(Ok(1)));
        assert_eq!(pool.with(|_| Ok(3)), Ok(3));
    }
}
