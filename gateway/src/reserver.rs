//! Owns the two ways a purchase reaches Redis behind one type
//! ([`Reserver`]): one round trip on a borrowed link, or group commit (the
//! purchase handed to the Redis threads of `group_commit.rs`, its outcome
//! waited for on this connection's thread). Either way the reservation id
//! is drawn here and a reply naming it is this purchase's own success
//! (`reservation::own`). (Most purchases of a one-bucket sale under group
//! commit are not waited for at all: `answer.rs` hands them over with
//! their request.)

use crate::app::App;
use crate::group_commit::{Job, ReplyTo, Slot};
use crate::redis_link::Unavailable;
use crossbeam_channel::Sender;
use seckill_common::keys::SaleKeys;
use seckill_common::reservation::{self, Replied};
use std::sync::Arc;
use std::time::Duration;

/// How purchases reach Redis (`SECKILL_GATEWAY_REDIS_THREADS`).
pub enum Reserver {
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
    /// Reserves one unit in bucket `keys` (the buyer's home bucket,
    /// `home.rs`; a one-bucket sale's own keys) for the valid `user_id`.
    ///
    /// Errors: [`Unavailable`] when Redis cannot be reached in time, or (group
    /// commit) when the Redis threads' queue is full, or the purchase was not
    /// sent within three Redis timeouts (then it never is). A purchase that
    /// was sent and got no answer may still have reserved (the script ran,
    /// the answer was lost); a client's retry is answered 409 with its id.
    pub fn reserve(
        &self,
        app: &App,
        keys: SaleKeys,
        user_id: &str,
    ) -> Result<Replied, Unavailable> {
        let rid = seckill_common::ids::new_reservation_id();
        match self {
            Reserver::RoundTrip => round_trip(app, keys, user_id, &rid),
            Reserver::GroupCommit { jobs } => {
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
                slot.wait(pipeline_wait(app), app.redis_timeout * 3)
            }
        }
    }
}

/// One purchase on a cluster, sent like a group commit's
/// (`Con::pipeline_by_slot`: the slot router, whose quarantine fails a
/// held master's purchases at once) rather than through the redis crate's
/// cluster connection, whose (re)connect pings every node and waits out a
/// stalled one: before, while one master was stopped, every buyer of the
/// other masters' buckets got 503
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

/// How long a purchase waits to be sent to Redis before it is given up:
/// three Redis timeouts (the queue ahead of it, the pipeline before it,
/// and one retry of that on a fresh connection). A purchase the Redis
/// thread answers (`answer.rs`) is held to the same deadline from its
/// arrival.
pub fn pipeline_wait(app: &App) -> Duration {
    app.redis_timeout * 3
}

fn round_trip(app: &App, keys: SaleKeys, user_id: &str, rid: &str) -> Result<Replied, Unavailable> {
    let inv = reservation::prepare_in(keys, user_id, rid);
    let reply = app.links.with(|link| {
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
            app.metrics.redis_errors.inc();
            log::error!("reservation: {e}");
            Err(Unavailable)
        }
    }
}
