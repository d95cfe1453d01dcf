//! The order lifecycle's HTTP side for the tests: the payment service's
//! signed `POST /v1/payments`, and a buyer's `GET`/`DELETE
//! .../purchases/me` with a token, over [`super::gateway`]'s client.

use crate::support::gateway::{format_request, raw, Gateway, Resp};
use seckill_common::payment::{self, sign};
use seckill_tests::RedisServer;

/// The shared payment secret of the tests' gateways.
pub const SECRET: &str = "test-payment-secret-0123456789";
/// The price of the tests' sales (`create_windowed_sale`), cents.
pub const PRICE: u64 = 1999;

/// A gateway that takes signed payments (`SECKILL_PAYMENT_SECRET`).
pub fn gateway(redis: &RedisServer) -> Gateway {
    Gateway::start(redis, &[("SECKILL_PAYMENT_SECRET", SECRET)])
}

/// `POST /v1/payments` with `body` and the header `signature` (none when `None`).
pub fn post_payment(port: u16, body: &str, signature: Option<&str>) -> Resp {
    let mut r =
        String::from("POST /v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(s) = signature {
        r.push_str(&format!("{}: {s}\r\n", payment::SIGNATURE_HEADER));
    }
    r.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    raw(port, r.as_bytes()).expect("an answer")
}

/// Now, Unix seconds.
pub fn now_s() -> u64 {
    seckill_common::now_ms() / 1000
}

/// The signature header of `body` at `ts`.
pub fn signed(body: &str, ts: u64) -> String {
    format!("t={ts},v1={}", sign(SECRET.as_bytes(), ts, body.as_bytes()))
}

/// The JSON body of a payment.
pub fn payment_body(rid: &str, payment_id: &str, amount: u64) -> String {
    format!(r#"{{"reservation_id":"{rid}","payment_id":"{payment_id}","amount_cents":{amount}}}"#)
}

/// Pays `rid` as the payment service would: 202.
pub fn pay(port: u16, rid: &str, payment_id: &str, amount: u64) {
    let body = payment_body(rid, payment_id, amount);
    let r = post_payment(port, &body, Some(&signed(&body, now_s())));
    assert_eq!(r.status, 202, "{r:?}");
}

/// `METHOD /v1/sales/{sale}/purchases/me` with `user`'s token (none for `None`).
pub fn me(port: u16, method: &str, sale: u64, user: Option<&str>) -> Resp {
    let mut r = format!("{method} /v1/sales/{sale}/purchases/me HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(u) = user {
        r.push_str(&format!(
            "Authorization: Bearer {}\r\n",
            seckill_tests::auth::token_for(u)
        ));
    }
    r.push_str("\r\n");
    raw(port, r.as_bytes()).expect("an answer")
}

/// `user` buys `quantity` units with `key` (answered 202); returns the
/// reservation id.
pub fn buy_units(port: u16, sale: u64, user: &str, quantity: u32, key: &str) -> String {
    let body = format!(r#"{{"user_id":"{user}","quantity":{quantity}}}"#);
    let req = format_request(
        "POST",
        &format!("/v1/sales/{sale}/purchases"),
        Some(&body),
        true,
    )
    .replacen("\r\n", &format!("\r\nIdempotency-Key: {key}\r\n"), 1);
    let r: Resp = raw(port, req.as_bytes()).expect("an answer");
    assert_eq!(r.status, 202, "{r:?}");
    r.json()["reservation_id"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
