//! The helpers the test files share, each a module of the `it` binary
//! (`use crate::support::gateway;` in a test file), and the lock that keeps
//! the load-sensitive crowds apart.
//!
//! # Layout
//!
//! - `gateway`: the real `seckill-gateway` on a free port, a raw HTTP/1.1
//!   client, sales loaded into Redis, snapshots of a sale's keys.
//! - `worker`: real `seckill-worker` processes, queues filled through the
//!   reservation script, the exactly-once checks.
//! - `reconciler`: a reconciler test world (Redis, MySQL, review file) and
//!   the real `seckill-reconciler` binary.
//! - `lifecycle_http`: the order lifecycle over HTTP (payments, a buyer's
//!   own purchase).
//! - `quantity`: sales of several units per buyer, reservations of N units
//!   written as the reservation script writes them.
//! - `ops`: shipped configuration files templated for a test, repository
//!   paths, a plain HTTP/1.0 GET.
//! - `prometheus`: a private Prometheus server and its HTTP API.
//! - `mysql_pair`: a worker on a MySQL primary and replica, a count on one
//!   server.
//! - `nginx_install`: nginx installed in a private prefix as
//!   docs/OPERATIONS.md's Deployment step 6 says.
//! - `browser`: headless Chromium rendering a local page.
//! - `after_repair`: the check every repair test ends with (holders 409,
//!   then the sale sells out exactly).
//! - `package`: the Debian package built, installed, upgraded, removed and
//!   purged on this machine, and the guard that purges it at the end.
//! - This file: [`crowd`], the one-crowd-at-a-time lock.

pub mod after_repair;
pub mod browser;
pub mod gateway;
pub mod lifecycle_http;
pub mod mysql_pair;
pub mod nginx_install;
pub mod ops;
pub mod package;
pub mod prometheus;
pub mod quantity;
pub mod reconciler;
pub mod worker;

use std::sync::{Mutex, MutexGuard};

static CROWD: Mutex<()> = Mutex::new(());

/// Held for the whole of a test that sends a crowd and counts its answers
/// (`cluster_reshard`, `e2e_pipeline`, `gateway_burst`, `gateway_limits`,
/// `ops_nginx_crowd`): such a test measures the machine as much as the
/// code, so two never run at once, while the other tests of the binary go
/// on beside it. A test that failed while holding it does not fail the
/// next one (the poison is ignored: the lock guards no data).
pub fn crowd() -> MutexGuard<'static, ()> {
    CROWD.lock().unwrap_or_else(|p| p.into_inner())
}
