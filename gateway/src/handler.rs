//! Owns the life of one request on a handler thread: route it, take its
//! body safely (`body.rs`), call the route, answer, and count it. Requests
//! whose body cannot be taken without blocking go to a slow-lane thread
//! here, which finishes them the same way.

use crate::app::{App, Worker};
use crate::body::{self, Plan, SLOW_LANE_MAX};
use crate::group_commit::Job;
use crate::metrics::Outcome;
use crate::redis_link::Unavailable;
use crate::reply::Reply;
use crate::routes::{self, Label, Route};
use crate::{purchase, queries};
use crossbeam_channel::Sender;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tiny_http::Request;

/// Handles one request from start to answer.
pub fn handle(w: &mut Worker, rq: Request) {
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
        Plan::Buffered => serve(w, rq, route, start),
    }
}

/// Calls the route and answers. For a purchase the body is read here: it
/// is either in memory already or this runs on a slow-lane thread. With
/// group commit the purchase is answered later by a Redis thread.
fn serve(w: &mut Worker, mut rq: Request, route: Route, start: Instant) {
    let label = route.label();
    let reply = match route {
        Route::Purchase(sale_id) => {
            let admitted = body::read_limited(&mut rq, w.app.body_limit)
                .inspect_err(|_| w.app.metrics.outcome(Outcome::Invalid))
                .and_then(|b| purchase::admit(&w.app, sale_id, &b));
            match admitted {
                Err(reply) => reply,
                Ok(user_id) => match &w.app.jobs {
                    Some(jobs) => return submit(&w.app, jobs, rq, sale_id, user_id, start),
                    None => {
                        let r = w.reserve(sale_id, &user_id);
                        purchase::conclude(&w.app, sale_id, &user_id, r)
                    }
                },
            }
        }
        Route::PurchaseStatus(sale_id, user) => queries::purchase_status(w, sale_id, &user),
        Route::Sale(sale_id) => queries::sale(w, sale_id),
        Route::Healthz => Reply::json(200, serde_json::json!({ "status": "ok" })),
        Route::Readyz => queries::ready(w),
        Route::Metrics => Reply::text(200, w.app.metrics.render(), "text/plain; version=0.0.4"),
        Route::WrongMethod(allow) => Reply::method_not_allowed(allow),
        Route::NoSuchSale => Reply::sale_not_found(),
        Route::Invalid(detail) => Reply::invalid(detail),
        Route::NotFound => Reply::not_found(),
    };
    finish(&w.app, rq, label, reply, start);
}

/// Hands a purchase to the group-commit threads; answers 503 at once when
/// their queue is full.
fn submit(
    app: &App,
    jobs: &Sender<Job>,
    rq: Request,
    sale_id: u64,
    user_id: String,
    start: Instant,
) {
    app.pending.fetch_add(1, Ordering::SeqCst);
    let job = Job {
        sale_id,
        user_id,
        reservation_id: seckill_common::ids::new_reservation_id(),
        request: rq,
        start,
    };
    if let Err(e) = jobs.try_send(job) {
        app.pending.fetch_sub(1, Ordering::SeqCst);
        let job = e.into_inner();
        let reply = purchase::conclude(app, sale_id, &job.user_id, Err(Unavailable));
        finish(app, job.request, Label::Purchase, reply, job.start);
    }
}

fn count(app: &App, label: Label, status: u16, start: Instant) {
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
            if let Ok(rq) = rx.recv() {
                let mut w = Worker::new(shared.clone());
                let too_large = rq.body_length().unwrap_or(0) > shared.body_limit;
                if too_large && !matches!(route, Route::Purchase(_)) {
                    finish(&shared, rq, label, Reply::payload_too_large(), start);
                } else {
                    serve(&mut w, rq, route, start);
                }
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
