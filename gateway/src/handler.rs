//! Owns the life of one request on a handler thread: route it, take its
//! body safely (`body.rs`), call the route, answer, and count it. Requests
//! whose body cannot be taken without blocking go to a slow-lane thread
//! here, which finishes them the same way.

use crate::app::{App, Worker};
use crate::body::{self, Plan, SLOW_LANE_MAX};
use crate::reply::Reply;
use crate::routes::{self, Label, Route};
use crate::{purchase, queries};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiny_http::Request;

/// Handles one request from start to answer.
pub fn handle(w: &mut Worker, mut rq: Request) {
    let start = Instant::now();
    w.app.metrics.in_flight.inc();
    let route = routes::route(rq.method(), rq.url());
    let label = route.label();
    match body::plan(&rq) {
        Plan::Refuse(reply) => finish(&w.app, rq, label, reply, start),
        Plan::Park => {
            let app = w.app.clone();
            count(&app, label, 413, start);
            body::park(&app, rq, Reply::payload_too_large());
        }
        Plan::SlowLane => to_slow_lane(&w.app, rq, route, start),
        Plan::Buffered => {
            let reply = answer(w, &mut rq, route);
            finish(&w.app, rq, label, reply, start);
        }
    }
}

/// Calls the route. For a purchase the body is read here: it is either in
/// memory already or this runs on a slow-lane thread.
fn answer(w: &mut Worker, rq: &mut Request, route: Route) -> Reply {
    match route {
        Route::Purchase(sale_id) => match body::read_limited(rq, w.app.body_limit) {
            Ok(b) => purchase::purchase(w, sale_id, &b),
            Err(r) => {
                w.app.metrics.outcome(crate::metrics::Outcome::Invalid);
                r
            }
        },
        Route::PurchaseStatus(sale_id, user) => queries::purchase_status(w, sale_id, &user),
        Route::Sale(sale_id) => queries::sale(w, sale_id),
        Route::Healthz => Reply::json(200, serde_json::json!({ "status": "ok" })),
        Route::Readyz => queries::ready(w),
        Route::Metrics => Reply::text(200, w.app.metrics.render(), "text/plain; version=0.0.4"),
        Route::WrongMethod(allow) => Reply::method_not_allowed(allow),
        Route::NoSuchSale => Reply::sale_not_found(),
        Route::Invalid(detail) => Reply::invalid(detail),
        Route::NotFound => Reply::not_found(),
    }
}

fn count(app: &App, label: Label, status: u16, start: Instant) {
    app.metrics.request(label, status, start.elapsed());
    app.metrics.in_flight.dec();
}

/// Writes `reply` and counts the request. Dropping `rq` afterwards is safe:
/// its body was read, is in memory, or is at most `body::DRAIN_MAX` bytes.
fn finish(app: &App, rq: Request, label: Label, reply: Reply, start: Instant) {
    let status = reply.status;
    if let Err(e) = rq.respond(reply.into_response()) {
        log::debug!("writing a response: {e}");
    }
    count(app, label, status, start);
}

/// Runs `rq` on a new slow-lane thread; parks it when [`SLOW_LANE_MAX`]
/// threads already run or no thread can be started.
fn to_slow_lane(app: &Arc<App>, rq: Request, route: Route, start: Instant) {
    let label = route.label();
    let refusal = if rq.body_length().unwrap_or(0) > app.body_limit {
        Reply::payload_too_large()
    } else {
        Reply::unavailable()
    };
    if app.slow_lane.fetch_add(1, Ordering::SeqCst) >= SLOW_LANE_MAX {
        app.slow_lane.fetch_sub(1, Ordering::SeqCst);
        count(app, label, refusal.status, start);
        body::park(app, rq, refusal);
        return;
    }
    app.metrics.slow_lane.inc();
    let shared = app.clone();
    // The request moves into the thread only if the thread starts; the
    // channel gives it back otherwise.
    let (tx, rx) = crossbeam_channel::bounded::<Request>(1);
    let spawned = std::thread::Builder::new()
        .name("gw-slow-lane".into())
        .spawn(move || {
            if let Ok(mut rq) = rx.recv() {
                let mut w = Worker::new(shared.clone());
                let too_large = rq.body_length().unwrap_or(0) > shared.body_limit;
                let reply = if too_large && !matches!(route, Route::Purchase(_)) {
                    Reply::payload_too_large()
                } else {
                    answer(&mut w, &mut rq, route)
                };
                finish(&shared, rq, label, reply, start);
            }
            shared.metrics.slow_lane.dec();
            shared.slow_lane.fetch_sub(1, Ordering::SeqCst);
        });
    match spawned {
        Ok(_) => {
            if let Err(e) = tx.send(rq) {
                // Cannot happen (the thread holds the receiver until it
                // gets the request); park rather than drop if it does.
                body::park(app, e.0, refusal);
            }
        }
        Err(e) => {
            log::error!("starting a slow-lane thread: {e}");
            app.metrics.slow_lane.dec();
            app.slow_lane.fetch_sub(1, Ordering::SeqCst);
            count(app, label, refusal.status, start);
            body::park(app, rq, refusal);
        }
    }
}
