//! Owns `POST /v1/sales/{sale_id}/purchases`: the strict reading of the JSON
//! body, the buyer's share and the sold-out fast path in front of Redis
//! ([`admit`]), the in-flight bound and the home bucket ([`prepare`]), the
//! mapping of a reservation outcome to the API's answers (202, 409, 410,
//! 403, 404, 503 `unavailable` or `sale_paused`: [`conclude`]), and the
//! purchase completed on its connection's thread ([`complete`]; the Redis
//! call between the halves is `reserver.rs`, or the whole second half runs
//! on a Redis thread: `answer.rs`). The buyer is the token's (`identity.rs`); the
//! body's `user_id` is optional then, and must agree with the token.
//!
//! Unknown fields in the body are refused (400): a client that sends, say,
//! `"quantity": 2` must learn that it is not honoured rather than be
//! silently sold one unit.

use crate::app::App;
use crate::buyers;
use crate::identity::Credentials;
use crate::limits::Verdict;
use crate::metrics::Outcome;
use crate::redis_link::Unavailable;
use crate::reply::Reply;
use crate::soldout::{Closed, Known};
use seckill_common::keys::PurchaseStatus;
use seckill_common::reservation::{Replied, ReserveOutcome};
use serde::Deserialize;
use std::time::Instant;

/// The request body, `{"user_id": "..."}` (or `{}` with a token) and
/// nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurchaseBody {
    #[serde(default, deserialize_with = "some_string")]
    user_id: Option<String>,
}

/// A present `user_id` must be a string (`null` is refused, not "absent").
fn some_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// The rule for `user_id`, as told to clients.
pub const USER_ID_RULE: &str = concat!("user_id must be ", seckill_common::token_rule!());

const EXPECTED: &str =
    "expected {\"user_id\": \"...\"} with a string user_id and no other field (or {} with a token)";

/// Reads the user id, if any, from a purchase body; `required` (with
/// `SECKILL_AUTH=none`) makes a missing one a 400.
///
/// Errors: the 400 reply (`invalid_request` with a detail) for an empty,
/// malformed, truncated, non-UTF-8 or too deeply nested body (serde_json
/// stops at 128 levels), a missing (when `required`), non-string, null or
/// duplicate `user_id`, an unknown field, or a user id that breaks the rule.
pub fn parse_body(body: &[u8], required: bool) -> Result<Option<String>, Reply> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Reply::invalid("empty body"));
    }
    // serde would also take a struct from an array (`["alice"]`).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Reply::invalid(EXPECTED));
    }
    let parsed: PurchaseBody = serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        Reply::invalid(match e.classify() {
            Category::Eof => "truncated JSON",
            Category::Syntax | Category::Io => "malformed JSON",
            Category::Data => EXPECTED,
        })
    })?;
    match parsed.user_id {
        None if required => Err(Reply::invalid(EXPECTED)),
        Some(u) if !seckill_common::is_valid_token(&u) => Err(Reply::invalid(USER_ID_RULE)),
        u => Ok(u),
    }
}

/// A purchase admitted and routed, not yet sent to Redis.
pub struct Prepared<'a> {
    /// The buyer (the token's, or the body's with `SECKILL_AUTH=none`).
    pub user_id: String,
    /// The buyer's home bucket (`home.rs`); a sale of one bucket's keys.
    pub home: seckill_common::keys::SaleKeys,
    /// The sale's number of buckets.
    pub k: u32,
    /// Its place under the in-flight bound (`shed.rs`).
    pub place: crate::shed::Admitted<'a>,
}

/// Everything of a purchase before Redis: the buyer's share and the
/// sold-out fast path ([`admit`]), the in-flight bound (503 `overloaded`
/// beyond it, `shed.rs`) and the buyer's home bucket.
///
/// Errors: the final reply when no reservation script is to run (as
/// [`admit`]'s, 503 `overloaded`, 503 when the sale's bucket count cannot
/// be read).
pub fn prepare<'a>(
    app: &'a App,
    sale_id: u64,
    body: &[u8],
    creds: &Credentials,
) -> Result<Prepared<'a>, Reply> {
    let user_id = admit(app, sale_id, body, creds)?;
    let Some(place) = app.shed.try_admit() else {
        app.metrics.shed.inc();
        return Err(Reply::overloaded());
    };
    let (home, k) = app
        .buckets
        .home(app, sale_id, &user_id)
        .map_err(|Unavailable| unavailable(app))?;
    Ok(Prepared {
        user_id,
        home,
        k,
        place,
    })
}

/// The rest of a purchase on this thread: the reservation
/// ([`crate::reserver::Reserver`]: group commit or one round trip), the
/// pull of a unit for a split sale's empty bucket (`home.rs`), and the
/// reply ([`conclude`]). A purchase of a one-bucket sale under group
/// commit is usually answered by the Redis thread instead (`answer.rs`).
pub fn complete(app: &App, sale_id: u64, p: Prepared<'_>) -> Reply {
    let Prepared {
        user_id,
        home,
        k,
        place: _place,
    } = p;
    let outcome = app.reserver.reserve(app, home, &user_id);
    let outcome = crate::home::reach_stock(app, home, k, &user_id, outcome);
    let outcome = crate::home::ended_elsewhere(app, home, k, outcome);
    conclude(app, sale_id, k, &user_id, outcome)
}

/// The first half of a purchase, before Redis: reads the body, takes the
/// buyer from the token in `creds` (or the body's `user_id` with
/// `SECKILL_AUTH=none`) and tries the sold-out fast path. For a sold-out sale a buyer's
/// retry is 409 with its reservation id, from the buyers in memory or,
/// while they are not, from one `HGET` of that buyer (`buyers.rs`).
///
/// Errors: the final reply when no reservation script is needed (400, 401,
/// 403 `user_mismatch`, or 409/410/403/404 from memory, 429 beyond the
/// buyer's share before a Redis call, 503 when the buyer cannot be read).
pub fn admit(app: &App, sale_id: u64, body: &[u8], creds: &Credentials) -> Result<String, Reply> {
    let body_user = parse_body(body, app.identity.body_names_buyer())
        .inspect_err(|_| app.metrics.outcome(Outcome::Invalid))?;
    let user_id = app
        .identity
        .buyer(creds, body_user, &app.metrics)
        .inspect_err(|r| {
            app.metrics.outcome(match r.status {
                401 => Outcome::InvalidToken,
                _ => Outcome::UserMismatch,
            })
        })?;
    if app.redis_unfit.load(std::sync::atomic::Ordering::Acquire) {
        return Err(unavailable(app));
    }
    let (closed, set) = match app.soldout.get(sale_id, Instant::now()) {
        Known::Ask => {
            limit_buyer(app, sale_id, &user_id)?;
            return Ok(user_id);
        }
        Known::Closed(c, set) => (c, set),
    };
    if closed != Closed::SoldOut {
        app.metrics.outcome(match closed {
            Closed::Ended => Outcome::EndedFromMemory,
            _ => Outcome::UnknownSaleFromMemory,
        });
        return Err(closed_reply(closed));
    }
    let (holds, from_memory) = match set {
        Some(set) => (set.lookup(&user_id), true),
        None => {
            limit_buyer(app, sale_id, &user_id)?;
            let r = buyers::lookup_one(app, sale_id, &user_id)
                .map_err(|Unavailable| unavailable(app))?;
            (r, false)
        }
    };
    app.metrics.outcome(match (&holds, from_memory) {
        (Some(_), true) => Outcome::AlreadyPurchasedFromMemory,
        (Some(_), false) => Outcome::AlreadyPurchasedAfterBuyerRead,
        (None, true) => Outcome::SoldOutFromMemory,
        (None, false) => Outcome::SoldOutAfterBuyerRead,
    });
    Err(match holds {
        Some(rid) => already_purchased(&rid),
        None => closed_reply(Closed::SoldOut),
    })
}

/// The second half: the reply to what Redis said (or could not say), with
/// the sold-out memory and the outcome counter updated. The memory is
/// ordered by the reply's `seq`, never by the order in which connection
/// threads get here (`soldout.rs`). For a sale of `buckets` > 1 a reply's
/// `seq` is its bucket's while a sell-out's is the whole sale's
/// (`home.rs`), so the two cannot be ordered: a reservation, or a winner's
/// retry that finds stock in its bucket, forgets a sold-out memory at once
/// (a stale one costs the next purchases a trip to Redis, which answers;
/// waiting for the 500 ms recheck instead sold one returned unit per
/// recheck and told the others `sold_out`: the hostile pass), and its
/// buyers are read one at a time from their home buckets, never loaded.
pub fn conclude(
    app: &App,
    sale_id: u64,
    buckets: u32,
    user_id: &str,
    outcome: Result<Replied, Unavailable>,
) -> Reply {
    let metrics = &app.metrics;
    let closed = |c: Closed, seq: u64, o: Outcome| {
        let ends = app.buckets.ends_at(sale_id);
        if app
            .soldout
            .closed_ending(sale_id, c, seq, Instant::now(), ends)
            && buckets == 1
        {
            app.buyers.request(app, sale_id, seq);
        }
        metrics.outcome(o);
        closed_reply(c)
    };
    let Replied {
        outcome,
        seq,
        stock,
    } = match outcome {
        Ok(r) => r,
        Err(Unavailable) => {
            metrics.outcome(Outcome::Unavailable);
            return Reply::unavailable();
        }
    };
    match outcome {
        ReserveOutcome::Reserved(rid) => {
            metrics.outcome(Outcome::Reserved);
            if buckets == 1 {
                app.soldout.reserved(sale_id, seq);
            } else {
                app.soldout.stock_back(sale_id);
            }
            Reply::object(
                202,
                &[
                    ("reservation_id", &rid),
                    ("status", PurchaseStatus::Queued.as_str()),
                ],
            )
        }
        ReserveOutcome::AlreadyPurchased(rid) => {
            metrics.outcome(Outcome::AlreadyPurchased);
            // A winner's retry carries the stock: stock back is a sale to
            // reopen at once, none a sold out confirmed (in a split sale
            // the stock is one bucket's: none there says nothing).
            match stock {
                Some(0) if buckets == 1 => {
                    if app.soldout.confirmed_sold_out(sale_id, seq, Instant::now()) {
                        app.buyers.request(app, sale_id, seq);
                    }
                }
                Some(0) | None => app.soldout.inconclusive(sale_id, Instant::now()),
                Some(_) => app.soldout.stock_back(sale_id),
            }
            already_purchased(&rid)
        }
        // A retry (same reservation id) of a call whose reply was lost,
        // released since: what this request bought, now expired,
        // cancelled or rolled back (the release removed the buyer's mark
        // and kept the id in `buyers:released`, where the status route
        // reads it).
        ReserveOutcome::Released(rid) => {
            metrics.outcome(Outcome::AlreadyPurchased);
            app.soldout.inconclusive(sale_id, Instant::now());
            already_purchased(&rid)
        }
        ReserveOutcome::NotStarted => {
            metrics.outcome(Outcome::NotStarted);
            app.soldout.inconclusive(sale_id, Instant::now());
            Reply::error(403, "sale_not_started")
        }
        ReserveOutcome::Paused(reason) => {
            metrics.outcome(Outcome::Paused);
            app.soldout.inconclusive(sale_id, Instant::now());
            log::debug!("sale {sale_id} is paused ({reason}); purchase of {user_id} refused");
            Reply::sale_paused()
        }
        ReserveOutcome::SoldOut => closed(Closed::SoldOut, seq, Outcome::SoldOut),
        ReserveOutcome::Ended => closed(Closed::Ended, seq, Outcome::Ended),
        // One bucket of a split sale unknown to Redis (its keys lost) says
        // nothing of the sale: not remembered, and 503 for this buyer (the
        // hostile pass: one lost bucket closed the whole sale as unknown),
        // unless the sale's window has closed (`home::ended_elsewhere`
        // made that `Ended`: an archived sale's removed bucket).
        ReserveOutcome::UnknownSale if buckets > 1 => unavailable(app),
        ReserveOutcome::UnknownSale => closed(Closed::Unknown, seq, Outcome::UnknownSale),
    }
}

fn unavailable(app: &App) -> Reply {
    app.metrics.outcome(Outcome::Unavailable);
    Reply::unavailable()
}

/// The per-buyer share (`limits.rs`), charged by every attempt that would
/// call Redis (the reservation script, or the buyer's `HGET` of a sold-out
/// sale); an attempt answered from memory (410, 409, 403, 404) costs no
/// share, so a buyer who keeps clicking after the sell-out still hears
/// `sold_out`.
///
/// Errors: 429 `too_many_requests` beyond the share.
fn limit_buyer(app: &App, sale_id: u64, user_id: &str) -> Result<(), Reply> {
    match app.limits.charge_buyer(sale_id, user_id) {
        Verdict::Allowed => Ok(()),
        v => {
            app.metrics.limited_buyer.inc();
            if v == Verdict::TableFull {
                app.metrics.limit_table_full.inc();
            }
            Err(Reply::too_many_requests())
        }
    }
}

fn already_purchased(rid: &str) -> Reply {
    Reply::object(
        409,
        &[("error", "already_purchased"), ("reservation_id", rid)],
    )
}

fn closed_reply(c: Closed) -> Reply {
    match c {
        Closed::SoldOut => Reply::error(410, "sold_out"),
        Closed::Ended => Reply::error(403, "sale_ended"),
        Closed::Unknown => Reply::sale_not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(body: &[u8]) -> String {
        let r = parse_body(body, true).unwrap_err();
        assert_eq!(r.status, 400);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"], "invalid_request");
        v["detail"].as_str().unwrap().to_string()
    }

    #[test]
    fn a_valid_body_gives_the_user_id() {
        assert_eq!(
            parse_body(br#"{"user_id":"alice-1.x_Y"}"#, true).unwrap(),
            Some("alice-1.x_Y".into())
        );
        assert_eq!(
            parse_body(b" {\"user_id\" : \"a\"}\n", false).unwrap(),
            Some("a".into())
        );
        assert_eq!(parse_body(b"{}", false).unwrap(), None);
        assert!(parse_body(br#"{"user_id":null}"#, false).is_err());
    }

    #[test]
    fn every_hostile_body_is_a_400() {
        assert_eq!(detail(b""), "empty body");
        assert_eq!(detail(br#"{"user_id":"al"#), "truncated JSON");
        assert_eq!(detail(b"{user_id: 1}"), "malformed JSON");
        assert_eq!(detail(b"{\"user_id\":\"\xff\xfe\"}"), "malformed JSON");
        detail(&vec![b'['; 100_000]);
        for b in [
            r#"{"user_id":5}"#,
            r#"{"user_id":null}"#,
            r#"{"user_id":["a"]}"#,
            r#"{}"#,
            r#"{"user_id":"a","quantity":2}"#,
            r#"{"user_id":"a","user_id":"b"}"#,
            r#"["a"]"#,
        ] {
            assert!(detail(b.as_bytes()).starts_with("expected"), "{b}");
        }
        let long = format!(r#"{{"user_id":"{}"}}"#, "a".repeat(65));
        for b in [
            long.as_str(),
            r#"{"user_id":"a b"}"#,
            "{\"user_id\":\"a\\u0001\"}",
            r#"{"user_id":""}"#,
        ] {
            assert_eq!(detail(b.as_bytes()), USER_ID_RULE, "{b}");
        }
    }
}
