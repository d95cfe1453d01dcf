//! Owns what the read-only routes read, as facts rather than replies:
//! `GET /v1/sales/{id}` (stock and window, the state by Redis's clock:
//! [`SaleView`]), `GET /v1/sales/{id}/purchases/{user}` (the buyer's
//! reservation and its status as the worker last wrote it: [`Status`])
//! and `GET /readyz` (Redis would take a purchase now). `http/` says them.

use crate::purchase::home::BucketCounts;
use crate::redis::link::{Down, Link, LinkPool, Unavailable};
use seckill_common::allowance::Held;
use seckill_common::archive;
use seckill_common::keys::PurchaseStatus;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use seckill_common::redis_server;
use std::sync::Arc;

/// What the reading routes borrow.
pub struct Reads {
    /// The shared Redis links.
    pub links: Arc<LinkPool>,
    /// Each sale's number of buckets (shared with the purchase path).
    pub buckets: Arc<BucketCounts>,
}

/// A sale as `GET /v1/sales/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaleView {
    /// Redis holds no such sale.
    NotFound,
    /// Paused, and Redis lost its meta (only the pause is left).
    PausedWithoutMeta,
    /// Archived: its bucket 0's meta is a tombstone.
    Archived {
        /// Units it ended with.
        stock_left: u64,
        /// Window start and end, Unix ms.
        starts: u64,
        /// Window end, Unix ms.
        ends: u64,
        /// When it was archived, Unix ms.
        archived_at: u64,
    },
    /// Held by Redis.
    Live {
        /// Units left over all its buckets.
        stock: i64,
        /// Window start, Unix ms.
        starts: u64,
        /// Window end, Unix ms.
        ends: u64,
        /// `paused`, `upcoming`, `ended`, `sold_out` or `active`.
        state: &'static str,
    },
}

/// A buyer's purchase as `GET .../purchases/{user}` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The reservation id.
    pub reservation_id: String,
    /// The status as the worker last wrote it (`queued` before that).
    pub status: String,
    /// The payment deadline (Unix ms) of a `pending_payment` order.
    pub pay_by: Option<u64>,
    /// Units the reservation holds (its order message's `quantity`).
    pub quantity: u32,
    /// In a sale of several units per buyer (the buyer's mark is a list),
    /// every reservation of the list in the order they were made, the
    /// latest (the fields above) last; `None` in a sale of one unit per
    /// buyer, and for a buyer whose list emptied (the released mark in
    /// `buyers:released` is one id).
    pub reservations: Option<Vec<Listed>>,
}

/// One reservation of a buyer's list, as [`Status::reservations`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The reservation id.
    pub reservation_id: String,
    /// Its units, as the buyer's list holds them.
    pub quantity: u32,
    /// Its status as the worker last wrote it (`queued` before that).
    pub status: String,
}

/// `GET /v1/sales/{sale_id}`: one pipeline of `HMGET meta`, `GET stock`,
/// `TIME` (of bucket 0; for a sale split over buckets, `stock_remaining`
/// adds the other buckets' stock). `state` is `paused` while the sale is paused (Redis lost data
/// of it, until `sale repair`; or an operator's `sale pause`, until `sale
/// resume`; or bucket 0's master changed and the data-loss watch has not
/// checked it there yet, `data_loss::STAMP_FIELD`), else `upcoming` before the window, `ended`
/// after it, `sold_out` when no stock is left, else `active`; times are
/// RFC 3339 UTC. An archived sale (bucket 0's meta is its tombstone,
/// `seckill_common::archive`) is `ended`, as its purchases are 403
/// `sale_ended`, with `stock_remaining` the units it ended with (what this
/// route said just before the archive; 0 for a tombstone older than that
/// field) and `archived_at`; no other bucket is read. A paused sale whose
/// meta Redis lost (only the pause is left, written back by the data-loss
/// watch) is 503 `sale_paused`, as its purchases.
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn sale(reads: &Reads, sale_id: u64) -> Result<SaleView, Unavailable> {
    let k = SaleKeys::new(sale_id);
    let (meta, stock, (secs, micros)) = reads.links.with(|link| {
        link.with(|con| {
            redis::pipe()
                .cmd("HMGET")
                .arg(k.meta())
                .arg("total_stock")
                .arg("starts_at_ms")
                .arg("ends_at_ms")
                .arg(seckill_common::data_loss::PAUSED_FIELD)
                .arg(archive::ARCHIVED_FIELD)
                .arg(archive::STOCK_LEFT_FIELD)
                .arg(seckill_common::sale_admin::OPERATOR_PAUSED)
                .arg(seckill_common::data_loss::STAMP_FIELD)
                .arg(seckill_common::data_loss::LOCAL_STAMP_FIELD)
                .cmd("GET")
                .arg(k.stock())
                .cmd("TIME")
                .query::<(Vec<Option<String>>, Option<i64>, (u64, u64))>(con)
        })
    })?;
    let num = |i: usize| meta.get(i).cloned().flatten()?.parse::<u64>().ok();
    let paused = meta.get(3).is_some_and(Option::is_some);
    let (Some(starts), Some(ends)) = (num(1), num(2)) else {
        // A pause written back after Redis lost the meta: the sale exists
        // and is paused, as its purchases are answered.
        return Ok(if paused {
            SaleView::PausedWithoutMeta
        } else {
            SaleView::NotFound
        });
    };
    // Redis lost data of it (`paused`), or an operator paused it, or its
    // master changed since the data-loss watch last checked it (the
    // stamps differ: purchases are held until it has).
    let field = |i: usize| meta.get(i).cloned().flatten();
    let held = field(7).is_some() && field(7) != field(8);
    let paused = held || [3, 6].iter().any(|&i| field(i).is_some());
    if let Some(archived_at) = num(4) {
        return Ok(SaleView::Archived {
            stock_left: num(5).unwrap_or(0),
            starts,
            ends,
            archived_at,
        });
    }
    let now_ms = secs * 1000 + micros / 1000;
    let mut stock = stock.unwrap_or(0).max(0);
    match reads.buckets.of(&reads.links, sale_id)? {
        1 => {}
        k => stock += other_buckets_stock(&reads.links, sale_id, k)?,
    }
    let state = if paused {
        "paused"
    } else if now_ms < starts {
        "upcoming"
    } else if now_ms >= ends {
        "ended"
    } else if stock == 0 {
        "sold_out"
    } else {
        "active"
    };
    Ok(SaleView::Live {
        stock,
        starts,
        ends,
        state,
    })
}

/// The stock of buckets 1 .. `k` of `sale_id` (a sale split over `k`
/// buckets), each never below 0: one `GET` per bucket.
fn other_buckets_stock(links: &LinkPool, sale_id: u64, k: u32) -> Result<i64, Unavailable> {
    links.with(|link| {
        let mut sum = 0;
        for b in 1..k {
            let s: Option<i64> = link.with(|con| {
                redis::cmd("GET")
                    .arg(SaleKeys::bucket(sale_id, b).stock())
                    .query(con)
            })?;
            sum += s.unwrap_or(0).max(0);
        }
        Ok(sum)
    })
}

/// `GET /v1/sales/{sale_id}/purchases/{user_id}`: `HGET buyers user`, and
/// when the buyer holds no mark `HGET buyers:released user` (the purchase
/// whose mark a release removed: a rollback, or an expiry or cancellation
/// in a sale that lets a released buyer buy again), then one pipeline of `HGET status rid`
/// and `HGET pay_by rid` of the buyer's mark, else of the released one. So
/// a buyer who was answered 202 reads a status until the sale is archived;
/// 404 only for a buyer who never bought. A reservation without a status
/// reads as `queued`; `pending_payment` carries `pay_by`
/// (RFC 3339 UTC, the deadline MySQL holds). `quantity` is the units of
/// the reservation, read from its flow record (or, released, from the
/// `released` hash; neither: its entry in the buyer's list, else 1). A
/// buyer of a sale of several units per buyer holds a list of
/// reservations (`allowance.rs`): the read shows the latest, and lists
/// every one with its units and status (one `HMGET status` of the list's
/// ids). The statuses: `queued`,
/// `confirmed` (final at creation), `pending_payment`, `paid`, `expired`,
/// `cancelled`, `on_hold` (dead-lettered: an operator decides), `failed`
/// (released). `None`: the buyer never bought.
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
pub fn purchase_status(
    reads: &Reads,
    sale_id: u64,
    user_id: &str,
) -> Result<Option<Status>, Unavailable> {
    let (k, _) = reads.buckets.home(&reads.links, sale_id, user_id)?;
    reads.links.with(|link| {
        // Single commands, not a pipeline: on a cluster a single command
        // to a held master fails fast and keeps the link, where a pipeline
        // drops it (a reconnect per read while a master is held).
        let hget = |link: &mut Link, key: String| {
            link.with(|con| {
                redis::cmd("HGET")
                    .arg(&key)
                    .arg(user_id)
                    .query::<Option<String>>(con)
            })
        };
        let mark = match hget(link, k.buyers())? {
            Some(mark) => mark,
            None => match hget(link, k.released_buyers())? {
                Some(mark) => mark,
                None => return Ok(None),
            },
        };
        let (rid, listed) = latest(&mark);
        let reservations = match Held::parse(&mark) {
            Ok(held) => Some(list(link, k, held)?),
            Err(_) => None,
        };
        let (status, pay_by, flow, released) = link.with(|con| {
            redis::pipe()
                .cmd("HGET")
                .arg(k.status())
                .arg(&rid)
                .cmd("HGET")
                .arg(k.pay_by())
                .arg(&rid)
                .cmd("HGET")
                .arg(k.flow())
                .arg(&rid)
                .cmd("HGET")
                .arg(k.released())
                .arg(&rid)
                .query::<(Option<String>, Option<u64>, Option<String>, Option<String>)>(con)
        })?;
        let quantity = flow
            .or(released)
            .and_then(|m| OrderMessage::parse(m.as_bytes()).ok())
            .map_or(listed, |m| m.quantity);
        let status = status.unwrap_or_else(|| PurchaseStatus::Queued.as_str().to_string());
        let pay_by = pay_by.filter(|_| status == PurchaseStatus::PendingPayment.as_str());
        Ok(Some(Status {
            reservation_id: rid,
            status,
            pay_by,
            quantity,
            reservations,
        }))
    })
}

/// The reservations of a buyer's list `held` in bucket `k`, each with its
/// status (one `HMGET` of the status hash).
///
/// Errors: [`Unavailable`] when Redis cannot be read in time.
fn list(link: &mut Link, k: SaleKeys, held: Held) -> Result<Vec<Listed>, Unavailable> {
    if held.0.is_empty() {
        return Ok(Vec::new());
    }
    let statuses: Vec<Option<String>> = link.with(|con| {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(k.status());
        for e in &held.0 {
            cmd.arg(&e.reservation_id);
        }
        cmd.query(con)
    })?;
    Ok(held
        .0
        .into_iter()
        .zip(statuses.into_iter().chain(std::iter::repeat(None)))
        .map(|(e, status)| Listed {
            reservation_id: e.reservation_id,
            quantity: e.quantity,
            status: status.unwrap_or_else(|| PurchaseStatus::Queued.as_str().to_string()),
        })
        .collect())
}

/// The reservation a buyer's mark names and its units: a one-unit
/// sale's mark is the id (1 unit); a list `RID:Q,...` names its last
/// (latest) entry. A list that does not parse is read as an id.
fn latest(mark: &str) -> (String, u32) {
    match Held::parse(mark).ok().and_then(|h| h.0.into_iter().last()) {
        Some(e) => (e.reservation_id, e.quantity),
        None => (mark.to_string(), 1),
    }
}

/// `GET /readyz`: 200 `{"status": "ready"}` when Redis would take a
/// purchase now (`redis_server::check_writable`: not a replica, not short
/// of replicas, not out of memory, an eviction policy that keeps the sale's
/// keys), else 503 `{"error": "unavailable", "reason": ...}` naming why
/// (`redis_unreachable`, `redis_eviction_policy`, `redis_not_writable`,
/// or `gateway_busy`: no Redis link free within three Redis timeouts; the
/// details are logged), so a load balancer stops sending purchases that
/// would all get 503 and an operator sees what to fix.
///
/// Errors: the reason Redis would not take a purchase now.
pub fn ready(reads: &Reads) -> Result<(), &'static str> {
    let checked = reads.links.with(|link| {
        let r = link.with(|con| match redis_server::check_writable(con) {
            // A broken connection: the link reconnects.
            Err(redis_server::ServerError::Redis(e)) => Err(e),
            other => Ok(other),
        });
        Ok(match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                log::warn!("not ready: {e}");
                Err(Down::of(&e).reason())
            }
            Err(Unavailable) => Err(link.down().reason()),
        })
    });
    match checked {
        Ok(r) => r,
        Err(Unavailable) => Err("gateway_busy"),
    }
}
