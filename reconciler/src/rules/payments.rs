//! Owns the payment rules: every payment the worker did not apply as
//! `paid` (`payments.outcome`, `seckill_common::lifecycle::PaymentOutcome`)
//! is one open finding for a person, keyed by the payment id, with the
//! payment as evidence: `late_payment` (received after `pay_by`: refund,
//! or re-create the order by hand if stock allows),
//! `payment_after_cancellation` (the buyer cancelled before the payment
//! was applied: refund), `payment_amount_mismatch` (the order stays
//! pending; the evidence holds `expected_cents`, the sale's price times
//! the order's quantity, beside the `amount_cents` paid),
//! `payment_unknown_reservation`, `payment_not_payable` (paid
//! twice: refund). A `payment_id` delivered again for another reservation
//! or amount is one `payment_conflict` per distinct delivery (keyed
//! `PAYMENT_ID/RESERVATION/AMOUNT`), with the first payment, which stands,
//! in the evidence: the payment service reused an id, or a message was
//! forged or corrupted; a person checks with the payment service.

use crate::mysql_read::OddPayment;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use seckill_common::lifecycle::PaymentOutcome;
use serde_json::json;
use std::str::FromStr;

/// The finding kind of a payment outcome; `None` for `paid`.
fn kind(outcome: &str) -> Option<Kind> {
    match PaymentOutcome::from_str(outcome) {
        // Dropped: an operator's decision, on record in the audit log.
        Ok(PaymentOutcome::Paid | PaymentOutcome::Dropped) => None,
        Ok(PaymentOutcome::Late) => Some(Kind::LatePayment),
        Ok(PaymentOutcome::AfterCancellation) => Some(Kind::PaymentAfterCancellation),
        Ok(PaymentOutcome::AmountMismatch) => Some(Kind::PaymentAmountMismatch),
        Ok(PaymentOutcome::UnknownReservation) => Some(Kind::PaymentUnknownReservation),
        // Anything else this build does not know is a payment not applied.
        Ok(PaymentOutcome::NotPayable) | Err(_) => Some(Kind::PaymentNotPayable),
    }
}

/// One observation per odd payment of sale `sale_id` (0: of no known sale).
pub fn observe(sale_id: u64, payments: &[OddPayment]) -> Vec<Observation> {
    payments
        .iter()
        .filter_map(|p| {
            let mut o = match &p.conflicts_with {
                Some((first_rid, first_amount)) => obs(
                    Kind::PaymentConflict,
                    sale_id,
                    format!("{}/{}/{}", p.payment_id, p.reservation_id, p.amount_cents),
                    json!({"payment_id": p.payment_id, "reservation_id": p.reservation_id,
                           "amount_cents": p.amount_cents, "received_ms": p.received_ms,
                           "first": {"reservation_id": first_rid,
                                     "amount_cents": first_amount, "outcome": p.outcome}}),
                ),
                None => {
                    let kind = kind(&p.outcome)?;
                    let mut evidence = json!({"payment_id": p.payment_id,
                           "reservation_id": p.reservation_id,
                           "amount_cents": p.amount_cents, "outcome": p.outcome,
                           "received_ms": p.received_ms});
                    if let (Kind::PaymentAmountMismatch, Some(due)) = (kind, p.expected_cents) {
                        evidence["expected_cents"] = json!(due);
                    }
                    obs(kind, sale_id, p.payment_id.clone(), evidence)
                }
            };
            o.reservation_id = Some(p.reservation_id.clone());
            o.user_id.clone_from(&p.user_id);
            Some(o)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stored_outcome_is_its_own_finding_kind() {
        let odd = |id: &str, outcome: &str| OddPayment {
            payment_id: id.into(),
            reservation_id: "0123456789abcdef0123456789abcdef".into(),
            amount_cents: 1999,
            outcome: outcome.into(),
            received_ms: 1_764_400_000_000,
            conflicts_with: None,
            user_id: Some("u1".into()),
            expected_cents: Some(3998),
        };
        let found = observe(
            7,
            &[
                odd("a", "paid"),
                odd("b", "late_payment"),
                odd("c", "payment_after_cancellation"),
                odd("d", "payment_amount_mismatch"),
                odd("e", "unknown_reservation"),
                odd("f", "not_payable"),
                odd("g", "from_a_newer_build"),
            ],
        );
        let d = &found[2];
        assert_eq!(d.evidence["expected_cents"], 3998);
        assert_eq!(d.evidence["amount_cents"], 1999);
        assert!(found[0].evidence.get("expected_cents").is_none());
        assert!(found.iter().all(|o| o.user_id.as_deref() == Some("u1")));
        let kinds: Vec<(String, Kind)> = found.into_iter().map(|o| (o.subject, o.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("b", Kind::LatePayment),
                ("c", Kind::PaymentAfterCancellation),
                ("d", Kind::PaymentAmountMismatch),
                ("e", Kind::PaymentUnknownReservation),
                ("f", Kind::PaymentNotPayable),
                ("g", Kind::PaymentNotPayable),
            ]
            .map(|(s, k)| (s.to_string(), k))
        );
    }
}
