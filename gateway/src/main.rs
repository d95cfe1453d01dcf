//! `seckill-gateway`: the purchase HTTP API (v1) on tiny_http with plain
//! threads. Each purchase is one atomic Redis script (reserve a unit, write
//! the flow record, queue the order message); the worker turns the queue
//! into MySQL orders.
//!
//! # Layout
//!
//! - [`server`]: listener, threads, readiness, SIGTERM.
//! - [`handler`]: one request's life: route, body, answer, count.
//! - [`routes`]: the URL table and strict id parsing.
//! - [`body`]: taking request bodies without letting tiny_http harm the
//!   process (huge declared lengths, slow bodies).
//! - [`identity`]: the buyer: bearer tokens read and the key file loaded;
//!   [`verifier`]: a token verified and remembered.
//! - [`purchase`]: one purchase, from body to reply; [`queries`]: the
//!   reading routes.
//! - [`reserver`]: the two ways a purchase reaches Redis, behind one type;
//!   [`home`]: which bucket of a sale split over buckets it goes to, and
//!   the pull of units to an empty one before `sold_out`.
//! - [`app`]: the state every thread shares.
//! - [`group_commit`]: pipelining purchases to Redis from a few threads;
//!   [`answer`]: a purchase answered by the Redis thread that reserved it
//!   (its connection thread does not wait for it).
//! - [`redis_link`]: one Redis connection with reconnect and backoff; the
//!   pool of them the reading routes borrow.
//! - [`soldout`]: the sold-out fast path, ordered by the sale's reservation
//!   sequence; [`buyers`]: a sold-out sale's buyers, loaded once and bounded.
//! - [`limits`]: the per-buyer and per-address rate limits in fixed-size
//!   tables; [`client_addr`]: which address a request is charged to
//!   (trusted proxies and `X-Forwarded-For`); [`shed`]: the bound on
//!   purchases waiting for Redis.
//! - [`reply`], [`metrics`]: answers and `/metrics` (`prometheus-client`);
//!   `metrics_cost` (tests only) benchmarks the metrics of a purchase,
//!   `token_cost` (tests only) the check of a buyer token,
//!   `handoff_cost` (tests only) the group commit's hand-off alone.
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 2 bad configuration or cannot
//! listen, 1 any other failure, 64 an argument (it takes none: `--help`).
#![forbid(unsafe_code)]

mod answer;
mod app;
mod body;
mod buyers;
mod client_addr;
mod group_commit;
mod handler;
#[cfg(test)]
mod handoff_cost;
mod home;
mod identity;
mod limits;
mod metrics;
#[cfg(test)]
mod metrics_cost;
mod payments;
mod purchase;
mod queries;
mod redis_link;
mod reply;
mod reserver;
mod routes;
mod server;
mod shed;
mod soldout;
#[cfg(test)]
mod token_cost;
mod verifier;

use seckill_common::start;
use std::process::ExitCode;

/// `seckill-gateway --help`.
const USAGE: &str = "\
usage: seckill-gateway

The flash-sale gateway: HTTP purchases reserved in Redis by one script,
order messages queued for the workers. No arguments: it is configured by
SECKILL_* environment variables (README, \"Configuration\"), chiefly
SECKILL_LISTEN (127.0.0.1:8080), SECKILL_REDIS_URL, SECKILL_AUTH and
SECKILL_AUTH_KEYS (a JWKS file of buyer-token keys), SECKILL_PAYMENT_SECRET.
SIGHUP reads SECKILL_AUTH_KEYS again (a bad file keeps the keys in use).
Exit codes: 0 stopped by SIGTERM/SIGINT, 1 failed while running, 2 bad
configuration or a port that cannot be listened on, 64 bad command line.";

fn main() -> ExitCode {
    if let Some(code) = start::command_line("seckill-gateway", USAGE) {
        return code;
    }
    let unblocker = server::Unblocker::default();
    let on_signal = unblocker.clone();
    let started = match start::start_reloading(move || on_signal.unblock_all()) {
        Ok(s) => s,
        Err(e) => return start::fail("seckill-gateway", &e, e.exit_code()),
    };
    let result =
        server::run(started.config, started.shutdown, started.reload, unblocker).map(|()| 0);
    start::finish("seckill-gateway", result, server::GatewayError::exit_code)
}
