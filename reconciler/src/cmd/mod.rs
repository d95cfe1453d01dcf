//! Owns the commands: one file each, holding its arguments, their
//! validation from the lexed command line (a `parse` that `cli.rs`'s
//! dispatch calls; a command whose only argument is an id is validated in
//! that dispatch itself, `sale pause/resume/end/extend/add-stock` in
//! `sale_admin_cli.rs`) and its action, and [`run`], which dispatches a
//! parsed [`Command`]. A command opens its links through `connect.rs` and reads
//! sales through `sale_read.rs`; no command file uses another.

pub mod archive;
pub mod dead_letter;
pub mod findings;
pub mod migrate;
pub mod payment_dlq;
pub mod queue;
pub mod rebalance;
pub mod repair;
pub mod resolve;
pub mod resolve_all;
pub mod run;
pub mod sale_admin;
pub mod sale_create;
pub mod sale_dlq;
pub mod sale_list;
pub mod sale_load;
pub mod sale_show;
pub mod token;

use crate::cli::Command;
use crate::config::Config;
use crate::error::RunError;
use seckill_common::Shutdown;

/// Whether `cmd` opens Redis or MySQL, so needs `SECKILL_REDIS_*` and
/// `SECKILL_MYSQL_*` read (`main.rs`): `false` for help, the token
/// commands (key files only) and `findings` (the review file only), which
/// a malformed service URL does not stop. Every command is named, so a new
/// one must be placed.
pub fn opens_services(cmd: &Command) -> bool {
    match cmd {
        Command::Help(_)
        | Command::TokenKeygen(_)
        | Command::TokenIssue(_)
        | Command::Findings(_)
        | Command::FindingsShow(..) => false,
        Command::Migrate
        | Command::SaleCreate(_)
        | Command::SaleLoad(..)
        | Command::SaleRebalance(_)
        | Command::SaleShow(_)
        | Command::SaleRepair(_)
        | Command::SaleArchive(..)
        | Command::SaleList
        | Command::SaleAdmin(_)
        | Command::Run
        | Command::QueueShow(_)
        | Command::DeadLetterList(_)
        | Command::PaymentDeadLetter(_)
        | Command::SaleDeadLetterDrop(_)
        | Command::Resolve(_)
        | Command::ResolveAll(_) => true,
    }
}

/// Runs one command; `Ok(code)` is the exit code of a command that ran
/// (the crate doc lists them).
///
/// Errors: [`RunError`]: the command could not run, or refused.
pub fn run(config: &Config, shutdown: &Shutdown, cmd: Command) -> Result<u8, RunError> {
    match cmd {
        Command::Help(_) => Ok(0),
        Command::Migrate => migrate::run(config),
        Command::SaleCreate(args) => sale_create::run(config, &args),
        Command::SaleLoad(id, k) => sale_load::run(config, id, k),
        Command::SaleRebalance(id) => rebalance::run(config, id),
        Command::SaleShow(id) => sale_show::run(config, id),
        Command::SaleRepair(args) => repair::run(config, &args),
        Command::SaleArchive(id, by) => archive::run(config, id, &by),
        Command::SaleList => sale_list::run(config),
        Command::SaleAdmin(args) => sale_admin::run(config, &args),
        Command::Run => run::run(config, shutdown),
        Command::Findings(args) => findings::run(config, &args),
        Command::FindingsShow(id, json) => findings::show(config, id, json),
        Command::QueueShow(sale) => queue::run(config, sale),
        Command::DeadLetterList(which) => dead_letter::run(config, which),
        Command::PaymentDeadLetter(args) => payment_dlq::run(config, &args),
        Command::SaleDeadLetterDrop(args) => sale_dlq::run(config, &args),
        Command::Resolve(args) => resolve::run(config, &args),
        Command::ResolveAll(args) => resolve_all::run(config, &args),
        Command::TokenKeygen(args) => Ok(token::keygen(&args)?),
        Command::TokenIssue(args) => Ok(token::issue(
            &args,
            &config.auth_audience,
            config.auth_max_ttl,
        )?),
    }
}
