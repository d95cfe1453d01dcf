//! Owns what each domain outcome is as an HTTP answer: a purchase's
//! [`Decision`], a refused identity, a sale and a purchase status read,
//! readiness, a payment and a cancellation. The status codes and error
//! codes of the API (docs/openapi.yaml) live here and in `reply.rs` only.

use crate::admission::credentials::Refused;
use crate::admission::identity::Denied;
use crate::http::reply::Reply;
use crate::payments::{Cancelled, Paid};
use crate::purchase::soldout::Closed;
use crate::purchase::Decision;
use crate::queries::{SaleView, Status};
use crate::redis::link::Unavailable;
use seckill_common::keys::PurchaseStatus;
use seckill_common::timefmt::format_ms;
use serde_json::json;

/// The answer to a purchase.
pub fn purchase(d: &Decision) -> Reply {
    match d {
        Decision::Reserved(rid) => Reply::object(
            202,
            &[
                ("reservation_id", rid),
                ("status", PurchaseStatus::Queued.as_str()),
            ],
        ),
        Decision::AlreadyPurchased(rid) => Reply::object(
            409,
            &[("error", "already_purchased"), ("reservation_id", rid)],
        ),
        Decision::NotEnoughStock(left) => Reply::json(
            410,
            json!({ "error": "not_enough_stock", "units_left": left }),
        ),
        Decision::LimitReached(held) => Reply::json(
            409,
            json!({
                "error": "limit_reached",
                "reservations": held.0.iter().map(|e| json!({
                    "reservation_id": e.reservation_id,
                    "quantity": e.quantity,
                })).collect::<Vec<_>>(),
            }),
        ),
        Decision::AboveMax(q) => Reply::json(
            400,
            json!({
                "error": "invalid_request",
                "detail": format!("quantity is above this sale's limit per purchase ({q})"),
                "max_per_purchase": q,
            }),
        ),
        Decision::KeyReused(rid) => Reply::json(
            422,
            json!({
                "error": "idempotency_key_reused",
                "detail": "this Idempotency-Key was used for a purchase of another quantity",
                "reservation_id": rid,
            }),
        ),
        Decision::KeyRequired => Reply::json(
            400,
            json!({
                "error": "idempotency_key_required",
                "detail": "this sale sells more than one unit per buyer: send an Idempotency-Key header",
            }),
        ),
        Decision::NotStarted => Reply::error(403, "sale_not_started"),
        Decision::Paused => Reply::sale_paused(),
        Decision::Closed(Closed::SoldOut) => Reply::error(410, "sold_out"),
        Decision::Closed(Closed::Ended) => Reply::error(403, "sale_ended"),
        Decision::Closed(Closed::Unknown) => Reply::sale_not_found(),
        Decision::Unavailable => Reply::unavailable(),
        Decision::Overloaded => Reply::overloaded(),
        Decision::TooManyRequests => Reply::too_many_requests(),
        Decision::Invalid(detail) => Reply::invalid(detail),
        Decision::Denied(d) => denied(*d),
    }
}

/// The answer to a request that may not act as the buyer it names.
pub fn denied(d: Denied) -> Reply {
    match d {
        Denied::Token(r) => refused(r),
        Denied::UserMismatch => Reply::error(403, "user_mismatch"),
        Denied::NoUser => Reply::invalid("no user_id"),
    }
}

/// The 401 for a refused token, with `WWW-Authenticate: Bearer` (RFC 6750
/// §3).
pub fn refused(r: Refused) -> Reply {
    let (code, challenge) = match r {
        Refused::Invalid => (
            "invalid_token",
            r#"Bearer realm="seckill", error="invalid_token""#,
        ),
        Refused::Expired => (
            "token_expired",
            r#"Bearer realm="seckill", error="invalid_token", error_description="expired""#,
        ),
    };
    let mut reply = Reply::error(401, code);
    reply.extra = Some(("WWW-Authenticate", challenge));
    reply
}

/// `GET /v1/sales/{sale_id}`; times are RFC 3339 UTC.
pub fn sale(sale_id: u64, view: Result<SaleView, Unavailable>) -> Reply {
    match view {
        Ok(SaleView::NotFound) => Reply::sale_not_found(),
        Ok(SaleView::PausedWithoutMeta) => Reply::sale_paused(),
        Ok(SaleView::Archived {
            stock_left,
            starts,
            ends,
            archived_at,
        }) => Reply::json(
            200,
            json!({
                "sale_id": sale_id,
                "stock_remaining": stock_left,
                "starts_at": format_ms(starts),
                "ends_at": format_ms(ends),
                "state": "ended",
                "archived_at": format_ms(archived_at),
            }),
        ),
        Ok(SaleView::Live {
            stock,
            starts,
            ends,
            state,
        }) => Reply::json(
            200,
            json!({
                "sale_id": sale_id,
                "stock_remaining": stock,
                "starts_at": format_ms(starts),
                "ends_at": format_ms(ends),
                "state": state,
            }),
        ),
        Err(Unavailable) => Reply::unavailable(),
    }
}

/// `GET /v1/sales/{sale_id}/purchases/{user_id}` (and `/me`).
pub fn status(found: Result<Option<Status>, Unavailable>) -> Reply {
    match found {
        Ok(Some(s)) => {
            let mut body = json!({
                "reservation_id": s.reservation_id,
                "status": s.status,
                "quantity": s.quantity,
            });
            if let Some(ms) = s.pay_by {
                body["pay_by"] = json!(format_ms(ms));
            }
            if let Some(list) = s.reservations {
                body["reservations"] = list
                    .into_iter()
                    .map(|r| {
                        json!({"reservation_id": r.reservation_id, "quantity": r.quantity,
                               "status": r.status})
                    })
                    .collect();
            }
            Reply::json(200, body)
        }
        Ok(None) => Reply::error(404, "purchase_not_found"),
        Err(Unavailable) => Reply::unavailable(),
    }
}

/// `GET /readyz`.
pub fn ready(r: Result<(), &'static str>) -> Reply {
    match r {
        Ok(()) => Reply::json(200, json!({ "status": "ready" })),
        Err(reason) => Reply::not_ready(reason),
    }
}

/// `POST /v1/payments`.
pub fn paid(p: Paid) -> Reply {
    match p {
        Paid::Queued(payment_id) => {
            Reply::json(202, json!({ "payment_id": payment_id, "status": "queued" }))
        }
        Paid::NotConfigured => Reply::error(503, "payments_not_configured"),
        Paid::BadSignature => Reply::error(401, "bad_signature"),
        Paid::SignatureExpired => Reply::error(401, "signature_expired"),
        Paid::Invalid(detail) => Reply::invalid(detail),
        Paid::Unavailable => Reply::unavailable(),
    }
}

/// `DELETE /v1/sales/{sale_id}/purchases/me`.
pub fn cancelled(c: Cancelled) -> Reply {
    let pending = PurchaseStatus::PendingPayment.as_str();
    match c {
        Cancelled::Queued(rid) => Reply::json(
            202,
            json!({ "reservation_id": rid, "status": pending, "cancellation": "queued" }),
        ),
        Cancelled::Already(rid) => Reply::json(
            202,
            json!({ "reservation_id": rid, "status": PurchaseStatus::Cancelled.as_str() }),
        ),
        Cancelled::NotCancellable(rid, status) => Reply::json(
            409,
            json!({ "error": "not_cancellable", "reservation_id": rid, "status": status }),
        ),
        Cancelled::NotFound => Reply::error(404, "purchase_not_found"),
        Cancelled::Unavailable => Reply::unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(r: &Reply) -> serde_json::Value {
        serde_json::from_str(&r.body).unwrap()
    }

    #[test]
    fn each_purchase_decision_is_its_documented_answer() {
        let rid = "0123456789abcdef0123456789abcdef".to_string();
        let cases: Vec<(Decision, u16, &str)> = vec![
            (
                Decision::AlreadyPurchased(rid.clone()),
                409,
                "already_purchased",
            ),
            (Decision::NotStarted, 403, "sale_not_started"),
            (Decision::Paused, 503, "sale_paused"),
            (Decision::Closed(Closed::SoldOut), 410, "sold_out"),
            (Decision::Closed(Closed::Ended), 403, "sale_ended"),
            (Decision::Closed(Closed::Unknown), 404, "sale_not_found"),
            (Decision::Unavailable, 503, "unavailable"),
            (Decision::Overloaded, 503, "overloaded"),
            (Decision::TooManyRequests, 429, "too_many_requests"),
            (Decision::Invalid("empty body"), 400, "invalid_request"),
            (Decision::Denied(Denied::UserMismatch), 403, "user_mismatch"),
            (
                Decision::Denied(Denied::Token(Refused::Invalid)),
                401,
                "invalid_token",
            ),
            (
                Decision::Denied(Denied::Token(Refused::Expired)),
                401,
                "token_expired",
            ),
        ];
        for (d, status, code) in cases {
            let r = purchase(&d);
            assert_eq!(
                (r.status, body(&r)["error"].as_str()),
                (status, Some(code)),
                "{d:?}"
            );
        }
        let r = purchase(&Decision::Reserved(rid.clone()));
        assert_eq!(r.status, 202);
        assert_eq!(body(&r)["reservation_id"], rid.as_str());
        assert_eq!(body(&r)["status"], "queued");
        let r = purchase(&Decision::AlreadyPurchased(rid.clone()));
        assert_eq!(body(&r)["reservation_id"], rid.as_str());
        let r = purchase(&Decision::Invalid("empty body"));
        assert_eq!(body(&r)["detail"], "empty body");
    }

    #[test]
    fn each_answer_of_a_purchase_of_units_is_documented() {
        use seckill_common::allowance::{Entry, Held};
        let rid = "0123456789abcdef0123456789abcdef";
        let held = Held(vec![Entry {
            reservation_id: rid.into(),
            quantity: 2,
        }]);
        let cases = [
            (
                Decision::NotEnoughStock(2),
                410,
                r#"{"error":"not_enough_stock","units_left":2}"#.to_string(),
            ),
            (
                Decision::LimitReached(held),
                409,
                format!(
                    r#"{{"error":"limit_reached","reservations":[{{"quantity":2,"reservation_id":"{rid}"}}]}}"#
                ),
            ),
        ];
        for (d, status, want) in cases {
            let r = purchase(&d);
            assert_eq!(
                (r.status, r.body.as_str()),
                (status, want.as_str()),
                "{d:?}"
            );
        }
        let r = purchase(&Decision::AboveMax(3));
        assert_eq!(
            (r.status, body(&r)["max_per_purchase"].as_u64()),
            (400, Some(3))
        );
        assert_eq!(body(&r)["error"], "invalid_request");
        let r = purchase(&Decision::KeyReused(rid.into()));
        assert_eq!(
            (r.status, body(&r)["error"].as_str()),
            (422, Some("idempotency_key_reused"))
        );
        assert_eq!(body(&r)["reservation_id"], rid);
        let r = purchase(&Decision::KeyRequired);
        assert_eq!(
            (r.status, body(&r)["error"].as_str()),
            (400, Some("idempotency_key_required"))
        );
        assert!(body(&r)["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"));
    }

    #[test]
    fn a_refused_token_carries_its_challenge_and_a_busy_answer_its_retry() {
        let r = purchase(&Decision::Denied(Denied::Token(Refused::Expired)));
        assert_eq!(
            r.extra,
            Some((
                "WWW-Authenticate",
                r#"Bearer realm="seckill", error="invalid_token", error_description="expired""#
            ))
        );
        for d in [
            Decision::Unavailable,
            Decision::Overloaded,
            Decision::TooManyRequests,
            Decision::Paused,
        ] {
            assert_eq!(purchase(&d).extra, Some(("Retry-After", "1")), "{d:?}");
        }
    }
}
