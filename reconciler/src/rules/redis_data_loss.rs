//! Owns the `redis_data_loss` rule: each run compares every sale's Redis
//! marks with MySQL's (`seckill_common::data_loss::watch_sale`, the same
//! check the workers make every 200 ms, so a loss is caught even with no
//! worker running; only for sales whose window has not been closed for a
//! minute, as the workers), and a paused sale is one critical finding (subject
//! `sale`) with the evidence, until `sale repair` resumes it. The evidence
//! names each bucket behind its marks, and every order of MySQL whose
//! reservation Redis lost (no flow record in the buyer's home bucket), the
//! buckets whose stock counter or meta is gone, when the sale was loaded,
//! and how many reservations Redis had acknowledged at the last marks
//! that MySQL holds no order of: those buyers are lost with the keys, and
//! nothing knows who they are (reservations after the last marks are
//! counted nowhere; `sale repair` cannot restore them). A sale closed for
//! a minute is not paused (no purchase can come, and its buyers keep
//! hearing 403 `sale_ended`), but one that lost its keys (sold, not
//! archived, a bucket's stock counter or meta gone) is the same finding,
//! which `sale repair` settles by rebuilding it. The
//! per-record rules are not applied to a paused sale: its Redis state is
//! known to be wrong, and the repair rebuilds it; the sale's other findings
//! are left as they are.

use crate::error::RunError;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use mysql::prelude::Queryable;
use seckill_common::buckets;
use seckill_common::data_loss::{self, SaleState};
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use serde_json::json;
use std::collections::HashSet;

/// The subject of the one finding per paused sale.
pub const SUBJECT: &str = "sale";

/// The finding for sale `sale_id` when it is (or has just been) paused;
/// `None` when Redis is consistent with MySQL.
///
/// Errors: Redis or MySQL failures.
pub fn observe(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
) -> Result<Option<Observation>, RunError> {
    // A sale closed for a minute cannot sell again: it is not paused (its
    // buyers keep hearing 403 sale_ended); only the loss of its keys is
    // reported ([`ended_loss`]), or a pause already decided.
    let open: Option<i64> = mysql.exec_first(
        "SELECT ends_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE FROM sales WHERE id = ?",
        (sale_id,),
    )?;
    if open != Some(1) && data_loss::mysql_state(mysql, sale_id)?.paused.is_none() {
        return ended_loss(redis, mysql, sale_id);
    }
    let state = data_loss::watch_sale(redis, mysql, sale_id)?;
    let (detected_by, gaps) = match state {
        SaleState::Consistent { .. } | SaleState::Absent => return Ok(None),
        SaleState::LossDetected { gaps } => (Some("reconciler"), gaps),
        SaleState::Paused { gaps, .. } => (None, gaps),
    };
    finding(redis, mysql, sale_id, detected_by, &gaps).map(Some)
}

/// The finding of ended sale `sale_id` (closed for a minute, not paused)
/// whose keys Redis lost: it was sold (MySQL records its load, marks or
/// orders), is not archived, and a bucket's stock counter or meta is gone.
/// Nothing is paused (no purchase can come); `None` otherwise.
///
/// Errors: Redis or MySQL failures.
fn ended_loss(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
) -> Result<Option<Observation>, RunError> {
    if crate::sale_read::is_archived(mysql, sale_id)? {
        return Ok(None);
    }
    let marks = data_loss::mysql_state(mysql, sale_id)?;
    let orders: Option<i64> =
        mysql.exec_first("SELECT COUNT(*) FROM orders WHERE sale_id = ?", (sale_id,))?;
    if !marks.loaded && marks.seq_high == 0 && orders.unwrap_or(0) == 0 {
        return Ok(None);
    }
    let k = data_loss::bucket_count(redis, mysql, sale_id)?;
    let gone = seckill_common::load_record::gone_buckets(redis, sale_id, k)?;
    if gone.is_empty() {
        return Ok(None);
    }
    let split = seckill_common::bucket_marks::read_split(mysql, sale_id, k)?;
    let gaps: Vec<data_loss::Gap> = gone
        .iter()
        .map(|&b| {
            let (seq_high, checkpoint_high) = match b {
                0 => (marks.seq_high, marks.checkpoint_high),
                _ => split
                    .get(b as usize - 1)
                    .map_or((0, 0), |m| (m.seq_high, m.checkpoint_high)),
            };
            data_loss::Gap {
                bucket: b,
                redis_seq: 0,
                seq_high,
                checkpoint: 0,
                checkpoint_high,
            }
        })
        .collect();
    let mut found = finding(redis, mysql, sale_id, Some("reconciler"), &gaps)?;
    found.evidence["ended"] = json!(true);
    found.evidence["paused"] = json!(null);
    Ok(Some(found))
}

/// The critical finding of sale `sale_id` with the buckets `gaps` behind;
/// `detected_by`: this run found the loss (else the pause was decided
/// before).
///
/// Errors: Redis or MySQL failures.
fn finding(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
    detected_by: Option<&str>,
    gaps: &[data_loss::Gap],
) -> Result<Observation, RunError> {
    let marks = data_loss::mysql_state(mysql, sale_id)?;
    let lost = lost_reservations(redis, mysql, sale_id)?;
    let unseen = unordered_at_last_marks(redis, mysql, sale_id, marks.seq_high)?;
    let k = data_loss::bucket_count(redis, mysql, sale_id)?;
    let gone = seckill_common::load_record::gone_buckets(redis, sale_id, k)?;
    let loaded_at = seckill_common::load_record::loaded_at_ms(mysql, sale_id)?
        .map(seckill_common::timefmt::format_ms);
    let buckets: Vec<serde_json::Value> = gaps
        .iter()
        .map(|g| {
            let ids: Vec<&str> = lost
                .iter()
                .filter(|(b, _)| *b == g.bucket)
                .map(|(_, r)| r.as_str())
                .collect();
            json!({
                "bucket": g.bucket,
                "redis_seq": g.redis_seq,
                "seq_high": g.seq_high,
                "checkpoint": g.checkpoint,
                "checkpoint_high": g.checkpoint_high,
                "lost_orders": ids.len(),
                "lost_reservation_ids": &ids[..ids.len().min(MAX_LISTED)],
            })
        })
        .collect();
    let mut evidence = json!({
        "rule": "Redis never falls behind the marks MySQL has seen",
        "seq_high": marks.seq_high,
        "checkpoint_high": marks.checkpoint_high,
        "buckets_behind": buckets,
        "lost_orders": lost.len(),
        "keys_gone_in_buckets": gone,
        "loaded_at": loaded_at,
        "orders_in_mysql": unseen.orders,
        "reserved_at_last_marks": unseen.reserved,
        "reserved_without_order_at_last_marks": unseen.reserved.saturating_sub(unseen.orders),
        "unknown": "reservations acknowledged after the last marks (all of them when no \
                    worker and no run ever saw the sale) are counted nowhere and their \
                    buyers are unknown to MySQL; the repair cannot restore them",
        "fix": format!("seckill-reconciler sale repair {sale_id} --by NAME"),
    });
    match (detected_by, marks.paused) {
        (Some(by), _) => evidence["detected_by"] = json!(by),
        (None, Some(reason)) => evidence["paused"] = json!(reason.as_str()),
        (None, None) => evidence["paused"] = json!("redis_data_loss"),
    }
    let mut found = obs(Kind::RedisDataLoss, sale_id, SUBJECT.to_string(), evidence);
    found.critical = true;
    Ok(found)
}

/// Most lost reservation ids listed per bucket in the evidence (the count
/// is always complete; the repair restores them all).
pub const MAX_LISTED: usize = 1000;

/// The orders MySQL holds whose reservation Redis lost: no flow record (nor
/// released record) in the buyer's home bucket. `(bucket, reservation id)`,
/// sorted. These are the acknowledged reservations the loss took that had
/// become orders; one lost before its worker took it has no trace but the
/// sequence mark.
///
/// Errors: Redis or MySQL failures.
fn lost_reservations(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
) -> Result<Vec<(u32, String)>, RunError> {
    let k = data_loss::bucket_count(redis, mysql, sale_id)?;
    let orders: Vec<(String, String)> = mysql.exec(
        "SELECT reservation_id, user_id FROM orders WHERE sale_id = ?",
        (sale_id,),
    )?;
    let mut held: Vec<HashSet<String>> = Vec::with_capacity(k as usize);
    for b in 0..k {
        let keys = SaleKeys::bucket(sale_id, b);
        // By `HSCAN`, never the whole hash in one call.
        let mut ids: HashSet<String> = HashSet::new();
        for key in [keys.flow(), keys.released()] {
            crate::redis_read::scan_hash(
                redis,
                &key,
                |f, _| {
                    ids.insert(String::from_utf8_lossy(f).into_owned());
                },
                || Ok::<(), redis::RedisError>(()),
            )?;
        }
        held.push(ids);
    }
    let mut lost: Vec<(u32, String)> = orders
        .into_iter()
        .filter_map(|(rid, user)| {
            let b = buckets::home_bucket(&user, k);
            (!held[b as usize].contains(&rid)).then_some((b, rid))
        })
        .collect();
    lost.sort();
    Ok(lost)
}

/// Units ever reserved at the last marks (every bucket's sequence mark)
/// and the units of the orders MySQL holds of the sale (any status: each
/// came from one reservation of as many units).
struct Unseen {
    reserved: u64,
    orders: u64,
}

/// The marks' sum over the sale's buckets (`seq_high` is bucket 0's) and
/// the sale's orders in MySQL: their difference is what Redis had
/// acknowledged at the last marks with no order yet (lost with the keys,
/// unless a worker dead-lettered it before).
///
/// Errors: Redis or MySQL failures.
fn unordered_at_last_marks(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
    seq_high: u64,
) -> Result<Unseen, RunError> {
    let k = data_loss::bucket_count(redis, mysql, sale_id)?;
    let split: u64 = seckill_common::bucket_marks::read_split(mysql, sale_id, k)?
        .iter()
        .map(|m| m.seq_high)
        .sum();
    let orders: Option<u64> = mysql.exec_first(
        "SELECT CAST(COALESCE(SUM(quantity), 0) AS UNSIGNED) FROM orders WHERE sale_id = ?",
        (sale_id,),
    )?;
    Ok(Unseen {
        reserved: seq_high + split,
        orders: orders.unwrap_or(0),
    })
}
