//! Owns what every binary does before and after its work: logging, the
//! configuration from the environment, the SIGINT/SIGTERM handler, and the
//! exit codes all three binaries share (each binary's crate doc lists which
//! of its failures map to which).

use crate::config::Env;
use crate::{Config, ConfigError, Shutdown};
use std::fmt::Display;
use std::process::ExitCode;

/// Exit code of a failure while running (Redis, MySQL, I/O).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code of bad configuration (a `SECKILL_*` variable, a URL, a port
/// that cannot be listened on): the unit should not be restarted as is.
pub const EXIT_CONFIG: u8 = 2;
/// Exit code of a bad command line (BSD `sysexits.h` `EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

/// What a binary starts with: `C` is its own settings (the gateway's
/// [`Config`], the worker's and the reconciler's in their crates).
pub struct Started<C = Config> {
    /// The configuration read from `SECKILL_*`.
    pub config: C,
    /// Set by SIGINT or SIGTERM (and SIGHUP unless it reloads).
    pub shutdown: Shutdown,
    /// Set by SIGHUP when the binary reloads ([`start_reloading`]).
    pub reload: crate::shutdown::Reload,
}

/// Why a binary could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// A `SECKILL_*` variable is invalid.
    Config(crate::ConfigError),
    /// The SIGINT/SIGTERM/SIGHUP handlers could not be installed.
    Signal(crate::shutdown::SignalError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "{e}"),
            StartError::Signal(e) => write!(f, "signal handler: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

impl StartError {
    /// The exit code of the gateway and the worker for it: [`EXIT_CONFIG`]
    /// for configuration, [`EXIT_FAILURE`] for the handler.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Config(_) => EXIT_CONFIG,
            StartError::Signal(_) => EXIT_FAILURE,
        }
    }
}

/// The command line of a service (the gateway, the worker), configured by
/// `SECKILL_*` variables only: none runs it; `-h`/`--help` prints `usage`
/// and `-V`/`--version` the version, both exit 0; anything else is refused
/// with exit [`EXIT_USAGE`] (a service started with a flag it ignored
/// would run on defaults that may name someone else's Redis).
///
/// Returns `Some(code)` when the process should exit now, `None` to run.
pub fn command_line(program: &str, usage: &str) -> Option<ExitCode> {
    let first = std::env::args_os().nth(1)?;
    match first.to_str() {
        Some("-h" | "--help") => {
            println!("{usage}");
            Some(ExitCode::SUCCESS)
        }
        Some("-V" | "--version") => {
            println!("{program} {}", env!("CARGO_PKG_VERSION"));
            Some(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!(
                "{program}: unexpected argument {first:?}: configure it with SECKILL_* \
                 variables (README, \"Configuration\"); --help"
            );
            Some(ExitCode::from(EXIT_USAGE))
        }
    }
}

/// Starts logging, reads the configuration and installs the signal handler
/// (`on_signal` runs after the flag is set, once per signal).
///
/// Errors: [`StartError`]; nothing is written (see [`fail`]).
pub fn start(on_signal: impl Fn() + Send + Sync + 'static) -> Result<Started, StartError> {
    start_with(Config::from_vars, on_signal, crate::shutdown::Hangup::Stop)
}

/// As [`start`], with the binary's own settings resolved from the raw
/// environment by `resolve` (the worker's, the reconciler's): a binary
/// reads only the variables it uses.
///
/// Errors: [`StartError`].
pub fn start_as<C>(
    resolve: impl FnOnce(&Env) -> Result<C, ConfigError>,
    on_signal: impl Fn() + Send + Sync + 'static,
) -> Result<Started<C>, StartError> {
    start_with(resolve, on_signal, crate::shutdown::Hangup::Stop)
}

/// As [`start`], with SIGHUP a reload request ([`Started::reload`]) instead
/// of a stop: for a service that reads files it can swap while running.
///
/// Errors: [`StartError`].
pub fn start_reloading(
    on_signal: impl Fn() + Send + Sync + 'static,
) -> Result<Started, StartError> {
    start_with(
        Config::from_vars,
        on_signal,
        crate::shutdown::Hangup::Reload,
    )
}

fn start_with<C>(
    resolve: impl FnOnce(&Env) -> Result<C, ConfigError>,
    on_signal: impl Fn() + Send + Sync + 'static,
    hangup: crate::shutdown::Hangup,
) -> Result<Started<C>, StartError> {
    crate::shutdown::init_logging();
    let config = resolve(&Env::from_env()).map_err(StartError::Config)?;
    let (shutdown, reload) =
        Shutdown::install_with(on_signal, hangup).map_err(StartError::Signal)?;
    Ok(Started {
        config,
        shutdown,
        reload,
    })
}

/// The exit code of a binary's result: `Ok(code)` as is; an error as one
/// line `PROGRAM: error` on stderr and `code_of(&error)`.
pub fn finish<E: Display>(
    program: &str,
    result: Result<u8, E>,
    code_of: impl FnOnce(&E) -> u8,
) -> ExitCode {
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let code = code_of(&e);
            fail(program, &e, code)
        }
    }
}

/// Writes `PROGRAM: what` on stderr and returns `code` as an exit code.
pub fn fail(program: &str, what: &dyn Display, code: u8) -> ExitCode {
    eprintln!("{program}: {what}");
    ExitCode::from(code)
}
