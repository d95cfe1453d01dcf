//! `seckill-worker` entry point: configuration, logging, signals, exit code.
//! Exit codes: 0 stopped on SIGTERM/SIGINT, 1 runtime failure, 2 bad
//! configuration.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    seckill_common::shutdown::init_logging();
    let config = match seckill_common::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("seckill-worker: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = match seckill_common::Shutdown::install(|| {}) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("seckill-worker: signal handler: {e}");
            return ExitCode::from(1);
        }
    };
    match seckill_worker::run(config, shutdown) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seckill-worker: {e}");
            ExitCode::from(if e.is_config() { 2 } else { 1 })
        }
    }
}
