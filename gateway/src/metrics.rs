//! Owns the gateway's Prometheus metrics: requests by route and status,
//! purchase outcomes, a latency histogram per route, Redis errors, requests
//! in flight, parked connections (declared body too large), and the group
//! commit's pipelines, requests refused by the limits and purchases shed. Lock-free atomics; rendered by `/metrics`.

use crate::routes::{Label, LABELS};
use seckill_common::metrics::{Counter, Exposition, Gauge, Histogram, LATENCY_BUCKETS_S};
use std::time::Duration;

/// Status codes counted one by one; any other code is counted as `other`.
pub const STATUSES: [u16; 13] = [
    200, 202, 400, 403, 404, 405, 409, 410, 413, 429, 500, 503, 0,
];

/// What a purchase attempt came to (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 202: a unit was reserved.
    Reserved = 0,
    /// 409: the user already holds a reservation.
    AlreadyPurchased,
    /// 410 decided by Redis.
    SoldOut,
    /// 410 or 403 `sale_ended` answered from memory (the sold-out fast path).
    ClosedFromMemory,
    /// 403 `sale_not_started`.
    NotStarted,
    /// 403 `sale_ended` decided by Redis.
    Ended,
    /// 404 `sale_not_found`.
    UnknownSale,
    /// 400 or 413: the request was refused before Redis.
    Invalid,
    /// 503: Redis could not be reached, or refused the script.
    Unavailable,
    /// 410 or 409 for a sold-out sale whose buyers are not in memory
    /// (being loaded, or more than `SECKILL_GATEWAY_BUYERS_MAX`): one
    /// `HGET` of the buyer instead of the script.
    ClosedAfterBuyerRead,
    /// 503 `sale_paused`: the sale is paused (e.g. Redis lost data).
    Paused,
}

const OUTCOMES: [&str; 11] = [
    "reserved",
    "already_purchased",
    "sold_out",
    "closed_from_memory",
    "not_started",
    "ended",
    "unknown_sale",
    "invalid",
    "unavailable",
    "closed_after_buyer_read",
    "paused",
];

/// Every gateway metric. One instance per process, shared by `Arc`.
#[derive(Debug)]
pub struct Metrics {
    requests: Vec<[Counter; STATUSES.len()]>,
    latency: Vec<Histogram>,
    outcomes: [Counter; OUTCOMES.len()],
    /// Failed Redis calls (connection refused, timeouts, error replies).
    pub redis_errors: Counter,
    /// Successful Redis (re)connects of every thread.
    pub redis_connects: Counter,
    /// Requests being handled right now.
    pub in_flight: Gauge,
    /// Connections answered 413 at once and then drained (a declared body
    /// over 1 MiB; see `body.rs`). Each holds its connection's thread and
    /// socket until the client has sent the body or goes away.
    pub parked: Counter,
    /// Purchases sent in Redis pipelines (group commit) and the pipelines.
    pub pipelined: Counter,
    /// Redis pipelines sent by the group-commit threads.
    pub pipelines: Counter,
    /// Purchases dropped before they reached Redis because their client
    /// had already been answered 503 (no outcome in time).
    pub abandoned: Counter,
    /// Buyers held in memory for sold-out sales (`soldout.rs`).
    pub buyers_remembered: Gauge,
    /// 1 when the last server check found Redis persisting nothing (no
    /// AOF, no RDB save points): a restart loses every reservation not yet
    /// in MySQL. 0 otherwise.
    pub redis_persistence_off: Gauge,
    /// Redis (re)connects refused because the server is unfit to hold the
    /// sale (an eviction policy that can delete its keys).
    pub redis_refused: Counter,
    /// Purchases answered 429 by the per-buyer limit (`limits.rs`).
    pub limited_buyer: Counter,
    /// Requests answered 429 by the per-address limit (`limits.rs`).
    pub limited_address: Counter,
    /// Of those 429s, the ones refused because the key was new and its
    /// set of the limit table held only active keys.
    pub limit_table_full: Counter,
    /// Purchases answered 503 `overloaded`: the in-flight bound was
    /// reached (`shed.rs`).
    pub shed: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: LABELS
                .iter()
                .map(|_| std::array::from_fn(|_| Counter::default()))
                .collect(),
            latency: LABELS
                .iter()
                .map(|_| Histogram::new(LATENCY_BUCKETS_S))
                .collect(),
            outcomes: std::array::from_fn(|_| Counter::default()),
            redis_errors: Counter::default(),
            redis_connects: Counter::default(),
            in_flight: Gauge::default(),
            parked: Counter::default(),
            pipelined: Counter::default(),
            pipelines: Counter::default(),
            abandoned: Counter::default(),
            buyers_remembered: Gauge::default(),
            redis_persistence_off: Gauge::default(),
            redis_refused: Counter::default(),
            limited_buyer: Counter::default(),
            limited_address: Counter::default(),
            limit_table_full: Counter::default(),
            shed: Counter::default(),
        }
    }
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, label: Label, status: u16, took: Duration) {
        let s = STATUSES
            .iter()
            .position(|&c| c == status)
            .unwrap_or(STATUSES.len() - 1);
        if let Some(row) = self.requests.get(label as usize) {
            row[s].inc();
        }
        if let Some(h) = self.latency.get(label as usize) {
            h.observe_duration(took);
        }
    }

    /// Counts one purchase outcome.
    pub fn outcome(&self, o: Outcome) {
        self.outcomes[o as usize].inc();
    }

    /// The `/metrics` page (Prometheus text format 0.0.4).
    pub fn render(&self) -> String {
        let mut e = Exposition::new();
        for (i, (_, route)) in LABELS.iter().enumerate() {
            for (j, code) in STATUSES.iter().enumerate() {
                let v = self.requests[i][j].get();
                if v == 0 {
                    continue;
                }
                let status = if *code == 0 {
                    "other".to_string()
                } else {
                    code.to_string()
                };
                e.counter(
                    "seckill_gateway_requests_total",
                    "HTTP requests answered, by route and status.",
                    &[("route", route), ("status", &status)],
                    v,
                );
            }
        }
        for (i, name) in OUTCOMES.iter().enumerate() {
            e.counter(
                "seckill_gateway_purchases_total",
                "Purchase attempts by outcome.",
                &[("outcome", name)],
                self.outcomes[i].get(),
            );
        }
        for (i, (_, route)) in LABELS.iter().enumerate() {
            e.histogram(
                "seckill_gateway_request_duration_seconds",
                "Time from taking a request off the queue to its answer, by route.",
                &[("route", route)],
                &self.latency[i],
            );
        }
        e.counter(
            "seckill_gateway_redis_errors_total",
            "Redis calls that failed (connection, timeout or error reply).",
            &[],
            self.redis_errors.get(),
        );
        e.counter(
            "seckill_gateway_redis_connects_total",
            "Successful Redis connects and reconnects.",
            &[],
            self.redis_connects.get(),
        );
        e.gauge(
            "seckill_gateway_requests_in_flight",
            "Requests being handled now.",
            &[],
            self.in_flight.get(),
        );
        e.counter(
            "seckill_gateway_parked_connections_total",
            "Connections answered 413 at once and then drained (declared body too large).",
            &[],
            self.parked.get(),
        );
        e.counter(
            "seckill_gateway_pipelined_purchases_total",
            "Purchases sent to Redis in group-commit pipelines.",
            &[],
            self.pipelined.get(),
        );
        e.counter(
            "seckill_gateway_redis_pipelines_total",
            "Pipelines sent by the group-commit threads.",
            &[],
            self.pipelines.get(),
        );
        e.counter(
            "seckill_gateway_abandoned_purchases_total",
            "Purchases not sent to Redis because their client had already been answered 503.",
            &[],
            self.abandoned.get(),
        );
        e.gauge(
            "seckill_gateway_buyers_remembered",
            "Buyers of sold-out sales held in memory (bounded by SECKILL_GATEWAY_BUYERS_MAX).",
            &[],
            self.buyers_remembered.get(),
        );
        e.gauge(
            "seckill_gateway_redis_persistence_off",
            "1 when Redis persists nothing (no AOF, no RDB): a restart loses reservations.",
            &[],
            self.redis_persistence_off.get(),
        );
        e.counter(
            "seckill_gateway_redis_refused_total",
            "Redis connects refused: an eviction policy that can delete the sale's keys.",
            &[],
            self.redis_refused.get(),
        );
        for (limit, c) in [
            ("buyer", &self.limited_buyer),
            ("address", &self.limited_address),
        ] {
            e.counter(
                "seckill_gateway_limited_total",
                "Requests answered 429 too_many_requests, by the limit that refused them.",
                &[("limit", limit)],
                c.get(),
            );
        }
        e.counter(
            "seckill_gateway_limit_table_full_total",
            "429s given to a new key because its set of the limit table held only active keys.",
            &[],
            self.limit_table_full.get(),
        );
        e.counter(
            "seckill_gateway_shed_total",
            "Purchases answered 503 overloaded: SECKILL_GATEWAY_PURCHASES_IN_FLIGHT were waiting for Redis.",
            &[],
            self.shed.get(),
        );
        e.finish()
    }
}
