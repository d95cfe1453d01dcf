//! `seckill-reconciler`: the operator's command, as a library its thin
//! `main` (src/main.rs) runs: parse the command line ([`cli`]), read the
//! configuration, run the command ([`cmd::run`]), map its result to an exit
//! code ([`error::RunError::exit_code`]).
//!
//! Exit codes, one rule for every command: 0 success (for `run`: no open
//! findings); 1 a person must look: `run` found open findings, or a command
//! refused what it was asked because of the state it found, nothing changed
//! ([`error::EXIT_REFUSED`]: `resolve`, `sale repair`, `sale archive`, `sale
//! load`, `sale rebalance`, `sale pause/resume/end/extend/add-stock`,
//! `dead-letter requeue payments`); 2 could not run (Redis, MySQL or SQLite
//! error, bad configuration, a sale, finding or dead letter that does not
//! exist); 64 bad command line (one line saying what is wrong, then a
//! pointer to `--help`).
//!
//! # Layout
//!
//! - [`cli`]: the command line, lexed, then validated into a typed
//!   [`cli::Command`] by each command's own `parse` (in [`cmd`]).
//! - [`cli_help`]: every command's help text, one entry each.
//! - [`config`]: the reconciler's settings (the shared Redis and MySQL
//!   ones, and its own), resolved from the raw environment.
//! - [`cmd`]: the commands, one file each (`cmd/run/` is `run`,
//!   `cmd/sale_load.rs` is `sale load`, ...), and the dispatch. No command
//!   file uses another: what two commands share is below.
//! - Shared by the commands: [`connect`] (the Redis and MySQL links),
//!   [`sale_read`] (one sale as MySQL holds it), [`sale_archive`] (the
//!   archive's rules and steps, by hand and by `run`),
//!   [`sale_admin_settle`] (the write-ahead of an operator's change to a
//!   sale), [`payment_dead_letters`] (the payment dead letters as listed
//!   and settled).
//! - Reconciliation: [`scan`] reads one sale in its documented order into
//!   one value; [`rules`] holds one file per rule turning it into
//!   observations; [`compensate`] is the one automatic fix.
//! - Reading: [`replica_read`] (each sale screened on the MySQL replica,
//!   confirmed on the primary), [`redis_read`] (`SSCAN`/`HSCAN`/`LRANGE` in chunks, never
//!   `KEYS`), [`mysql_read`] (streamed `SELECT`s), [`bucket_read`] (a sale
//!   split over buckets: totals at one instant, transfer books),
//!   [`primary_down`] (no writable primary: what a run says, the replica
//!   the read-only commands read meanwhile).
//! - The review store: [`review`] (file, migrations, runs, the append-only
//!   audit log, one write transaction), [`review::findings`] (the findings
//!   table), [`stored`] (its enums as stored names).
//! - Operator actions: [`settle`] (write-ahead audit: started row, effect,
//!   completion), [`dead_letter_archive`] (settled dead letters), [`lock`]
//!   (the run lock in Redis).
//! - [`metrics_file`]: the figures `run` leaves for Prometheus
//!   (node_exporter's textfile collector).
//! - [`error`], [`output`]: the one error enum of every command (and its
//!   exit code), and stdout that tolerates a closed pipe.
//! - [`repair_rebuild`], [`recreate`], [`unordered`]: what `sale repair` and
//!   `resolve --recreate` write.
#![forbid(unsafe_code)]

mod bucket_read;
pub mod cli;
pub mod cli_help;
pub mod cmd;
mod compensate;
pub mod config;
pub mod connect;
mod dead_letter_archive;
pub mod error;
mod lock;
mod metrics_file;
pub mod mysql_read;
pub mod output;
mod payment_dead_letters;
mod primary_down;
mod recreate;
pub mod redis_read;
mod repair_rebuild;
mod replica_read;
mod replica_rows;
mod review;
mod rules;
mod sale_admin_cli;
mod sale_admin_settle;
mod sale_archive;
mod sale_read;
mod scan;
mod settle;
mod stored;
mod unordered;
