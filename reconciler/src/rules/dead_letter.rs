//! Owns the `dead_letter` rule: each entry of a sale's dead-letter list (as
//! [`crate::redis_read::dead_letters`] read it) becomes an observation, one
//! per entry, with the worker's reason.
//! Entries an operator action settled are no longer in the list: they were
//! moved to the archive (`dead_letter_archive.rs`), so they are not reported
//! again.

use crate::redis_read::DeadLetters;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use seckill_common::message::OrderMessage;
use serde_json::json;

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
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
