//! Owns the `dead_letter` rule of the payment queue: each entry of
//! `seckill:{payments}:dlq` (a payment or a buyer's cancellation the workers
//! gave up on, `worker/src/payments.rs`) becomes one open `dead_letter`
//! finding of "sale 0" (the payment queue names no sale, as the orphan
//! payments of `payments.rs`), with the worker's reason and the message.
//!
//! Such a finding names no reservation (the reservation is in the
//! evidence), so `resolve` offers only `--dismiss`; the entry itself is
//! settled by `dead-letter requeue payments` or `dead-letter drop payments`
//! (`cmd/payment_dlq.rs`), after which a run no longer observes it and
//! closes the finding.

use crate::review::findings::{Kind, Observation};
use crate::rules::{dead_letter::fnv1a, obs};
use seckill_common::payment::KIND_CANCEL;
use serde::Deserialize;
use serde_json::json;

/// The shape the worker writes (`seckill_common::payment::dead_letter_entry`).
#[derive(Deserialize)]
struct Entry {
    message: String,
    reason: String,
}

/// One observation per entry, head first. The subject is `payment:ID` for
/// a payment, `cancel:RESERVATION` for a cancellation, and
/// `payment-entry:<fnv1a hex>` of the entry for anything else. Entries are
/// messages the worker could not apply, often because they do not parse in
/// full, so the ids are read leniently: a `payment_id` (or, with `kind`
/// `cancel`, a `reservation_id`) of 1-64 of `A-Z a-z 0-9 _ . -` names it.
pub fn observations(entries: &[Vec<u8>]) -> Vec<Observation> {
    entries.iter().map(|raw| observation(raw)).collect()
}

fn observation(raw: &[u8]) -> Observation {
    let queue = seckill_common::payment::DEAD_LETTERS;
    let Ok(entry) = serde_json::from_slice::<Entry>(raw) else {
        return obs(
            Kind::DeadLetter,
            0,
            format!("payment-entry:{:016x}", fnv1a(raw)),
            json!({"queue": queue, "reason": "not a dead-letter entry",
                   "raw": String::from_utf8_lossy(raw)}),
        );
    };
    let message: serde_json::Value = serde_json::from_str(&entry.message).unwrap_or_default();
    let field = |name: &str| {
        message[name]
            .as_str()
            .filter(|v| seckill_common::is_valid_token(v))
            .map(str::to_string)
    };
    let is_cancel = message["kind"].as_str() == Some(KIND_CANCEL);
    let reservation = field("reservation_id");
    let subject = match (is_cancel, field("payment_id"), &reservation) {
        (false, Some(payment_id), _) => format!("payment:{payment_id}"),
        (true, _, Some(rid)) => format!("cancel:{rid}"),
        _ => format!("payment-entry:{:016x}", fnv1a(raw)),
    };
    let mut o = obs(
        Kind::DeadLetter,
        0,
        subject,
        json!({"queue": queue, "reason": entry.reason, "message": entry.message,
               "reservation_id": reservation}),
    );
    o.user_id = if is_cancel { field("user_id") } else { None };
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_common::payment::{dead_letter_entry, CancelMessage, PaymentMessage};

    const RID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn each_entry_is_one_finding_of_sale_0_named_by_what_it_carries() {
        let pay = PaymentMessage {
            v: 1,
            reservation_id: RID.into(),
            payment_id: "pay-7".into(),
            amount_cents: 1999,
            received_ms: 1_764_400_000_000,
        };
        let cancel = CancelMessage::new(4, "alice", RID, 1_764_400_000_000);
        let entries = vec![
            dead_letter_entry(pay.to_json().as_bytes(), "mysql: 1292").into_bytes(),
            dead_letter_entry(cancel.to_json().as_bytes(), "gave up").into_bytes(),
            b"junk".to_vec(),
            dead_letter_entry(br#"{"payment_id":"pay-8","received_ms":1}"#, "unparsable")
                .into_bytes(),
        ];
        let got = observations(&entries);
        type Row<'a> = (Kind, u64, &'a str, Option<&'a str>, Option<&'a str>);
        let summary: Vec<Row<'_>> = got
            .iter()
            .map(|o| {
                (
                    o.kind,
                    o.sale_id,
                    o.subject.as_str(),
                    o.reservation_id.as_deref(),
                    o.evidence["reason"].as_str(),
                )
            })
            .collect();
        let junk = format!("payment-entry:{:016x}", fnv1a(b"junk"));
        assert_eq!(
            summary,
            vec![
                (
                    Kind::DeadLetter,
                    0,
                    "payment:pay-7",
                    None,
                    Some("mysql: 1292")
                ),
                (
                    Kind::DeadLetter,
                    0,
                    &format!("cancel:{RID}")[..],
                    None,
                    Some("gave up")
                ),
                (
                    Kind::DeadLetter,
                    0,
                    &junk[..],
                    None,
                    Some("not a dead-letter entry")
                ),
                (
                    Kind::DeadLetter,
                    0,
                    "payment:pay-8",
                    None,
                    Some("unparsable")
                ),
            ]
        );
        assert_eq!(got[0].evidence["reservation_id"], RID);
        assert_eq!(got[1].user_id.as_deref(), Some("alice"));
        assert!(got.iter().all(|o| o.fixed.is_none() && !o.critical));
    }
}
