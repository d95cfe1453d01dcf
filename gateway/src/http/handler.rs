//! Owns the life of one request on the thread that read it from its
//! connection (tiny_http calls [`handle`] there: one thread per
//! connection): route it, charge it to its client address (429 beyond
//! the address's share), take its body safely (`body.rs`), serve the
//! route (a purchase: `Purchases::prepare`, then handed with its request
//! to the Redis thread that answers it, `answer.rs`, or completed here; a
//! status read or a cancellation: the buyer from the identity first),
//! answer, and count it.

use crate::http::body::{self, Plan};
use crate::http::client_addr::{self, Client};
use crate::http::reply::Reply;
use crate::http::routes::{self, Route};
use crate::http::{answer, headers, outcomes, Gateway};
use crate::metrics::Label;
use crate::metrics::Outcome;
use crate::{payments, queries};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiny_http::Request;

/// Handles one request from start to answer (or to its hand-off: a
/// purchase answered by a Redis thread, `answer.rs`, which then releases
/// it). Once the stop has begun (`Lifecycle::closing`), or behind a
/// handed-off purchase Redis has not decided in time
/// (`answer::wait_for_decision`), a request gets 503 (`unavailable`,
/// `Retry-After`) and changes nothing.
pub fn handle(gw: &Arc<Gateway>, rq: Request) {
    // A request pipelined behind a purchase this connection handed off
    // is served once Redis has decided that purchase (`answer.rs`).
    let decided = answer::wait_for_decision(
        rq.connection_id(),
        gw.purchases.reserver.pipeline_wait() + gw.redis_timeout * 3,
    );
    let start = Instant::now();
    // Counted before `closing` is read, and the stop sets `closing` before
    // it reads `active` (both SeqCst): either this request sees the stop,
    // or the stop waits for this request.
    gw.lifecycle.active.fetch_add(1, Ordering::SeqCst);
    gw.metrics.in_flight.inc();
    let route = routes::route(rq.method(), rq.url());
    let label = route.label();
    if !decided || gw.lifecycle.closing.load(Ordering::SeqCst) {
        finish(gw, rq, label, Reply::unavailable(), start);
    } else {
        // Charged before anything else is looked at, so invalid requests
        // count against their address too.
        let limited = !within_address_share(gw, &rq, &route);
        match body::plan(&rq) {
            Plan::Refuse(reply) => {
                // The body's framing is unknown (RFC 9112, 6.3): nothing
                // after it on this connection can be read as a request.
                gw.count(label, reply.status, start);
                body::refuse(rq, reply);
            }
            Plan::Park => {
                gw.count(label, 413, start);
                body::park(&gw.metrics, rq, Reply::payload_too_large());
            }
            Plan::Read if limited => finish(gw, rq, label, Reply::too_many_requests(), start),
            Plan::Read => {
                if serve(gw, rq, route, start) == Served::HandedOff {
                    // Released by its answer.
                    return;
                }
            }
        }
    }
    gw.lifecycle.active.fetch_sub(1, Ordering::SeqCst);
}

/// Who answers a request [`serve`] took.
#[derive(PartialEq, Eq, Debug)]
enum Served {
    /// This thread did.
    Here,
    /// A Redis thread does (`answer.rs`).
    HandedOff,
}

/// Charges `rq` to its client address (`client_addr.rs`, the admission's
/// limits); false when it is beyond the address's share. `/healthz`,
/// `/readyz` and `/metrics` are not charged: probes and scrapers must not
/// be refused, and the proxy does not expose `/metrics`. Nor is `POST
/// /v1/payments`: the payment service sends every payment from a few
/// addresses, and each request is signed (an unsigned one costs one HMAC
/// and gets 401).
fn within_address_share(gw: &Gateway, rq: &Request, route: &Route) -> bool {
    if matches!(
        route,
        Route::Healthz | Route::Readyz | Route::Metrics | Route::Payment
    ) {
        return true;
    }
    let peer = rq.remote_addr().map(|a| a.ip());
    match client_addr::client(peer, headers::forwarded_for(rq), &gw.trusted_proxies) {
        Client::Address(addr) => gw.admission.charge_address(addr),
        Client::TrustedProxy => true,
    }
}

/// Serves the route and answers on this connection's thread, or hands a
/// purchase with its request to the Redis thread that answers it without
/// waiting on the client (`answer.rs`): a slow client, or one that never
/// reads its answers, holds up only its own connection.
fn serve(gw: &Arc<Gateway>, mut rq: Request, route: Route, start: Instant) -> Served {
    let label = route.label();
    let reply = match route {
        Route::Purchase(sale_id) => return purchase(gw, rq, sale_id, start),
        Route::PurchaseStatus(sale_id, user) => status(gw, &rq, sale_id, Some(&user)),
        Route::MyPurchase(sale_id) => status(gw, &rq, sale_id, None),
        Route::CancelMyPurchase(sale_id) => match reader(gw, &rq, None) {
            Ok(user) => outcomes::cancelled(payments::cancel(&gw.payments, sale_id, &user)),
            Err(reply) => reply,
        },
        Route::Payment => {
            let signature = headers::payment_signature(&rq);
            match body::read_limited(&mut rq, gw.body_limit) {
                Ok(body) => {
                    outcomes::paid(payments::pay(&gw.payments, signature.as_deref(), &body))
                }
                Err(reply) => reply,
            }
        }
        other => answer_route(gw, other),
    };
    finish(gw, rq, label, reply, start);
    Served::Here
}

/// A purchase: prepared here, then handed to the Redis thread that
/// answers it, or completed on this thread.
fn purchase(gw: &Arc<Gateway>, mut rq: Request, sale_id: u64, start: Instant) -> Served {
    let label = Label::Purchase;
    let creds = headers::credentials(&rq);
    // Up to 1 KiB is in memory already; a longer body comes from the
    // client now, and only this client's connection waits for it.
    let body = match body::read_limited(&mut rq, gw.body_limit) {
        Ok(body) => body,
        Err(reply) => {
            gw.metrics.outcome(Outcome::Invalid);
            finish(gw, rq, label, reply, start);
            return Served::Here;
        }
    };
    let key = match headers::idempotency_key(&rq) {
        Ok(key) => key,
        Err(detail) => {
            gw.metrics.outcome(Outcome::Invalid);
            finish(gw, rq, label, Reply::invalid(detail), start);
            return Served::Here;
        }
    };
    let prepared = gw
        .purchases
        .prepare(&gw.admission, sale_id, &body, &creds, key.as_deref());
    let decision = match prepared {
        // A purchase of the units script is a round trip of its own
        // (`redis/reserver.rs`): completed here, never handed off.
        Ok(p) if p.units.is_some() => gw.purchases.complete(sale_id, p),
        Ok(p) => match answer::claim(gw, &p, rq.connection_id()) {
            Some(claim) => {
                answer::hand_off(gw, rq, sale_id, start, p, claim);
                return Served::HandedOff;
            }
            None => gw.purchases.complete(sale_id, p),
        },
        Err(d) => d,
    };
    finish(gw, rq, label, outcomes::purchase(&decision), start);
    Served::Here
}

/// Whose purchase a status read or a cancellation may touch: the token's
/// own (`admission/identity.rs`).
fn reader(gw: &Gateway, rq: &Request, path_user: Option<&str>) -> Result<String, Reply> {
    let creds = headers::credentials(rq);
    gw.admission
        .identity
        .reader(&creds, path_user, &gw.metrics)
        .map_err(outcomes::denied)
}

/// A purchase status read: only the token's own.
fn status(gw: &Gateway, rq: &Request, sale_id: u64, path_user: Option<&str>) -> Reply {
    match reader(gw, rq, path_user) {
        Ok(user) => outcomes::status(queries::purchase_status(&gw.reads, sale_id, &user)),
        Err(reply) => reply,
    }
}

/// The reply to every route but a purchase, a status read, a
/// cancellation and a payment.
fn answer_route(gw: &Gateway, route: Route) -> Reply {
    match route {
        Route::Sale(sale_id) => outcomes::sale(sale_id, queries::sale(&gw.reads, sale_id)),
        Route::Healthz => Reply::json(200, serde_json::json!({ "status": "ok" })),
        Route::Readyz => outcomes::ready(queries::ready(&gw.reads)),
        Route::Metrics => match gw.metrics.render() {
            Ok(page) => Reply::text(200, page, seckill_common::metrics::CONTENT_TYPE),
            Err(_) => Reply::error(500, "metrics_unavailable"),
        },
        Route::WrongMethod(allow) => Reply::method_not_allowed(allow),
        Route::NoSuchSale => Reply::sale_not_found(),
        Route::Invalid(detail) => Reply::invalid(detail),
        Route::NotFound => Reply::not_found(),
        // Never: `serve` takes these.
        Route::Purchase(_)
        | Route::PurchaseStatus(..)
        | Route::MyPurchase(_)
        | Route::CancelMyPurchase(_)
        | Route::Payment => Reply::not_found(),
    }
}

/// Writes `reply` and counts the request. Dropping `rq` afterwards is safe:
/// its body was read, is in memory, or is at most `body::DRAIN_MAX` bytes.
pub fn finish(gw: &Gateway, rq: Request, label: Label, reply: Reply, start: Instant) {
    let status = reply.status;
    if let Err(e) = rq.respond(reply.into_response()) {
        log::debug!("writing a response: {e}");
    }
    gw.count(label, status, start);
}
