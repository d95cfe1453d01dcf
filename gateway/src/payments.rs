//! Owns what the two lifecycle routes that write do, as outcomes
//! ([`Paid`], [`Cancelled`]) that `http/` says: `POST /v1/payments` (the
//! payment service reports a payment: the signature check of
//! `seckill_common::payment`, the strict body, then the durable queue for
//! the workers) and `DELETE /v1/sales/{sale_id}/purchases/me` (the buyer
//! cancels an unpaid order: queued for the workers on the same queue).
//! The gateway stays Redis-only: MySQL decides both, in the worker.
//!
//! `POST /v1/payments`: no `SECKILL_PAYMENT_SECRET` → 503
//! `payments_not_configured`; a missing, malformed or wrong signature →
//! 401 `bad_signature`; a timestamp further than
//! `SECKILL_PAYMENT_TOLERANCE` from now → 401 `signature_expired`; a body
//! that is not exactly `{"reservation_id", "payment_id", "amount_cents"}`
//! with ids of the right shape → 400 `invalid_request`; else received and
//! queued → 202, by one script that also records the receipt with Redis's
//! time (`seckill_common::receipt`: that time, at or before `pay_by`, is
//! what makes the payment in time, whenever a worker applies it).
//! The signature is checked before the body is read as JSON, so an
//! unsigned body learns nothing. A reservation id the system never issued
//! cannot be told apart in Redis cheaply (a reservation id names no sale),
//! so it is queued too, and the worker records it (`payments.outcome =
//! unknown_reservation`, nothing else changes). A replay inside the
//! tolerance is the same `payment_id`: one payment (MySQL's `payments`
//! key).
//!
//! `DELETE .../purchases/me` reads the buyer's reservation and its status
//! from Redis: `pending_payment` → the cancellation is queued, 202
//! `{"reservation_id", "status": "pending_payment", "cancellation":
//! "queued"}`; `cancelled` → 202 with that status (a repeat); no purchase
//! → 404 `purchase_not_found`; any other status (`queued`: not an order
//! yet, retry; `paid`, `expired`, `confirmed`, `failed`) → 409
//! `not_cancellable` with the status, nothing changed. The worker's MySQL
//! step decides: an order paid or expired meanwhile stays so.

use crate::config::PaymentSettings;
use crate::purchase::home::BucketCounts;
use crate::redis::link::{LinkPool, Unavailable};
use seckill_common::keys::PurchaseStatus;
use seckill_common::payment::{
    self, CancelMessage, PaymentMessage, PaymentRequest, SignatureError,
};
use std::sync::Arc;

/// What the payment routes borrow.
pub struct Payments {
    /// `SECKILL_PAYMENT_SECRET` and `SECKILL_PAYMENT_TOLERANCE`.
    pub settings: PaymentSettings,
    /// The shared Redis links.
    pub links: Arc<LinkPool>,
    /// Each sale's number of buckets (a buyer's home bucket).
    pub buckets: Arc<BucketCounts>,
}

/// What a reported payment came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paid {
    /// Queued for the workers (its `payment_id`).
    Queued(String),
    /// No `SECKILL_PAYMENT_SECRET`.
    NotConfigured,
    /// A missing, malformed or wrong signature.
    BadSignature,
    /// A signature timestamp outside the tolerance.
    SignatureExpired,
    /// The body is refused (the detail).
    Invalid(&'static str),
    /// Redis could not be reached in time.
    Unavailable,
}

/// What a buyer's cancellation came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// The order awaited payment: its cancellation is queued.
    Queued(String),
    /// Already cancelled (a repeat).
    Already(String),
    /// In another status: nothing changed (the reservation, the status).
    NotCancellable(String, String),
    /// The buyer holds no purchase.
    NotFound,
    /// Redis could not be reached in time.
    Unavailable,
}

const EXPECTED: &str = "expected {\"reservation_id\": \"<32 hex>\", \"payment_id\": \"...\", \"amount_cents\": <integer>} and no other field";

/// `POST /v1/payments` with its raw `body` and the value of its
/// `Seckill-Signature` header (see the module doc for the answers).
pub fn pay(payments: &Payments, signature: Option<&str>, body: &[u8]) -> Paid {
    let Some(secret) = &payments.settings.secret else {
        return Paid::NotConfigured;
    };
    let now_ms = seckill_common::now_ms();
    match payment::verify(
        &secret.0,
        signature,
        body,
        now_ms / 1000,
        payments.settings.tolerance_s,
    ) {
        Ok(()) => {}
        Err(SignatureError::OutsideTolerance(off)) => {
            log::info!("payment refused: signature timestamp {off} s off");
            return Paid::SignatureExpired;
        }
        Err(e) => {
            log::info!("payment refused: {e}");
            return Paid::BadSignature;
        }
    }
    let req = match parse_body(body) {
        Ok(r) => r,
        Err(detail) => return Paid::Invalid(detail),
    };
    let m = PaymentMessage {
        v: 1,
        reservation_id: req.reservation_id,
        payment_id: req.payment_id,
        amount_cents: req.amount_cents,
        // Replaced by Redis's clock in the receipt script.
        received_ms: now_ms,
    };
    match payments
        .links
        .with(|link| link.with(|con| payment::enqueue(con, &m)))
    {
        Ok(m) => Paid::Queued(m.payment_id),
        Err(Unavailable) => Paid::Unavailable,
    }
}

/// Reads a payment body strictly.
///
/// Errors: the detail of the 400 `invalid_request`.
fn parse_body(body: &[u8]) -> Result<PaymentRequest, &'static str> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(EXPECTED);
    }
    let r: PaymentRequest = serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Eof => "truncated JSON",
            Category::Syntax | Category::Io => "malformed JSON",
            Category::Data => EXPECTED,
        }
    })?;
    if !seckill_common::ids::is_valid_reservation_id(&r.reservation_id) {
        return Err("reservation_id must be 32 lowercase hex digits");
    }
    if !seckill_common::is_valid_token(&r.payment_id) {
        return Err(concat!(
            "payment_id must be ",
            seckill_common::token_rule!()
        ));
    }
    Ok(r)
}

/// `DELETE /v1/sales/{sale_id}/purchases/me` of the buyer `user`, whose
/// token `http/` has checked (see the module doc).
pub fn cancel(payments: &Payments, sale_id: u64, user: &str) -> Cancelled {
    let Ok((k, _)) = payments.buckets.home(&payments.links, sale_id, user) else {
        return Cancelled::Unavailable;
    };
    let found = payments.links.with(|link| {
        let rid = link.with(|con| {
            redis::cmd("HGET")
                .arg(k.buyers())
                .arg(user)
                .query::<Option<String>>(con)
        })?;
        // A sale of several units per buyer keeps a list `RID:Q,...`:
        // the status read and the cancellation both name its latest.
        let Some(rid) = rid.map(|mark| crate::queries::latest(&mark).0) else {
            return Ok(None);
        };
        let status = link.with(|con| {
            redis::cmd("HGET")
                .arg(k.status())
                .arg(&rid)
                .query::<Option<String>>(con)
        })?;
        let status = status.unwrap_or_else(|| PurchaseStatus::Queued.as_str().to_string());
        if status == PurchaseStatus::PendingPayment.as_str() {
            let m = CancelMessage::new(sale_id, user, &rid, seckill_common::now_ms());
            link.with(|con| payment::enqueue_cancel(con, &m))?;
        }
        Ok(Some((rid, status)))
    });
    match found {
        Ok(Some((rid, status))) if status == PurchaseStatus::PendingPayment.as_str() => {
            Cancelled::Queued(rid)
        }
        Ok(Some((rid, status))) if status == PurchaseStatus::Cancelled.as_str() => {
            Cancelled::Already(rid)
        }
        Ok(Some((rid, status))) => Cancelled::NotCancellable(rid, status),
        Ok(None) => Cancelled::NotFound,
        Err(Unavailable) => Cancelled::Unavailable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(body: &str) -> String {
        parse_body(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn a_payment_body_is_read_strictly() {
        let rid = "0123456789abcdef0123456789abcdef";
        let ok = format!(r#"{{"reservation_id":"{rid}","payment_id":"p-1","amount_cents":1999}}"#);
        assert_eq!(parse_body(ok.as_bytes()).unwrap().amount_cents, 1999);
        assert_eq!(detail(r#"{"reservation_id":"#), "truncated JSON");
        assert_eq!(detail("{x}"), "malformed JSON");
        for b in [
            "[]".to_string(),
            "{}".to_string(),
            format!(r#"{{"reservation_id":"{rid}","payment_id":"p","amount_cents":-1}}"#),
            format!(r#"{{"reservation_id":"{rid}","payment_id":"p","amount_cents":1,"x":1}}"#),
        ] {
            assert_eq!(detail(&b), EXPECTED, "{b}");
        }
        assert!(
            detail(r#"{"reservation_id":"ABC","payment_id":"p","amount_cents":1}"#)
                .starts_with("reservation_id")
        );
        let bad_pid =
            format!(r#"{{"reservation_id":"{rid}","payment_id":"a b","amount_cents":1}}"#);
        assert!(detail(&bad_pid).starts_with("payment_id"));
    }
}
