//! `seckill-reconciler` entry point: parse the command line, read the
//! configuration, run the command, map its result to an exit code (the
//! codes are listed in the library's crate doc, `lib.rs`).
#![forbid(unsafe_code)]

use seckill_common::start::{self, EXIT_CONFIG, EXIT_USAGE};
use seckill_reconciler::cli_help::PROGRAM;
use seckill_reconciler::{cli, cmd, config, error, output};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let cmd = match cli::parse(args) {
        Ok(c) => c,
        Err(e) => {
            let what = format!("{e}\n{}", e.pointer());
            return start::fail(PROGRAM, &what, EXIT_USAGE);
        }
    };
    if let cli::Command::Help(text) = &cmd {
        output::line(format_args!("{text}"));
        return ExitCode::SUCCESS;
    }
    // A command that opens neither Redis nor MySQL does not read their
    // URLs: a malformed one it would never use does not stop it.
    let resolve = if cmd::opens_services(&cmd) {
        config::Config::from_env
    } else {
        config::Config::local_from_env
    };
    // Exit 2 for any failure to start: 1 means "open findings" here.
    let started = match start::start_as(resolve, || {}) {
        Ok(s) => s,
        Err(e) => return start::fail(PROGRAM, &e, EXIT_CONFIG),
    };
    let result = cmd::run(&started.config, &started.shutdown, cmd)
        .map_err(|e| error::at_addresses(e, &started.config.services.mysql_url));
    start::finish(PROGRAM, result, error::RunError::exit_code)
}
