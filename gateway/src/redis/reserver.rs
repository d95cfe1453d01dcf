//! Owns the two ways a purchase reaches Redis behind one type
//! ([`Reserver`]): one round trip on a borrowed link, or group commit (the
//! purchase handed to the Redis threads of `group_commit.rs`, its outcome
//! waited for on the calling thread). Either way the reservation id is
//! drawn here and a reply naming it is this purchase's own success
//! (`reservation::own`). (Most purchases of a one-bucket sale under group
//! commit are not waited for at all: `http/answer.rs` hands them over with
//! their request, [`Reserver::jobs`].)

use crate::metrics::Metrics;
use crate::redis::group_commit::{Job, ReplyTo, Slot};
use crate::redis::link::{LinkPool, Unavailable};
use crossbeam_channel::Sender;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{self, Replied};
use seckill_common::reserve_units;
use std::sync::Arc;
use std::time::Duration;

/// How purchases reach Redis, with what it needs to reach it.
pub struct Reserver {
    /// Group commit or one round trip.
    pub mode: Mode,
    /// The shared links a round trip borrows.
    links: Arc<LinkPool>,
    /// `SECKILL_REDIS_TIMEOUT`.
    timeout: Duration,
    metrics: Arc<Metrics>,
}

/// How purchases reach Redis (`SECKILL_GATEWAY_REDIS_THREADS`).
pub enum Mode {
    /// `0`: each purchase borrows one of the shared links for one round
    /// trip.
    RoundTrip,
    /// Group commit: purchases go to the Redis threads over `jobs`.
    GroupCommit {
        /// The bounded queue to the Redis threads.
        jobs: Sender<Job>,
    },
}

impl Reserver {
    /// A reserver in `mode` over `links`.
    pub fn new(
        mode: Mode,
        links: Arc<LinkPool>,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Reserver {
        Reserver {
            mode,
            links,
            timeout,
            metrics,
        }
    }

    /// The queue to the Redis threads under group commit.
    pub fn jobs(&self) -> Option<&Sender<Job>> {
        match &self.mode {
            Mode::RoundTrip => None,
            Mode::GroupCommit { jobs } => Some(jobs),
        }
    }

    /// How long a purchase waits to be sent to Redis before it is given
    /// up: three Redis timeouts (the queue ahead of it, the pipeline
    /// before it, and one retry of that on a fresh connection). A purchase
    /// the Redis thread answers (`http/answer.rs`) is held to the same
    /// deadline from its arrival.
    pub fn pipeline_wait(&self) -> Duration {
        self.timeout * 3
    }

    /// Reserves one unit in bucket `keys` (the buyer's home bucket,
    /// `home.rs`; a one-bucket sale's own keys) for the valid `user_id`.
    ///
    /// Errors: [`Unavailable`] when Redis cannot be reached in time, or (group
    /// commit) when the Redis threads' queue is full, or the purchase was not
    /// sent within three Redis timeouts (then it never is). A purchase that
    /// was sent and got no answer may still have reserved (the script ran,
    /// the answer was lost); a client's retry is answered 409 with its id.
    pub fn reserve(&self, keys: SaleKeys, user_id: &str) -> Result<Replied, Unavailable> {
        let rid = seckill_common::ids::new_reservation_id();
        match &self.mode {
            Mode::RoundTrip => self.round_trip(keys, user_id, &rid),
            Mode::GroupCommit { jobs } => {
                let slot = Arc::new(Slot::default());
                let job = Job {
                    sale_id: keys.sale_id,
                    bucket: keys.bucket,
                    user_id: user_id.to_string(),
                    reservation_id: rid,
                    reply_to: ReplyTo::Waiter(slot.clone()),
                };
                if jobs.try_send(job).is_err() {
                    return Err(Unavailable);
                }
                slot.wait(self.pipeline_wait(), self.timeout * 3)
            }
        }
    }
}

/// One purchase on a cluster, sent like a group commit's
/// (`Con::pipeline_by_slot`: the slot router, whose quarantine fails a
/// held master's purchases at once) rather than through the redis crate's
/// cluster connection, whose (re)connect pings every node and waits out a
/// stalled one: while one master is stopped, the buyers of the other
/// masters' buckets are still served
/// (`cluster_quarantine::without_group_commit_a_stalled_master_holds_back_only_its_buckets`).
/// `NOSCRIPT` loads the script on every reachable master and sends it once
/// more.
///
/// Errors: the master was not reached (`slot_router::not_reached`: the
/// link stays), or no slot map could be read.
fn by_slot(
    con: &mut seckill_common::redis_target::Con,
    keys: SaleKeys,
    user_id: &str,
    rid: &str,
) -> redis::RedisResult<redis::Value> {
    use seckill_common::reservation::{reserve_script, write_call, ReserveKeys};
    use seckill_common::slot_router::{not_reached, Packed, Reply};
    let rk = ReserveKeys::of(keys);
    let mut p = Packed::with_capacity(1, 320);
    p.push(rk.slot, |out| write_call(out, &rk, user_id, rid));
    for pass in 0..2 {
        let Some(Reply {
            reached: true,
            value: v,
            ..
        }) = con.pipeline_by_slot(&p, None)?.into_iter().next()
        else {
            return Err(not_reached(rk.slot));
        };
        match &v {
            redis::Value::ServerError(se)
                if se.kind() == Some(redis::ServerErrorKind::NoScript) && pass == 0 =>
            {
                con.load_script(reserve_script())?;
            }
            _ => return Ok(v),
        }
    }
    Err(not_reached(rk.slot))
}

impl Reserver {
    /// Reserves `quantity` units in bucket `keys` for the valid
    /// `user_id` under the keyed reservation id `rid` (`None`: the
    /// purchase has no key) with the units script
    /// (`reservation::reserve_units`), in one round trip on a shared link,
    /// whatever the mode: such purchases are few, each is a call of its
    /// own (the script takes one buyer), and a keyed retry must find its
    /// first attempt decided, which a round trip gives.
    ///
    /// Errors: [`Unavailable`] when Redis cannot be reached in time or
    /// refuses the script (a key of the wrong type: nothing changed).
    pub fn reserve_units(
        &self,
        keys: SaleKeys,
        user_id: &str,
        rid: Option<&str>,
        quantity: u32,
    ) -> Result<Replied, Unavailable> {
        let inv = reserve_units::prepare_units(keys, user_id, rid.unwrap_or(""), quantity);
        let reply = self
            .links
            .with(|link| link.with(|con| inv.invoke::<redis::Value>(con)))?;
        reservation::parse(&reply).map_err(|e| {
            self.metrics.redis_errors.inc();
            log::error!("reservation of units: {e}");
            Unavailable
        })
    }

    fn round_trip(&self, keys: SaleKeys, user_id: &str, rid: &str) -> Result<Replied, Unavailable> {
        let inv = reservation::prepare_in(keys, user_id, rid);
        let reply = self.links.with(|link| {
            link.with(|con| {
                if con.is_cluster() {
                    by_slot(con, keys, user_id, rid)
                } else {
                    inv.invoke::<redis::Value>(con)
                }
            })
        })?;
        match reservation::parse(&reply) {
            Ok(r) => Ok(reservation::own(r, rid)),
            Err(e) => {
                self.metrics.redis_errors.inc();
                log::error!("reservation: {e}");
                Err(Unavailable)
            }
        }
    }
}
