//! `seckill-reconciler`: the operator's command. `main` only dispatches:
//! parse the command line (cli.rs), read the configuration, run the command,
//! map its result to an exit code.
//!
//! Exit codes: 0 success (for `run`: no open findings), 1 `run` found open
//! findings or `sale repair` was refused (no open finding yet, or a worker
//! holds messages of the sale), 2 could not run (Redis, MySQL or SQLite error, bad
//! configuration), 64 bad command line (one line saying what is wrong, then
//! a pointer to `--help`).
#![forbid(unsafe_code)]

mod bench_read;
mod cli;
mod compensate;
mod data_loss_rule;
mod dead_letter_archive;
mod dead_letters;
mod error;
mod findings_cmd;
mod lock;
mod missing_sale;
mod mysql_read;
mod output;
mod reconcile;
mod redis_read;
mod repair_cmd;
mod resolve_cmd;
mod review;
mod review_findings;
mod run_cmd;
mod sale_cmd;
mod settle;
mod token_cmd;

use seckill_common::Config;
use std::process::ExitCode;

fn main() -> ExitCode {
    seckill_common::shutdown::init_logging();
    let cmd = match cli::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("seckill-reconciler: {e}\nrun `seckill-reconciler --help` for usage");
            return ExitCode::from(64);
        }
    };
    if let cli::Command::Help = cmd {
        output::outln!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("seckill-reconciler: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = match seckill_common::Shutdown::install(|| {}) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("seckill-reconciler: signal handler: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&config, &shutdown, cmd) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("seckill-reconciler: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs one command; `Ok(code)` is the exit code of a command that ran.
fn run(
    config: &Config,
    shutdown: &seckill_common::Shutdown,
    cmd: cli::Command,
) -> Result<u8, Box<dyn std::error::Error>> {
    match cmd {
        cli::Command::Help => Ok(0),
        cli::Command::Migrate => {
            let applied = seckill_common::schema::migrate(&config.mysql_url, config.mysql_timeout)?;
            if applied.is_empty() {
                output::outln!("schema is current; nothing to apply");
            } else {
                output::outln!("applied migrations {applied:?}");
            }
            Ok(0)
        }
        cli::Command::SaleCreate(args) => sale_cmd::create(config, &args),
        cli::Command::SaleLoad(id) => sale_cmd::load(config, id),
        cli::Command::SaleShow(id) => sale_cmd::show(config, id),
        cli::Command::SaleRepair(args) => Ok(repair_cmd::repair(config, &args)?),
        cli::Command::Run => Ok(run_cmd::run(config, shutdown)?),
        cli::Command::Findings(args) => Ok(findings_cmd::findings(config, &args)?),
        cli::Command::Resolve(args) => Ok(resolve_cmd::resolve(config, &args)?),
        cli::Command::BenchRead(id) => Ok(bench_read::bench_read(config, id)?),
        cli::Command::TokenKeygen(args) => Ok(token_cmd::keygen(&args)?),
        cli::Command::TokenIssue(args) => Ok(token_cmd::issue(&args, &config.auth_audience)?),
    }
}
