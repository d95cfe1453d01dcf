//! `seckill-reconciler`: the operator's command. `main` only dispatches:
//! parse the command line (cli.rs), read the configuration, run the command,
//! map its result to an exit code.
//!
//! Exit codes: 0 success (for `run`: no open findings), 1 `run` found open
//! findings, `sale repair` was refused (no open finding yet, or a worker
//! holds messages of the sale) or `sale archive` was refused (the sale not
//! ended a minute ago, an order pending, an open finding, no run since), or
//! `sale load` or `sale rebalance` of an archived sale was refused, or a
//! `sale pause/resume/end/extend/add-stock` was refused, 2 could not run (Redis, MySQL or SQLite error, bad
//! configuration), 64 bad command line (one line saying what is wrong, then
//! a pointer to `--help`).
//!
//! # Layout
//!
//! - [`cli`]: the command line, lexed then validated into a typed
//!   [`cli::Command`], one function per command.
//! - [`cli_help`]: every command's help text, one entry each.
//! - Commands, one file each: [`run_cmd`] (`run`), [`findings_cmd`]
//!   (`findings`, `findings show`), [`resolve_cmd`], [`queue_cmd`] (`queue
//!   show`), [`dead_letter_cmd`] (`dead-letter list`), [`payment_dlq_cmd`]
//!   (`dead-letter requeue|drop payments`), [`sale_cmd`] (`sale create/load/show`), [`repair_cmd`]
//!   (`sale repair`), [`archive_cmd`] (`sale archive`, and `run`'s own),
//!   [`token_cmd`] (`token keygen/issue`), [`bench_read`],
//!   [`sale_list_cmd`] (`sale list`), [`sale_admin_cmd`] (`sale pause /
//!   resume / end / extend / add-stock`, parsed by [`sale_admin_cli`]),
//!   [`buckets_cmd`] (`sale rebalance`, the per-bucket table of `sale show`).
//! - Reconciliation: [`scan`] reads one sale in its documented order into
//!   one value; [`rules`] holds one file per rule turning it into
//!   observations; [`compensate`] is the one automatic fix.
//! - Reading: [`replica_read`] (each sale screened on the MySQL replica,
//!   confirmed on the primary), [`redis_read`] (`SSCAN`/`HSCAN`/`LRANGE` in chunks, never
//!   `KEYS`), [`mysql_read`] (streamed `SELECT`s), [`bucket_read`] (a sale
//!   split over buckets: totals at one instant, transfer books).
//! - The review store: [`review`] (file, migrations, runs, the append-only
//!   audit log, one write transaction), [`review::findings`] (the findings
//!   table), [`stored`] (its enums as stored names).
//! - Operator actions: [`settle`] (write-ahead audit: started row, effect,
//!   completion), [`dead_letter_archive`] (settled dead letters), [`lock`]
//!   (the run lock in Redis).
//! - [`metrics_file`]: the figures `run` leaves for Prometheus
//!   (node_exporter's textfile collector).
//! - [`error`], [`output`]: the error enum and stdout that tolerates a
//!   closed pipe.
#![forbid(unsafe_code)]

mod archive_cmd;
mod bench_read;
mod bucket_read;
mod buckets_cmd;
mod cli;
mod cli_help;
mod compensate;
mod dead_letter_archive;
mod dead_letter_cmd;
mod error;
mod findings_cmd;
mod lock;
mod metrics_file;
mod mysql_read;
mod output;
mod payment_dlq_cmd;
mod queue_cmd;
mod recreate;
mod redis_read;
mod repair_cmd;
mod repair_rebuild;
mod replica_read;
mod resolve_cmd;
mod review;
mod rules;
mod run_cmd;
mod sale_admin_cli;
mod sale_admin_cmd;
mod sale_cmd;
mod sale_list_cmd;
mod scan;
mod settle;
mod stored;
mod token_cmd;
mod unordered;

use seckill_common::start::{self, EXIT_CONFIG, EXIT_USAGE};
use seckill_common::Config;
use std::process::ExitCode;

use cli_help::PROGRAM;

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
        output::outln!("{text}");
        return ExitCode::SUCCESS;
    }
    // Exit 2 for any failure to start: 1 means "open findings" here.
    let started = match start::start(|| {}) {
        Ok(s) => s,
        Err(e) => return start::fail(PROGRAM, &e, EXIT_CONFIG),
    };
    let result = run(&started.config, &started.shutdown, cmd)
        .map_err(|e| error::at_addresses(e, &started.config.mysql_url));
    start::finish(PROGRAM, result, |_| EXIT_CONFIG)
}

/// Runs one command; `Ok(code)` is the exit code of a command that ran.
fn run(
    config: &Config,
    shutdown: &seckill_common::Shutdown,
    cmd: cli::Command,
) -> Result<u8, Box<dyn std::error::Error>> {
    match cmd {
        cli::Command::Help(_) => Ok(0),
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
        cli::Command::SaleLoad(id, k) => sale_cmd::load(config, id, k),
        cli::Command::SaleRebalance(id) => crate::buckets_cmd::rebalance(config, id),
        cli::Command::SaleShow(id) => sale_cmd::show(config, id),
        cli::Command::SaleRepair(args) => Ok(repair_cmd::repair(config, &args)?),
        cli::Command::SaleArchive(id, by) => Ok(archive_cmd::archive_cmd(config, id, &by)?),
        cli::Command::SaleList => Ok(sale_list_cmd::list(config)?),
        cli::Command::SaleAdmin(args) => Ok(sale_admin_cmd::sale_admin(config, &args)?),
        cli::Command::Run => Ok(run_cmd::run(config, shutdown)?),
        cli::Command::Findings(args) => Ok(findings_cmd::findings(config, &args)?),
        cli::Command::QueueShow(sale) => Ok(queue_cmd::show(config, sale)?),
        cli::Command::DeadLetterList(which) => Ok(dead_letter_cmd::list(config, which)?),
        cli::Command::PaymentDeadLetter(args) => Ok(payment_dlq_cmd::settle(config, &args)?),
        cli::Command::FindingsShow(id, json) => Ok(findings_cmd::show(config, id, json)?),
        cli::Command::Resolve(args) => Ok(resolve_cmd::resolve(config, &args)?),
        cli::Command::BenchRead(id) => Ok(bench_read::bench_read(config, id)?),
        cli::Command::TokenKeygen(args) => Ok(token_cmd::keygen(&args)?),
        cli::Command::TokenIssue(args) => Ok(token_cmd::issue(
            &args,
            &config.auth_audience,
            config.auth_max_ttl,
        )?),
    }
}
