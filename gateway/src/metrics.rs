//! Owns the gateway's Prometheus metrics: requests by route and status,
//! purchase outcomes, a latency histogram per route, Redis errors, requests
//! in flight, parked connections (declared body too large), the group
//! commit's pipelines, answers left to a finisher thread, requests refused
//! by the limits and purchases shed, tokens refused by reason, the build's
//! version and the process figures (memory, descriptors, threads: read at
//! each scrape, `seckill_common::process_metrics`), and the process's Redis
//! connections open, in use and reconnected (`seckill_common::connections`).
//! `prometheus-client` metrics in one registry, with a handle to each
//! series kept here so that counting a request never looks a label set up;
//! rendered by `/metrics`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use seckill_common::connections;
use seckill_common::metrics::latency_histogram;
use seckill_common::process_metrics::ProcessFigures;
use std::sync::OnceLock;
use std::time::Duration;

/// The metrics label of each route (a fixed set, so a hostile path cannot
/// create new time series).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// `POST /v1/sales/{id}/purchases`.
    Purchase = 0,
    /// `GET /v1/sales/{id}/purchases/{user}`.
    PurchaseStatus,
    /// `GET /v1/sales/{id}`.
    Sale,
    /// `/healthz`.
    Healthz,
    /// `/readyz`.
    Readyz,
    /// `/metrics`.
    Metrics,
    /// Anything else.
    Other,
    /// `POST /v1/payments`.
    Payment,
    /// `DELETE /v1/sales/{id}/purchases/me`.
    Cancel,
}

/// Every label, in index order.
pub const LABELS: [(Label, &str); 9] = [
    (Label::Purchase, "purchase"),
    (Label::PurchaseStatus, "purchase_status"),
    (Label::Sale, "sale"),
    (Label::Healthz, "healthz"),
    (Label::Readyz, "readyz"),
    (Label::Metrics, "metrics"),
    (Label::Other, "other"),
    (Label::Payment, "payment"),
    (Label::Cancel, "cancel"),
];

/// Why a token was refused, finer than the 401 code the client reads
/// ([`Refused`]): the `reason` label of `seckill_gateway_tokens_refused_total`
/// and the gateway's debug log line, so an operator tells an unknown `kid`
/// after a key rotation from a lifetime over `SECKILL_AUTH_MAX_TTL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// No `Authorization` header.
    Missing = 0,
    /// Another scheme than `Bearer`, an empty token, or several headers.
    Unusable,
    /// Longer than `MAX_TOKEN_BYTES`.
    TooLong,
    /// Not a compact JWS: bad base64url or JSON, a missing claim.
    Malformed,
    /// No `kid`, or a `kid` the key file does not hold (a rotation the
    /// gateway's key file has not caught up with).
    UnknownKid,
    /// An `alg` that is not its key's.
    WrongAlgorithm,
    /// The signature does not match the key.
    BadSignature,
    /// `aud` is not `SECKILL_AUTH_AUDIENCE`.
    WrongAudience,
    /// `iss` is not `SECKILL_AUTH_ISSUER` (when set), or missing then.
    WrongIssuer,
    /// `nbf` or `iat` in the future (beyond the leeway).
    NotYetValid,
    /// A `sub` that is not a buyer id.
    BadSubject,
    /// Lives longer than `SECKILL_AUTH_MAX_TTL`.
    LifetimeOverMax,
    /// `exp` has passed (401 `token_expired`).
    Expired,
}

/// The `reason` label of each [`Why`], in its order.
pub const WHY_LABELS: [&str; 13] = [
    "missing",
    "unusable",
    "too_long",
    "malformed",
    "unknown_kid",
    "wrong_algorithm",
    "bad_signature",
    "wrong_audience",
    "wrong_issuer",
    "not_yet_valid",
    "bad_subject",
    "lifetime_over_max",
    "expired",
];

impl Why {
    /// The reason's label.
    pub fn label(self) -> &'static str {
        WHY_LABELS
            .get(self as usize)
            .copied()
            .unwrap_or("malformed")
    }
}

/// Status codes counted one by one; any other code is counted as `other`
/// (the last entry, 0).
pub const STATUSES: [u16; 14] = [
    200, 202, 400, 401, 403, 404, 405, 409, 410, 413, 429, 500, 503, 0,
];

/// The `status` label of each entry of [`STATUSES`].
const STATUS_LABELS: [&str; STATUSES.len()] = [
    "200", "202", "400", "401", "403", "404", "405", "409", "410", "413", "429", "500", "503",
    "other",
];

/// What a purchase attempt came to (the `outcome` label): each value is
/// one answer decided one way, so `outcome=~"sold_out.*"` counts every 410
/// and `outcome=~"already_purchased.*"` every 409 of a purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 202: a unit was reserved.
    Reserved = 0,
    /// 409 decided by Redis: the user already holds a reservation (or,
    /// in a sale of several units per buyer, their allowance is used up:
    /// `limit_reached`).
    AlreadyPurchased,
    /// 410 `sold_out` decided by Redis, or `not_enough_stock` (fewer units
    /// left than asked for).
    SoldOut,
    /// 410 `sold_out` answered from memory (the sold-out fast path: the
    /// buyer is not among the sale's buyers held in memory).
    SoldOutFromMemory,
    /// 403 `sale_not_started`.
    NotStarted,
    /// 403 `sale_ended` decided by Redis.
    Ended,
    /// 404 `sale_not_found` decided by Redis.
    UnknownSale,
    /// 400, 413 or 422: the request was refused before Redis, or by the
    /// script (a quantity above the sale's limit per purchase, a missing
    /// or reused `Idempotency-Key`).
    Invalid,
    /// 503: Redis could not be reached, or refused the script.
    Unavailable,
    /// 410 `sold_out` for a sold-out sale whose buyers are not in memory
    /// (being loaded, or more than `SECKILL_GATEWAY_BUYERS_MAX`), after one
    /// `HGET` of the buyer instead of the script.
    SoldOutAfterBuyerRead,
    /// 503 `sale_paused`: the sale is paused (e.g. Redis lost data).
    Paused,
    /// 401 `invalid_token` or `token_expired` (`identity.rs`; why:
    /// `seckill_gateway_tokens_refused_total{reason}`).
    InvalidToken,
    /// 403 `user_mismatch`: the body names another user than the token.
    UserMismatch,
    /// 403 `sale_ended` answered from memory (the sale's window closed).
    EndedFromMemory,
    /// 404 `sale_not_found` answered from memory.
    UnknownSaleFromMemory,
    /// 409 answered from memory: a buyer of a sold-out sale retrying.
    AlreadyPurchasedFromMemory,
    /// 409 for a sold-out sale whose buyers are not in memory, after one
    /// `HGET` of the buyer.
    AlreadyPurchasedAfterBuyerRead,
    /// 202 decided by Redis for a purchase sent again with its
    /// `Idempotency-Key` and quantity: the reservation made before, nothing
    /// more taken.
    Repeated,
}

const OUTCOMES: [&str; 18] = [
    "reserved",
    "already_purchased",
    "sold_out",
    "sold_out_from_memory",
    "not_started",
    "ended",
    "unknown_sale",
    "invalid",
    "unavailable",
    "sold_out_after_buyer_read",
    "paused",
    "invalid_token",
    "user_mismatch",
    "ended_from_memory",
    "unknown_sale_from_memory",
    "already_purchased_from_memory",
    "already_purchased_after_buyer_read",
    "repeated",
];

/// The HELP of `seckill_gateway_purchases_total`: every outcome and its
/// answer, so a dashboard reads them without the source.
const OUTCOMES_HELP: &str = "Purchase attempts by outcome, one answer each: reserved 202; \
repeated 202 (a purchase sent again with its Idempotency-Key, nothing taken); \
already_purchased 409 (Redis), already_purchased_from_memory 409 (a sold-out sale's buyers in memory), \
already_purchased_after_buyer_read 409 (one HGET of the buyer); sold_out 410 (Redis), \
sold_out_from_memory 410, sold_out_after_buyer_read 410; ended 403 sale_ended (Redis), \
ended_from_memory 403; not_started 403; unknown_sale 404 (Redis), unknown_sale_from_memory 404; \
user_mismatch 403; invalid_token 401; invalid 400 or 413; paused 503 sale_paused; \
unavailable 503";

/// The label set of `seckill_gateway_requests_total`: route, then status.
type RequestLabels = [(&'static str, &'static str); 2];

/// One label (`route` or `outcome`) and its value.
type OneLabel = [(&'static str, &'static str); 1];

/// Every gateway metric. One instance per process, shared by `Arc`.
#[derive(Debug)]
pub struct Metrics {
    /// What `/metrics` renders; holds a clone of every handle below.
    registry: Registry,
    /// `seckill_gateway_requests_total`: a series appears with the first
    /// request of its route and status (no zero series for the 84 pairs
    /// never seen).
    requests: Family<RequestLabels, Counter>,
    /// The handle of each route × status series, once it exists.
    request_slots: Vec<[OnceLock<Counter>; STATUSES.len()]>,
    /// One latency histogram per route, in [`LABELS`] order.
    latency: Vec<Histogram>,
    /// One counter per outcome, in [`OUTCOMES`] order.
    outcomes: Vec<Counter>,
    /// `seckill_gateway_units_reserved_total`: units taken by the
    /// purchases counted `reserved` (a purchase of N units counts N).
    units_reserved: Counter,
    /// One counter per reason a token is refused, in [`WHY_LABELS`] order.
    tokens_refused: Vec<Counter>,
    /// Failed Redis calls (connection refused, timeouts, error replies).
    pub redis_errors: Counter,
    /// Successful Redis (re)connects of every thread.
    pub redis_connects: Counter,
    /// Requests being handled right now.
    pub in_flight: Gauge,
    /// Connections answered 413 at once and closed without reading their
    /// body (a declared body over 1 MiB; see `body.rs`). Each holds its
    /// connection's thread and socket only for the lingering close: at most
    /// 64 KiB of the body read, 5 s at most per read.
    pub parked: Counter,
    /// Purchases sent in Redis pipelines (group commit) and the pipelines.
    pub pipelined: Counter,
    /// Redis pipelines sent by the group-commit threads.
    pub pipelines: Counter,
    /// Purchases dropped before they reached Redis because their client
    /// had already been answered 503 (no outcome in time), or is answered
    /// 503 now (queued past their deadline, `answer.rs`).
    pub abandoned: Counter,
    /// Answers a Redis thread could not write at once (the client not
    /// reading, its socket full), finished on a thread of their own
    /// (`answer.rs`).
    pub slow_answers: Counter,
    /// Buyers held in memory for sold-out sales (`soldout.rs`).
    pub buyers_remembered: Gauge,
    /// 1 when the last server check found Redis persisting nothing (no
    /// AOF, no RDB save points): a restart loses every reservation not yet
    /// in MySQL. 0 otherwise.
    pub redis_persistence_off: Gauge,
    /// Redis (re)connects refused because the server is unfit to hold the
    /// sale (an eviction policy that can delete its keys).
    pub redis_refused: Counter,
    /// Tokens whose signature and claims were checked (not in memory).
    pub tokens_verified: Counter,
    /// Tokens found in the memory of verified tokens (no signature check).
    pub token_cache_hits: Counter,
    /// Buyer-token signatures checked, valid or not: what a request pays
    /// to be believed (none for an answer that is a public fact).
    pub signature_checks: Counter,
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

/// Registers a fresh metric of type `M` under `name` (a counter without its
/// `_total`; `help` without its final full stop, see `seckill_common::metrics`)
/// and returns its handle.
fn add<M>(r: &mut Registry, name: &str, help: &str) -> M
where
    M: Default + Clone + prometheus_client::registry::Metric,
{
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

/// Registers a family of counters with one label under `name` and returns
/// the handle of each series, one per entry of `values`, in order.
fn one_label_counters(
    r: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[&'static str],
) -> Vec<Counter> {
    let family = Family::<OneLabel, Counter>::default();
    r.register(name, help, family.clone());
    values
        .iter()
        .map(|v| family.get_or_create(&[(label, v)]).clone())
        .collect()
}

/// The labelled series of [`Metrics`], registered in `r`.
struct Labelled {
    requests: Family<RequestLabels, Counter>,
    latency: Vec<Histogram>,
    outcomes: Vec<Counter>,
    units_reserved: Counter,
    tokens_refused: Vec<Counter>,
    limited_buyer: Counter,
    limited_address: Counter,
}

/// Registers the labelled series, the build's version and the process
/// figures in `r`.
fn labelled(r: &mut Registry) -> Labelled {
    let requests = Family::<RequestLabels, Counter>::default();
    r.register(
        "seckill_gateway_requests",
        "HTTP requests answered, by route and status",
        requests.clone(),
    );
    let outcomes = one_label_counters(
        r,
        "seckill_gateway_purchases",
        OUTCOMES_HELP,
        "outcome",
        &OUTCOMES,
    );
    let units_reserved = add(
        r,
        "seckill_gateway_units_reserved",
        "Units taken by the purchases counted reserved (a purchase of N units counts N)",
    );
    let tokens_refused = one_label_counters(
        r,
        "seckill_gateway_tokens_refused",
        "Buyer tokens refused (401), by reason",
        "reason",
        &WHY_LABELS,
    );
    let build = Family::<OneLabel, Gauge>::default();
    r.register(
        "seckill_gateway_build_info",
        "1, labelled with the version of this gateway's build",
        build.clone(),
    );
    build
        .get_or_create(&[("version", env!("CARGO_PKG_VERSION"))])
        .set(1);
    r.register_collector(Box::new(ProcessFigures));
    connections::register(
        r,
        "seckill_gateway",
        &[connections::Store::Redis],
        connections::Export::WithInUse,
    );
    let durations =
        Family::<OneLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
    r.register(
        "seckill_gateway_request_duration_seconds",
        "Time from taking a request off the queue to its answer, by route",
        durations.clone(),
    );
    let latency = LABELS
        .iter()
        .map(|(_, route)| durations.get_or_create(&[("route", route)]).clone())
        .collect();
    let [limited_buyer, limited_address]: [Counter; 2] = one_label_counters(
        r,
        "seckill_gateway_limited",
        "Requests answered 429 too_many_requests, by the limit that refused them",
        "limit",
        &["buyer", "address"],
    )
    .try_into()
    .unwrap_or_default();
    Labelled {
        requests,
        latency,
        outcomes,
        units_reserved,
        tokens_refused,
        limited_buyer,
        limited_address,
    }
}

/// The buyer-token counters: verified, found in memory, signatures checked.
fn token_counters(r: &mut Registry) -> (Counter, Counter, Counter) {
    (
        add(
            r,
            "seckill_gateway_tokens_verified",
            "Buyer tokens whose signature and claims were checked (not found in memory)",
        ),
        add(
            r,
            "seckill_gateway_token_cache_hits",
            "Buyer tokens found in the memory of verified tokens (no signature check)",
        ),
        add(
            r,
            "seckill_gateway_signature_checks",
            "Buyer-token signatures checked, valid or not (none for a public answer)",
        ),
    )
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::default();
        let (tokens_verified, token_cache_hits, signature_checks) = token_counters(&mut r);
        let Labelled {
            requests,
            latency,
            outcomes,
            units_reserved,
            tokens_refused,
            limited_buyer,
            limited_address,
        } = labelled(&mut r);
        Metrics {
            request_slots: LABELS
                .iter()
                .map(|_| std::array::from_fn(|_| OnceLock::new()))
                .collect(),
            requests,
            latency,
            outcomes,
            units_reserved,
            tokens_refused,
            redis_errors: add(
                &mut r,
                "seckill_gateway_redis_errors",
                "Redis calls that failed (connection, timeout or error reply)",
            ),
            redis_connects: add(
                &mut r,
                "seckill_gateway_redis_connects",
                "Successful Redis connects and reconnects",
            ),
            in_flight: add(
                &mut r,
                "seckill_gateway_requests_in_flight",
                "Requests being handled now",
            ),
            parked: add(
                &mut r,
                "seckill_gateway_parked_connections",
                "Connections answered 413 at once and closed unread (declared body too large)",
            ),
            pipelined: add(
                &mut r,
                "seckill_gateway_pipelined_purchases",
                "Purchases sent to Redis in group-commit pipelines",
            ),
            pipelines: add(
                &mut r,
                "seckill_gateway_redis_pipelines",
                "Pipelines sent by the group-commit threads",
            ),
            abandoned: add(
                &mut r,
                "seckill_gateway_abandoned_purchases",
                "Purchases not sent to Redis because their client had already been answered 503",
            ),
            slow_answers: add(
                &mut r,
                "seckill_gateway_slow_answers",
                "Purchase answers not written at once (client not reading), finished on a thread of their own",
            ),
            buyers_remembered: add(
                &mut r,
                "seckill_gateway_buyers_remembered",
                "Buyers of sold-out sales held in memory (bounded by SECKILL_GATEWAY_BUYERS_MAX)",
            ),
            redis_persistence_off: add(
                &mut r,
                "seckill_gateway_redis_persistence_off",
                "1 when Redis persists nothing (no AOF, no RDB): a restart loses reservations",
            ),
            redis_refused: add(
                &mut r,
                "seckill_gateway_redis_refused",
                "Redis connects refused: an eviction policy that can delete the sale's keys",
            ),
            tokens_verified,
            token_cache_hits,
            signature_checks,
            limited_buyer,
            limited_address,
            limit_table_full: add(
                &mut r,
                "seckill_gateway_limit_table_full",
                "429s given to a new key because its set of the limit table held only active keys",
            ),
            shed: add(
                &mut r,
                "seckill_gateway_shed",
                "Purchases answered 503 overloaded: SECKILL_GATEWAY_PURCHASES_IN_FLIGHT were waiting for Redis",
            ),
            registry: r,
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
        if let (Some(slot), Some((_, route))) = (
            self.request_slots.get(label as usize).map(|row| &row[s]),
            LABELS.get(label as usize),
        ) {
            slot.get_or_init(|| {
                self.requests
                    .get_or_create(&[("route", route), ("status", STATUS_LABELS[s])])
                    .clone()
            })
            .inc();
        }
        if let Some(h) = self.latency.get(label as usize) {
            h.observe(took.as_secs_f64());
        }
    }

    /// Counts one purchase outcome.
    pub fn outcome(&self, o: Outcome) {
        if let Some(c) = self.outcomes.get(o as usize) {
            c.inc();
        }
    }

    /// Counts the `units` a purchase answered 202 `reserved` took.
    pub fn units_reserved(&self, units: u32) {
        self.units_reserved.inc_by(u64::from(units));
    }

    /// Units counted by [`Metrics::units_reserved`] so far.
    pub fn units_reserved_total(&self) -> u64 {
        self.units_reserved.get()
    }

    /// Purchases counted with outcome `o` so far.
    pub fn outcome_total(&self, o: Outcome) -> u64 {
        self.outcomes.get(o as usize).map_or(0, |c| c.get())
    }

    /// Counts one refused token.
    pub fn token_refused(&self, why: Why) {
        if let Some(c) = self.tokens_refused.get(why as usize) {
            c.inc();
        }
    }

    /// The `/metrics` page (Prometheus text format 0.0.4; serve it with
    /// `seckill_common::metrics::CONTENT_TYPE`).
    ///
    /// Errors: never in practice (every metric here encodes into a
    /// `String`); passed on from the library.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        seckill_common::metrics::render(&self.registry)
    }
}
