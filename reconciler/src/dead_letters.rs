//! Owns the `dead_letter` rule: reading a sale's dead-letter list and turning
//! each entry into an observation (one per entry, with the worker's reason).
//! Entries an operator action settled are no longer in the list: they were
//! moved to the archive (`dead_letter_archive.rs`), so they are not reported
//! again.

use crate::reconcile::obs;
use crate::redis_read;
use crate::review_findings::{Kind, Observation};
use seckill_common::dead_letter::DeadLetter;
use seckill_common::keys::SaleKeys;
use seckill_common::message::OrderMessage;
use serde_json::json;

/// A sale's dead-letter list as read.
#[derive(Debug, Default)]
pub struct DeadLetters {
    /// The entries that parse as [`DeadLetter`], head first.
    pub entries: Vec<DeadLetter>,
    /// Anything else pushed onto the list (lossy UTF-8).
    pub foreign: Vec<String>,
}

/// Reads the dead-letter list of `sale_id` ([`redis_read::LIST_CHUNK`] at a
/// time).
pub fn read(con: &mut redis::Connection, sale_id: u64) -> redis::RedisResult<DeadLetters> {
    let mut out = DeadLetters::default();
    redis_read::for_each_in_list(con, &SaleKeys::new(sale_id).dead_letter(), |raw| {
        match DeadLetter::parse(raw) {
            Some(d) => out.entries.push(d),
            None => out.foreign.push(String::from_utf8_lossy(raw).into_owned()),
        }
    })?;
    Ok(out)
}

/// One `dead_letter` observation per entry. The subject is the reservation
/// id, or `entry:<fnv1a hex>` of the text for an entry without one.
pub fn observations(sale_id: u64, dead: DeadLetters) -> Vec<Observation> {
    let mut out = Vec::with_capacity(dead.entries.len() + dead.foreign.len());
    for d in dead.entries {
        let subject = d
            .reservation_id
            .clone()
            .unwrap_or_else(|| format!("entry:{:016x}", fnv1a(d.message.as_bytes())));
        let mut o = obs(
            Kind::DeadLetter,
            sale_id,
            subject,
            json!({"reason": d.reason, "attempts": d.attempts, "worker": d.worker,
                   "at_ms": d.at_ms, "message": d.message}),
        );
        o.user_id = OrderMessage::parse(d.message.as_bytes())
            .ok()
            .map(|m| m.user_id);
        o.reservation_id = d.reservation_id;
        out.push(o);
    }
    for raw in dead.foreign {
        out.push(obs(
            Kind::DeadLetter,
            sale_id,
            format!("entry:{:016x}", fnv1a(raw.as_bytes())),
            json!({"reason": "not a dead-letter entry", "raw": raw}),
        ));
    }
    out
}

/// FNV-1a, 64 bits: a stable name for a dead-letter entry without an id
/// (std's hasher is not stable across Rust releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
