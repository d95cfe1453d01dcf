//! `seckill-worker` entry point: configuration, logging, signals, exit code.
//! Exit codes: 0 stopped on SIGTERM/SIGINT, 1 runtime failure, 2 bad
//! configuration (a metrics address that cannot be listened on, and MySQL
//! refusing the user, lacking the database, its tables or a migration,
//! and Redis refusing the password, or another worker live under its id,
//! included), 64 an argument (it takes none: `--help`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use seckill_common::start::{self, EXIT_CONFIG, EXIT_FAILURE};

/// `seckill-worker --help`.
const USAGE: &str = "\
usage: seckill-worker

A worker: takes order messages from every sale's reliable queue in Redis
and writes the orders, the stock ledger and the stock to MySQL, one
transaction per batch; also expires unpaid orders and applies payments. No
arguments: it is configured by SECKILL_* environment variables (README,
\"Configuration\"), chiefly SECKILL_REDIS_URL, SECKILL_MYSQL_URL,
SECKILL_WORKER_ID (unique per worker), SECKILL_WORKER_METRICS_LISTEN, and
SECKILL_WORKER_CONSUMERS_MIN / _MAX (consumers run in this process: more
are started while sales have a backlog).
Exit codes: 0 stopped by SIGTERM/SIGINT, 1 failed while running, 2 bad
configuration, a port that cannot be listened on, MySQL refusing the
user or lacking the database, its tables or a migration, or Redis refusing
the password (the message names
the remedy; an unreachable Redis or MySQL is waited for), another worker
live under the same SECKILL_WORKER_ID, 64 bad command line.";

fn main() -> ExitCode {
    if let Some(code) = start::command_line("seckill-worker", USAGE) {
        return code;
    }
    let started = match start::start_as(seckill_worker::config::Config::from_env, || {}) {
        Ok(s) => s,
        Err(e) => return start::fail("seckill-worker", &e, e.exit_code()),
    };
    let result = seckill_worker::run(started.config, started.shutdown).map(|()| 0);
    start::finish("seckill-worker", result, |e| {
        if e.is_config() {
            EXIT_CONFIG
        } else {
            EXIT_FAILURE
        }
    })
}
