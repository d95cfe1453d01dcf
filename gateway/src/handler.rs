//! Owns the life of one request on the thread that read it from its
//! connection (tiny_http calls [`handle`] there: one thread per
//! connection): route it, charge it to its client address (429 beyond
//! the address's share), take its body safely (`body.rs`), call the
//! route (a purchase: `purchase::prepare`, then handed with its request to
//! the Redis thread that answers it, `answer.rs`, or completed here; a
//! status read: the buyer from `identity.rs`; a payment or a
//! cancellation: `payments.rs`), answer, and count it.

use crate::app::App;
use crate::body::{self, Plan};
use crate::client_addr::{self, Client};
use crate::identity;
use crate::limits::Verdict;
use crate::metrics::Outcome;
use crate::reply::Reply;
use crate::routes::{self, Label, Route};
use crate::{answer, payments, purchase, queries};
use seckill_common::payment;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiny_http::Request;

/// Handles one request from start to answer (or to its hand-off: a
/// purchase answered by a Redis thread, `answer.rs`, which then releases
/// it). Once the stop has begun (`App::closing`), or behind a handed-off
/// purchase Redis has not decided in time (`answer::wait_for_decision`),
/// a request gets 503 (`unavailable`, `Retry-After`) and changes nothing.
pub fn handle(app: &Arc<App>, rq: Request) {
    // A request pipelined behind a purchase this connection handed off
    // is served once Redis has decided that purchase (`answer.rs`).
    let decided = answer::wait_for_decision(
        rq.remote_addr(),
        crate::reserver::pipeline_wait(app) + app.redis_timeout * 3,
    );
    let start = Instant::now();
    // Counted before `closing` is read, and the stop sets `closing` before
    // it reads `active` (both SeqCst): either this request sees the stop,
    // or the stop waits for this request.
    app.active.fetch_add(1, Ordering::SeqCst);
    app.metrics.in_flight.inc();
    let route = routes::route(rq.method(), rq.url());
    let label = route.label();
    if !decided || app.closing.load(Ordering::SeqCst) {
        finish(app, rq, label, Reply::unavailable(), start);
    } else {
        // Charged before anything else is looked at, so invalid requests
        // count against their address too.
        let limited = !within_address_share(app, &rq, &route);
        match body::plan(&rq) {
            Plan::Refuse(reply) => {
                // The body's framing is unknown (RFC 9112, 6.3): nothing
                // after it on this connection can be read as a request.
                count(app, label, reply.status, start);
                body::refuse(rq, reply);
            }
            Plan::Park => {
                count(app, label, 413, start);
                body::park(app, rq, Reply::payload_too_large());
            }
            Plan::Read if limited => finish(app, rq, label, Reply::too_many_requests(), start),
            Plan::Read => {
                if serve(app, rq, route, start) == Served::HandedOff {
                    // Released by its answer.
                    return;
                }
            }
        }
    }
    app.active.fetch_sub(1, Ordering::SeqCst);
}

/// Who answers a request [`serve`] took.
#[derive(PartialEq, Eq, Debug)]
enum Served {
    /// This thread did.
    Here,
    /// A Redis thread does (`answer.rs`).
    HandedOff,
}

/// Charges `rq` to its client address (`client_addr.rs`, `limits.rs`);
/// false when it is beyond the address's share (then counted as limited).
/// `/healthz`, `/readyz` and `/metrics` are not charged: probes and
/// scrapers must not be refused, and the proxy does not expose `/metrics`.
/// Nor is `POST /v1/payments`: the payment service sends every payment
/// from a few addresses, and each request is signed (an unsigned one
/// costs one HMAC and gets 401).
fn within_address_share(app: &App, rq: &Request, route: &Route) -> bool {
    if matches!(
        route,
        Route::Healthz | Route::Readyz | Route::Metrics | Route::Payment
    ) {
        return true;
    }
    let forwarded = rq
        .headers()
        .iter()
        .filter(|h| h.field.equiv("X-Forwarded-For"))
        .map(|h| h.value.as_str());
    let peer = rq.remote_addr().map(|a| a.ip());
    let addr = match client_addr::client(peer, forwarded, &app.trusted_proxies) {
        Client::Address(addr) => addr,
        Client::TrustedProxy => return true,
    };
    match app.limits.charge_address(addr) {
        Verdict::Allowed => true,
        v => {
            app.metrics.limited_address.inc();
            if v == Verdict::TableFull {
                app.metrics.limit_table_full.inc();
            }
            false
        }
    }
}

/// Calls the route and answers on this connection's thread, or hands a
/// purchase with its request to the Redis thread that answers it without
/// waiting on the client (`answer.rs`): a slow client, or one that never
/// reads its answers, holds up only its own connection.
fn serve(app: &Arc<App>, mut rq: Request, route: Route, start: Instant) -> Served {
    let label = route.label();
    let reply = match route {
        Route::Purchase(sale_id) => {
            let creds = identity::credentials(&rq);
            // Up to 1 KiB is in memory already; a longer body comes from the
            // client now, and only this client's connection waits for it.
            match body::read_limited(&mut rq, app.body_limit) {
                Ok(body) => match purchase::prepare(app, sale_id, &body, &creds) {
                    Ok(p) => match answer::claim(app, &p, rq.remote_addr()) {
                        Some(claim) => {
                            answer::hand_off(app, rq, sale_id, label, start, p, claim);
                            return Served::HandedOff;
                        }
                        None => purchase::complete(app, sale_id, p),
                    },
                    Err(reply) => reply,
                },
                Err(reply) => {
                    app.metrics.outcome(Outcome::Invalid);
                    reply
                }
            }
        }
        Route::PurchaseStatus(sale_id, user) => status(app, &rq, sale_id, Some(&user)),
        Route::MyPurchase(sale_id) => status(app, &rq, sale_id, None),
        Route::CancelMyPurchase(sale_id) => {
            payments::cancel(app, sale_id, &identity::credentials(&rq))
        }
        Route::Payment => {
            let signature = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv(payment::SIGNATURE_HEADER))
                .map(|h| h.value.as_str().to_string());
            match body::read_limited(&mut rq, app.body_limit) {
                Ok(body) => payments::pay(app, signature.as_deref(), &body),
                Err(reply) => reply,
            }
        }
        other => answer_route(app, other),
    };
    finish(app, rq, label, reply, start);
    Served::Here
}

/// A purchase status read: only the token's own (`identity.rs`).
fn status(app: &App, rq: &Request, sale_id: u64, path_user: Option<&str>) -> Reply {
    let creds = identity::credentials(rq);
    match app.identity.reader(&creds, path_user, &app.metrics) {
        Ok(user) => queries::purchase_status(app, sale_id, &user),
        Err(reply) => reply,
    }
}

/// The reply to every route but a purchase and a status read.
fn answer_route(app: &App, route: Route) -> Reply {
    match route {
        Route::Sale(sale_id) => queries::sale(app, sale_id),
        Route::Healthz => Reply::json(200, serde_json::json!({ "status": "ok" })),
        Route::Readyz => queries::ready(app),
        Route::Metrics => match app.metrics.render() {
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

/// Counts a request answered with `status` (`/metrics`): its latency
/// since `start`, and one fewer in flight.
pub fn count(app: &App, label: Label, status: u16, start: Instant) {
    app.metrics.request(label, status, start.elapsed());
    app.metrics.in_flight.dec();
}

/// Writes `reply` and counts the request. Dropping `rq` afterwards is safe:
/// its body was read, is in memory, or is at most `body::DRAIN_MAX` bytes.
pub fn finish(app: &App, rq: Request, label: Label, reply: Reply, start: Instant) {
    let status = reply.status;
    if let Err(e) = rq.respond(reply.into_response()) {
        log::debug!("writing a response: {e}");
    }
    count(app, label, status, start);
}
