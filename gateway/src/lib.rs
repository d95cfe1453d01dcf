//! `seckill-gateway`: the purchase HTTP API (v1) on tiny_http with plain
//! threads. Each purchase is one atomic Redis script (reserve a unit, write
//! the flow record, queue the order message); the worker turns the queue
//! into MySQL orders. The binary (`main.rs`) only parses the command line
//! and calls [`server::run`].
//!
//! # Layout
//!
//! From the top (the process) to the bottom (counters), one folder or
//! file per layer:
//!
//! - [`server`]: the process: settings resolved into each layer's part,
//!   the threads, readiness, SIGTERM.
//! - [`http`]: tiny_http, routes, bodies, client addresses, replies and
//!   status codes, and the hand-off of a purchase with its request to the
//!   Redis thread that answers it.
//! - [`queries`]: what the reading routes read; [`payments`]: the payment
//!   webhook and cancellations. Both as facts and outcomes, not replies.
//! - [`purchase`]: one purchase as domain decisions (admit, prepare,
//!   reserve, conclude), the sold-out memory, a sold-out sale's buyers,
//!   the home bucket of a split sale.
//! - [`admission`]: who a request is from (identity, token verifier), the
//!   per-buyer and per-address shares, the in-flight bound.
//! - [`redis`]: links with reconnect, the two ways a purchase reaches
//!   Redis, the group commit, the server's fitness check.
//! - [`metrics`]: the Prometheus metrics and their label sets;
//!   [`config`]: the settings each layer is built from.
//!
//! Invariants (checked by the `layers` test of this crate):
//!
//! - `server` may use every layer; nothing uses `server`.
//! - `http` is the only layer that names tiny_http or `crate::http`; it
//!   may use every layer below it.
//! - `queries` and `payments` may use `purchase`, `redis`, `config` and
//!   `metrics`, not each other.
//! - `purchase` may use `admission`, `redis`, `config` and `metrics`.
//! - `admission` may use `config` and `metrics` only: it never talks to
//!   Redis; in it `verifier` never uses `identity` (the words both share
//!   are in `credentials`).
//! - `redis` may use `metrics` only: it knows neither HTTP nor a
//!   purchase's answers (the group commit hands outcomes on through
//!   `redis::group_commit::Deliver`).
//! - `metrics` and `config` use no other module of the crate.
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 2 bad configuration or cannot
//! listen, 1 any other failure, 64 an argument (it takes none: `--help`).
#![forbid(unsafe_code)]

pub mod admission;
pub mod config;
pub mod http;
pub mod metrics;
pub mod payments;
pub mod purchase;
pub mod queries;
pub mod redis;
pub mod server;

#[cfg(test)]
mod layers;
