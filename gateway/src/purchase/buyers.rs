//! Owns what the gateway reads of a sold-out sale's buyers (into a
//! `buyer_set::BuyerSet`): the loader thread that
//! reads a sale's `buyers` hash once when the sale sells out and installs
//! it in the sold-out memory (`soldout.rs`) only if Redis still says sold
//! out at the same reservation sequence, the sweep that frees sales whose
//! window has closed, and the one-buyer read ([`lookup_one`]) used while no
//! set is installed.
//!
//! Bounded twice: a sale's buyers are at most its stock (one reservation
//! per user per sale), and all sales' together at most
//! `SECKILL_GATEWAY_BUYERS_MAX`; a sale that does not fit is answered with
//! [`lookup_one`] (one `HGET`, no script) for as long as it stays sold out.

use crate::metrics::Metrics;
use crate::purchase::buyer_set::BuyerSet;
use crate::purchase::home::BucketCounts;
use crate::purchase::soldout::SoldOutCache;
use crate::redis::link::{Link, LinkPool, Unavailable};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use std::time::Duration;

/// How often the loader frees the buyers of sales whose window has closed.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// `HSCAN` page size while loading a sale's buyers.
const SCAN_COUNT: usize = 1000;

/// Load requests waiting for the loader; beyond it a request is dropped
/// (that sale is then answered with [`lookup_one`] until its next recheck).
const QUEUE: usize = 1024;

/// Hands load requests to the loader thread.
#[derive(Debug, Clone)]
pub struct Loader(Sender<(u64, u64)>);

impl Loader {
    /// Asks for the buyers of `sale_id`, sold out at `seq`, to be loaded.
    /// When the loader's queue is full the request is dropped and the
    /// entry is put back to unknown (asked again at its next sell-out
    /// answer).
    pub fn request(&self, soldout: &SoldOutCache, sale_id: u64, seq: u64) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.0.try_send((sale_id, seq))
        {
            soldout.loaded(sale_id, seq, None, false, 0);
        }
    }
}

/// A loader and the receiving end its thread runs on ([`run`]).
pub fn loader() -> (Loader, Receiver<(u64, u64)>) {
    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
    (Loader(tx), rx)
}

/// The loader thread: loads what is asked into `soldout` over `link`,
/// and every [`SWEEP_EVERY`] frees the buyers of sales whose window has
/// closed. Runs until every [`Loader`] is dropped.
pub fn run(
    soldout: &SoldOutCache,
    mut link: Link,
    metrics: &Metrics,
    requests: Receiver<(u64, u64)>,
) {
    loop {
        match requests.recv_timeout(SWEEP_EVERY) {
            Ok((sale_id, seq)) => load_into(soldout, &mut link, sale_id, seq),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
        soldout.sweep(seckill_common::now_ms());
        metrics
            .buyers_remembered
            .set(i64::try_from(soldout.buyers_held()).unwrap_or(i64::MAX));
    }
}

/// Loads the buyers of `sale_id`, sold out at `seq`, into `soldout`.
fn load_into(soldout: &SoldOutCache, link: &mut Link, sale_id: u64, seq: u64) {
    let room = soldout.buyers_room();
    match link.with(|con| load(con, sale_id, seq, room)) {
        Ok(Loaded::Set(set, ends)) => {
            log::info!("sale {sale_id}: sold out; {} buyers in memory", set.len());
            soldout.loaded(sale_id, seq, Some(set), false, ends);
        }
        Ok(Loaded::TooMany(n, ends)) => {
            log::warn!(
                "sale {sale_id}: sold out with {n} buyers, more than the {room} \
                 SECKILL_GATEWAY_BUYERS_MAX leaves room for; each retry reads its buyer"
            );
            soldout.loaded(sale_id, seq, None, true, ends);
        }
        Ok(Loaded::Lists(ends)) => {
            log::info!("sale {sale_id}: sold out; its buyers hold lists, read one at a time");
            soldout.loaded(sale_id, seq, None, true, ends);
        }
        Ok(Loaded::Changed) | Err(Unavailable) => {
            soldout.loaded(sale_id, seq, None, false, 0);
        }
    }
}

/// What one load came to.
enum Loaded {
    /// Every buyer, and the sale's window end (Unix ms).
    Set(BuyerSet, u64),
    /// This many buyers: more than the room left.
    TooMany(usize, u64),
    /// The sale sold again (or stock came back) while it was read.
    Changed,
    /// The sale sells several units per buyer: its buyers are read one at
    /// a time (their purchase goes to the script), never held.
    Lists(u64),
}

/// Reads the buyers of `sale_id` if they fit in `room`, then checks that
/// Redis still says sold out at `seq` (a release or a sale meanwhile makes
/// the set stale).
fn load(con: &mut Con, sale_id: u64, seq: u64, room: usize) -> redis::RedisResult<Loaded> {
    let k = SaleKeys::new(sale_id);
    let (n, ends): (usize, Option<u64>) = redis::pipe()
        .cmd("HLEN")
        .arg(k.buyers())
        .cmd("HGET")
        .arg(k.meta())
        .arg("ends_at_ms")
        .query(con)?;
    let ends = ends.unwrap_or(0);
    if n > room {
        return Ok(Loaded::TooMany(n, ends));
    }
    let mut set = BuyerSet::default();
    let mut cursor: u64 = 0;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("HSCAN")
            .arg(k.buyers())
            .arg(cursor)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query(con)?;
        for pair in page.chunks_exact(2) {
            // A sale of several units per buyer: its buyers hold lists
            // (`allowance.rs`), answered by the script, never from memory.
            if pair[1].contains(':') {
                return Ok(Loaded::Lists(ends));
            }
            if !set.insert(&pair[0], &pair[1]) {
                log::warn!(
                    "sale {sale_id}: buyer {:?} holds a malformed reservation id",
                    pair[0]
                );
                return Ok(Loaded::Changed);
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let now_seq = seckill_common::reservation::read_sequence(con, sale_id)?;
    let stock: Option<i64> = redis::cmd("GET").arg(k.stock()).query(con)?;
    if now_seq != seq || stock.unwrap_or(0) > 0 {
        return Ok(Loaded::Changed);
    }
    Ok(Loaded::Set(set, ends))
}

/// The reservation id `user_id` holds in `sale_id`, read from Redis (one
/// `HGET` of its home bucket on a shared link): the answer for a sold-out sale whose buyers
/// are not in memory.
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn lookup_one(
    links: &LinkPool,
    buckets: &BucketCounts,
    sale_id: u64,
    user_id: &str,
) -> Result<Option<String>, Unavailable> {
    let key = buckets.home(links, sale_id, user_id)?.0.buyers();
    links.with(|link| {
        link.with(|con| {
            redis::cmd("HGET")
                .arg(&key)
                .arg(user_id)
                .query::<Option<String>>(con)
        })
    })
}
