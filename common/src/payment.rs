//! Owns a payment on its way from the payment service to MySQL: the
//! signature check of `POST /v1/payments` (HMAC-SHA256 over
//! `TIMESTAMP.BODY`, header `t=TIMESTAMP,v1=HEX`, in the manner of the
//! common payment-provider webhooks; a timestamp outside the tolerance is
//! refused, so a captured request cannot be replayed later, and one
//! replayed inside it is the same `payment_id`, applied once), the queued
//! message, and the Redis keys of the payment queue.
//!
//! The same queue carries the buyer's cancellations
//! (`DELETE /v1/sales/{id}/purchases/me`, [`CancelMessage`]): the gateway
//! is Redis-only, and a cancellation needs the same durability on its way
//! to MySQL. [`Queued::parse`] tells the two apart by the field `kind`
//! (absent in a payment, `cancel` in a cancellation).
//!
//! The queue follows the order queue's rules: `LPUSH` into
//! [`QUEUE`], a worker `BLMOVE`s into its own processing list
//! ([`processing`]) and removes the message only after MySQL committed;
//! failures are counted in [`ATTEMPTS`] and after the worker's max attempts
//! the message goes to [`DEAD_LETTERS`].

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;

/// The list payments wait in (global: a payment names no sale). Every
/// payments key carries the hash tag `{payments}`, so that on a Redis
/// Cluster the queue, the processing lists, attempts and dead letters share
/// one slot and each `BLMOVE`/`MULTI` over them stays on one master.
pub const QUEUE: &str = "seckill:{payments}";
/// Hash payment id -> failed applications so far.
pub const ATTEMPTS: &str = "seckill:{payments}:attempts";
/// The payments' dead-letter list (JSON: message, reason).
pub const DEAD_LETTERS: &str = "seckill:{payments}:dlq";
/// Hash action mark (`ACTION_ID@TIME`) -> JSON `{"entry", "action",
/// "actor", "at"}`: each dead letter an operator requeued or dropped
/// (`seckill-reconciler dead-letter requeue|drop payments`), written in the
/// same script as its removal, so nothing is lost and an interrupted action
/// can tell whether its effect happened.
pub const DEAD_LETTERS_SETTLED: &str = "seckill:{payments}:dlq:settled";

/// The processing list of worker `worker_id` for payments.
pub fn processing(worker_id: &str) -> String {
    format!("seckill:{{payments}}:processing:{worker_id}")
}

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Seckill-Signature";

/// Why a signature was refused (the gateway answers 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// No header, or not `t=DIGITS,v1=HEX`.
    Malformed,
    /// The timestamp is further than the tolerance from now (seconds off).
    OutsideTolerance(i64),
    /// The MAC does not match.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::Malformed => write!(f, "signature header malformed"),
            SignatureError::OutsideTolerance(s) => {
                write!(f, "signature timestamp {s} s away from now")
            }
            SignatureError::Mismatch => write!(f, "signature does not match"),
        }
    }
}

impl std::error::Error for SignatureError {}

/// The `v1` value for `body` sent at `timestamp_s`: lowercase hex of
/// HMAC-SHA256(secret, "TIMESTAMP." + body).
pub fn sign(secret: &[u8], timestamp_s: u64, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn mac(secret: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length, so this cannot fail.
    <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!())
}

/// Checks `header` (`t=TIMESTAMP,v1=HEX`; several `v1` allowed, one must
/// match) for `body` against `secret`, with `now_s` and `tolerance_s`
/// (seconds either way). The comparison is constant-time.
///
/// Errors: [`SignatureError`].
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now_s: u64,
    tolerance_s: u64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Malformed)?;
    let mut t: Option<u64> = None;
    let mut sigs: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                t = Some(v.parse().map_err(|_| SignatureError::Malformed)?)
            }
            Some(("v1", v)) => sigs.push(hex(v).ok_or(SignatureError::Malformed)?),
            _ => {}
        }
    }
    let t = t.ok_or(SignatureError::Malformed)?;
    if sigs.is_empty() {
        return Err(SignatureError::Malformed);
    }
    let off = now_s as i64 - t as i64;
    if off.unsigned_abs() > tolerance_s {
        return Err(SignatureError::OutsideTolerance(off));
    }
    for s in sigs {
        let mut m = mac(secret);
        m.update(t.to_string().as_bytes());
        m.update(b".");
        m.update(body);
        if m.verify_slice(&s).is_ok() {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The body of `POST /v1/payments`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentRequest {
    /// The reservation paid for (32 lowercase hex digits).
    pub reservation_id: String,
    /// The payment service's id (1-64 of `A-Z a-z 0-9 _ . -`).
    pub payment_id: String,
    /// Amount paid, integer cents.
    pub amount_cents: u64,
}

/// A payment as queued for the workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentMessage {
    /// Format version, 1.
    pub v: u32,
    /// See [`PaymentRequest`].
    pub reservation_id: String,
    /// See [`PaymentRequest`].
    pub payment_id: String,
    /// See [`PaymentRequest`].
    pub amount_cents: u64,
    /// When the gateway received it, Unix ms by Redis's clock (the
    /// receipt script's `TIME`, `crate::receipt`): compared with `pay_by`.
    pub received_ms: u64,
}

impl PaymentMessage {
    /// The queued JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a queued message; checks the ids' shapes.
    ///
    /// Errors: not JSON of this shape, or an id of the wrong shape.
    pub fn parse(raw: &[u8]) -> Result<PaymentMessage, String> {
        let m: PaymentMessage = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        if m.v != 1
            || !crate::ids::is_valid_reservation_id(&m.reservation_id)
            || !crate::is_valid_token(&m.payment_id)
        {
            return Err("bad version or id".into());
        }
        // Redis's clock wrote it (the receipt script); a time MySQL's FROM_UNIXTIME cannot
        // take (error 1292, retried in vain) or one before this system
        // existed (it would count as paid in time) is not one of ours.
        if !RECEIVED_MS_RANGE.contains(&m.received_ms) {
            return Err(format!(
                "received_ms {} outside {RECEIVED_MS_RANGE:?}",
                m.received_ms
            ));
        }
        Ok(m)
    }

    /// The payment for `lifecycle::pay`.
    pub fn payment(&self) -> crate::lifecycle::Payment {
        crate::lifecycle::Payment {
            payment_id: self.payment_id.clone(),
            reservation_id: self.reservation_id.clone(),
            amount_cents: self.amount_cents,
            received_ms: self.received_ms,
        }
    }
}

/// The receipt times a queued payment may carry, Unix ms: from
/// 2020-01-01 to MariaDB's `FROM_UNIXTIME` limit (2038-01-19).
pub const RECEIVED_MS_RANGE: std::ops::RangeInclusive<u64> = 1_577_836_800_000..=2_147_483_647_000;

/// The `kind` of a queued cancellation.
pub const KIND_CANCEL: &str = "cancel";

/// A buyer's cancellation as queued for the workers (the worker calls
/// `lifecycle::cancel`, then does the release's Redis step).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelMessage {
    /// Format version, 1.
    pub v: u32,
    /// Always [`KIND_CANCEL`].
    pub kind: String,
    /// The sale.
    pub sale_id: u64,
    /// The buyer (the token's `sub`).
    pub user_id: String,
    /// The reservation the gateway found for the buyer (for the logs and
    /// the attempt count; MySQL cancels the buyer's pending order, in a
    /// sale of several units per buyer the order of this reservation).
    pub reservation_id: String,
    /// When the gateway received it, Unix ms.
    pub received_ms: u64,
}

impl CancelMessage {
    /// A cancellation of `user_id`'s order `reservation_id` in `sale_id`.
    pub fn new(sale_id: u64, user_id: &str, reservation_id: &str, received_ms: u64) -> Self {
        CancelMessage {
            v: 1,
            kind: KIND_CANCEL.to_string(),
            sale_id,
            user_id: user_id.to_string(),
            reservation_id: reservation_id.to_string(),
            received_ms,
        }
    }

    /// The queued JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One message of the payment queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// A payment from the payment service.
    Payment(PaymentMessage),
    /// A buyer's cancellation.
    Cancel(CancelMessage),
}

#[derive(Deserialize)]
struct KindOnly {
    #[serde(default)]
    kind: Option<String>,
}

impl Queued {
    /// Reads a queued message of either kind; checks the ids' shapes.
    ///
    /// Errors: not JSON of either shape, an unknown `kind`, an id of the
    /// wrong shape.
    pub fn parse(raw: &[u8]) -> Result<Queued, String> {
        let k: KindOnly = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        match k.kind.as_deref() {
            None => PaymentMessage::parse(raw).map(Queued::Payment),
            Some(KIND_CANCEL) => {
                let m: CancelMessage = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
                if m.v != 1
                    || m.sale_id == 0
                    || !crate::ids::is_valid_reservation_id(&m.reservation_id)
                    || !crate::is_valid_token(&m.user_id)
                {
                    return Err("bad version or id".into());
                }
                Ok(Queued::Cancel(m))
            }
            Some(other) => Err(format!("unknown kind {other:?}")),
        }
    }

    /// The field of [`ATTEMPTS`] that counts this message's failures: the
    /// payment id, or `cancel:RESERVATION` (a payment id never holds `:`).
    pub fn attempts_field(&self) -> String {
        match self {
            Queued::Payment(m) => m.payment_id.clone(),
            Queued::Cancel(m) => format!("cancel:{}", m.reservation_id),
        }
    }
}

/// Queues a cancellation durably (`LPUSH` [`QUEUE`]).
///
/// Errors: Redis failures (a repeat is harmless: a second cancellation of
/// an order no longer pending changes nothing).
pub fn enqueue_cancel<C: redis::ConnectionLike>(
    con: &mut C,
    m: &CancelMessage,
) -> redis::RedisResult<()> {
    redis::cmd("LPUSH").arg(QUEUE).arg(m.to_json()).query(con)
}

/// Receives payment `m` and queues it durably, with its receipt, in one
/// script (`crate::receipt::receive`: `m.received_ms` is replaced by
/// Redis's clock). Returns the message as queued.
///
/// Errors: Redis failures (nothing queued, or unknown on a broken
/// connection: a repeat is the same `payment_id`, applied once).
pub fn enqueue<C: redis::ConnectionLike>(
    con: &mut C,
    m: &PaymentMessage,
) -> redis::RedisResult<PaymentMessage> {
    crate::receipt::receive(con, m)
}

/// A dead-letter entry of the payment queue: JSON `{"message", "reason"}`
/// (the message as lossy UTF-8).
pub fn dead_letter_entry(raw: &[u8], reason: &str) -> String {
    serde_json::json!({"message": String::from_utf8_lossy(raw), "reason": reason}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_tells_payments_from_cancellations() {
        let rid = "0123456789abcdef0123456789abcdef";
        let p = PaymentMessage {
            v: 1,
            reservation_id: rid.into(),
            payment_id: "pay-1".into(),
            amount_cents: 5,
            received_ms: 1_764_400_000_000,
        };
        assert_eq!(
            Queued::parse(p.to_json().as_bytes()),
            Ok(Queued::Payment(p.clone()))
        );
        let c = CancelMessage::new(7, "alice", rid, 9);
        let q = Queued::parse(c.to_json().as_bytes()).unwrap();
        assert_eq!(q.attempts_field(), format!("cancel:{rid}"));
        assert_eq!(q, Queued::Cancel(c));
        assert!(Queued::parse(br#"{"kind":"refund"}"#).is_err());
        let bad = CancelMessage::new(7, "a b", rid, 9);
        assert!(Queued::parse(bad.to_json().as_bytes()).is_err());
        for at in [0, 1_577_836_799_999, 2_147_483_647_001, u64::MAX] {
            let odd = PaymentMessage {
                received_ms: at,
                ..p.clone()
            };
            assert_eq!(
                Queued::parse(odd.to_json().as_bytes()),
                Err(format!("received_ms {at} outside {:?}", RECEIVED_MS_RANGE)),
            );
        }
    }

    #[test]
    fn a_signature_is_checked_for_body_timestamp_and_secret() {
        let body = br#"{"reservation_id":"x","payment_id":"p","amount_cents":1}"#;
        let sig = sign(b"s3cret", 1_000, body);
        let h = format!("t=1000,v1={sig}");
        assert_eq!(verify(b"s3cret", Some(&h), body, 1_100, 300), Ok(()));
        assert_eq!(
            verify(b"other", Some(&h), body, 1_100, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"s3cret", Some(&h), b"{}", 1_100, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"s3cret", Some(&h), body, 1_301, 300),
            Err(SignatureError::OutsideTolerance(301))
        );
        for bad in ["", "t=1000", "v1=00", "t=x,v1=00", "t=1000,v1=zz"] {
            assert_eq!(
                verify(b"s3cret", Some(bad), body, 1_000, 300),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        assert_eq!(
            verify(b"s3cret", None, body, 1_000, 300),
            Err(SignatureError::Malformed)
        );
    }
}
