//! `seckill-worker` entry point: configuration, logging, signals, exit code.
//! Exit codes: 0 stopped on SIGTERM/SIGINT, 1 runtime failure, 2 bad
//! configuration.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use seckill_common::start::{self, EXIT_CONFIG, EXIT_FAILURE};

fn main() -> ExitCode {
    let started = match start::start(|| {}) {
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
