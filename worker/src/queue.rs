//! Owns the worker's side of the reliable queue in Redis: taking a batch from
//! a sale's queue into this worker's processing list, the batch's reads and
//! counts (the fence's flow records, failed attempts), settling a finished
//! batch ([`Consumer::settle`]: statuses, dead letters, requeues, removal
//! from the processing list in one `MULTI`), and moving a processing list
//! back to its queue.
//!
//! Protocol (keys in `seckill_common::keys`): the gateway `LPUSH`es onto
//! `queue`; a worker moves from its right end (oldest first) onto the left
//! end of `processing:WORKER`, so a message is always in exactly one list
//! and a crash anywhere leaves it recoverable from the processing list.

use seckill_common::connections::{Held, Slot, Store};
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::{PurchaseStatus, SaleKeys, SALES};
use seckill_common::redis_target::{Con, Target};
use seckill_common::reliable_queue;
use seckill_common::status_write::{self, Created};
use std::time::Duration;

/// Moves bucket `k`'s processing list of worker `worker_id` back to the
/// bucket's queue; returns the number of messages moved.
///
/// Errors: Redis failures (then nothing or everything was moved).
pub fn reclaim(con: &mut Con, k: SaleKeys, worker_id: &str) -> redis::RedisResult<u64> {
    reliable_queue::reclaim(con, &k.processing(worker_id), &k.queue())
}

/// Every sale id in `seckill:sales`, ascending, read with `SSCAN` (never
/// `SMEMBERS` on an unbounded set). Members that are not ids are skipped.
///
/// Errors: Redis failures.
pub fn sales(con: &mut Con) -> redis::RedisResult<Vec<u64>> {
    let mut ids = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(SALES)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query(con)?;
        ids.extend(page.iter().filter_map(|s| s.parse::<u64>().ok()));
        if next == 0 {
            break;
        }
        cursor = next;
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
}

/// The keys of every bucket of every sale in `seckill:sales` ([`sales`],
/// then `buckets::expand`: one `HMGET` per sale), ascending: the queues
/// to consume (one per bucket; a sale of one bucket has one).
///
/// Errors: Redis failures.
pub fn buckets(con: &mut Con) -> redis::RedisResult<Vec<SaleKeys>> {
    let ids = sales(con)?;
    seckill_common::buckets::expand(con, &ids)
}

/// Whether the server at the other end of `con` has `LMOVE`/`BLMOVE`
/// (Redis 6.2 or newer), from `INFO server` (of every master of a
/// cluster: all must have them).
///
/// Errors: Redis failures.
pub fn has_lmove(con: &mut Con) -> redis::RedisResult<bool> {
    let all = con.each_master(|c| {
        let info: String = redis::cmd("INFO").arg("server").query(c)?;
        Ok::<_, redis::RedisError>(version_has_lmove(&info))
    })?;
    Ok(all.iter().all(|&b| b))
}

fn version_has_lmove(info: &str) -> bool {
    let Some(v) = info.lines().find_map(|l| l.strip_prefix("redis_version:")) else {
        return true;
    };
    let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= (6, 2)
}

/// This worker's two Redis connections: an ordinary one (timeouts
/// `SECKILL_REDIS_TIMEOUT`) and one for the blocking move, whose read timeout
/// is the block time plus that timeout. A client-side timeout shorter than
/// the server's block would let the server move a message after the client
/// gave up; so after any error on the blocking call that connection is
/// dropped, and the caller reclaims its processing list.
pub struct Consumer {
    client: Target,
    worker_id: String,
    timeout: Duration,
    block: Duration,
    lmove: bool,
    con: Option<Held<Con>>,
    blocking: Option<Held<Con>>,
    /// Count a connection after the first as a reconnect
    /// (`seckill_common::connections`).
    slots: (Slot, Slot),
}

impl Consumer {
    /// A consumer for `worker_id` (connections open lazily).
    ///
    /// Errors: the URL cannot be parsed.
    pub fn new(
        url: &str,
        worker_id: &str,
        timeout: Duration,
        block: Duration,
    ) -> redis::RedisResult<Consumer> {
        Ok(Consumer {
            client: Target::open(url)?,
            worker_id: worker_id.to_string(),
            timeout,
            block,
            lmove: true,
            con: None,
            blocking: None,
            slots: (Slot::new(Store::Redis), Slot::new(Store::Redis)),
        })
    }

    /// The ordinary connection, opened (the server checked, its version
    /// read) on first use. A server whose eviction policy can delete the
    /// sale's keys is refused (`seckill_common::redis_server`): the worker
    /// then takes nothing until it is fixed, and says why in its log.
    ///
    /// Errors: Redis failures, or the server refused (kind `Client`).
    pub fn con(&mut self) -> redis::RedisResult<&mut Con> {
        if self.con.is_none() {
            let mut c = open(&self.client, self.timeout, self.timeout)?;
            match seckill_common::redis_server::check(&mut c) {
                Ok(p) => seckill_common::redis_server::warn_if_volatile(&p),
                Err(seckill_common::redis_server::ServerError::Redis(e)) => return Err(e),
                Err(e) => {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "redis server refused",
                        e.to_string(),
                    )))
                }
            }
            self.lmove = has_lmove(&mut c)?;
            self.con = Some(self.slots.0.hold(c));
        }
        match self.con.as_deref_mut() {
            Some(c) => Ok(c),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "not connected",
            ))),
        }
    }

    /// Drops both connections (after any error: their state is unknown).
    pub fn reset(&mut self) {
        self.con = None;
        self.blocking = None;
    }

    /// Takes up to `max` messages of bucket `k` without blocking; oldest
    /// first. Empty when the queue is empty.
    ///
    /// Errors: Redis failures (the caller reclaims its processing list).
    pub fn take(&mut self, k: SaleKeys, max: usize) -> redis::RedisResult<Vec<Vec<u8>>> {
        let (queue, processing) = (k.queue(), k.processing(&self.worker_id));
        reliable_queue::take(self.con()?, &queue, &processing, max)
    }

    /// Waits up to the block time for one message of bucket `k`
    /// (`BLMOVE queue processing RIGHT LEFT`, or `BRPOPLPUSH` before Redis
    /// 6.2). `None` when none arrived.
    ///
    /// Errors: Redis failures; the blocking connection is then dropped.
    pub fn wait_one(&mut self, k: SaleKeys) -> redis::RedisResult<Option<Vec<u8>>> {
        // Read the server version first (it decides the command).
        self.con()?;
        if self.blocking.is_none() {
            let b = open(&self.client, self.timeout, self.block + self.timeout)?;
            self.blocking = Some(self.slots.1.hold(b));
        }
        let secs = self.block.as_secs_f64();
        let cmd = if self.lmove {
            let mut c = redis::cmd("BLMOVE");
            c.arg(k.queue())
                .arg(k.processing(&self.worker_id))
                .arg("RIGHT")
                .arg("LEFT")
                .arg(secs);
            c
        } else {
            let mut c = redis::cmd("BRPOPLPUSH");
            c.arg(k.queue())
                .arg(k.processing(&self.worker_id))
                .arg(secs);
            c
        };
        let r = match self.blocking.as_deref_mut() {
            Some(b) => cmd.query(b),
            None => return Ok(None),
        };
        if r.is_err() {
            self.blocking = None;
        }
        r
    }

    /// Moves every processing list of this worker back to its queue (at start,
    /// and after any Redis error, when this worker holds no batch).
    ///
    /// Errors: Redis failures.
    pub fn reclaim_own(&mut self, sales: &[SaleKeys]) -> redis::RedisResult<u64> {
        let id = self.worker_id.clone();
        let con = self.con()?;
        let mut n = 0;
        for s in sales {
            match reclaim(con, *s, &id) {
                Ok(moved) => n += moved,
                // A sale whose lists hold the wrong type is left as it is
                // (its messages stay where they are); the others go on.
                Err(e) if seckill_common::is_error_reply(&e) => {
                    log::error!("{}: cannot reclaim my processing list: {e}", s.tag())
                }
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    /// The fence's read: the flow records of reservations `rids` in bucket
    /// `k` (one `HMGET` of its flow hash), in the order of `rids`;
    /// `None` where there is none.
    ///
    /// Errors: Redis failures.
    pub fn flow_records(
        &mut self,
        k: SaleKeys,
        rids: &[&str],
    ) -> redis::RedisResult<Vec<Option<Vec<u8>>>> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(k.flow());
        for rid in rids {
            cmd.arg(*rid);
        }
        cmd.query(self.con()?)
    }

    /// The records of reservations `rids` of bucket `k` in its
    /// `released` hash (the flow records the order lifecycle moved there
    /// when it gave their units back), one `HMGET`, in the order of
    /// `rids`; `None` where there is none.
    ///
    /// Errors: Redis failures.
    pub fn released_records(
        &mut self,
        k: SaleKeys,
        rids: &[&str],
    ) -> redis::RedisResult<Vec<Option<Vec<u8>>>> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(k.released());
        for rid in rids {
            cmd.arg(*rid);
        }
        cmd.query(self.con()?)
    }

    /// Adds one failed application to each of reservations `rids` of bucket
    /// `k` (`HINCRBY` of its attempts hash, one pipeline) and returns
    /// the new counts, in the order of `rids`.
    ///
    /// Errors: Redis failures (some counts may have been added).
    pub fn count_attempts(&mut self, k: SaleKeys, rids: &[&str]) -> redis::RedisResult<Vec<u32>> {
        let mut p = redis::pipe();
        for rid in rids {
            p.hincr(k.attempts(), *rid, 1);
        }
        p.query(self.con()?)
    }

    /// Settles a finished batch of bucket `k` in one `MULTI`, in this
    /// order: the `confirmed` / `pending_payment` statuses (over `queued`
    /// only, `status_write.rs`; their attempt counts cleared), the
    /// `fenced` dead letters (status and attempts left alone), the `dead`
    /// ones (status `on_hold` and attempts cleared when they name a
    /// reservation), the `requeue`d messages back on the queue, and `LREM`
    /// of every `remove`d message from this worker's processing list.
    ///
    /// Errors: Redis failures (then nothing was written: the batch stays
    /// in the processing list and is reclaimed).
    pub fn settle(&mut self, k: SaleKeys, s: &Settlement<'_>) -> redis::RedisResult<()> {
        let mut p = redis::pipe();
        p.atomic();
        // Only over `queued`: a lifecycle status written meanwhile stands.
        status_write::add_created_in(&mut p, k, &s.confirmed);
        if !s.confirmed.is_empty() {
            // One HDEL of every field, not one per order (docs/PERFORMANCE.md).
            let rids: Vec<&str> = s.confirmed.iter().map(|c| c.reservation_id).collect();
            p.hdel(k.attempts(), rids).ignore();
        }
        for d in &s.fenced {
            p.lpush(k.dead_letter(), d.to_json()).ignore();
        }
        for d in &s.dead {
            p.lpush(k.dead_letter(), d.to_json()).ignore();
            if let Some(rid) = &d.reservation_id {
                p.hset(k.status(), rid, PurchaseStatus::OnHold.as_str())
                    .ignore();
                p.hdel(k.attempts(), rid).ignore();
            }
        }
        for raw in &s.requeue {
            p.lpush(k.queue(), *raw).ignore();
        }
        let processing = k.processing(&self.worker_id);
        // The oldest message sits at the right end: search from there.
        for raw in &s.remove {
            p.lrem(&processing, -1, *raw).ignore();
        }
        p.query::<()>(self.con()?)
    }
}

/// The Redis writes that finish one batch ([`Consumer::settle`]), each
/// list oldest message first.
#[derive(Debug, Default)]
pub struct Settlement<'a> {
    /// Orders whose status becomes `confirmed` or `pending_payment` (only
    /// over `queued`: `status_write.rs`).
    pub confirmed: Vec<Created<'a>>,
    /// Dead letters the fence wrote: status and attempts left alone (the
    /// reservation was released, or never made).
    pub fenced: Vec<&'a DeadLetter>,
    /// Dead letters whose reservation's status becomes `on_hold`.
    pub dead: Vec<&'a DeadLetter>,
    /// Messages pushed back on the queue for another attempt.
    pub requeue: Vec<&'a [u8]>,
    /// Messages removed from the processing list.
    pub remove: Vec<&'a [u8]>,
}

/// Opens a connection with the given connect and read timeout (the write
/// timeout is the connect timeout).
///
/// Errors: Redis failures.
pub fn open(client: &Target, timeout: Duration, read: Duration) -> redis::RedisResult<Con> {
    let mut c = client.connect(timeout)?;
    c.set_read_timeout(Some(read))?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_server_version() {
        assert!(super::version_has_lmove(
            "# Server\r\nredis_version:7.0.15\r\n"
        ));
        assert!(super::version_has_lmove("redis_version:6.2.0\r\n"));
        assert!(!super::version_has_lmove("redis_version:6.0.9\r\n"));
        assert!(!super::version_has_lmove("redis_version:5.0.14\r\n"));
    }
}
