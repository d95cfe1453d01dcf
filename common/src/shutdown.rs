//! Owns the process's signals: a cloneable "stop now" flag set by SIGINT
//! (via `ctrlc`) or SIGTERM (systemd's stop), and SIGHUP, which either stops
//! too or, for a service that reloads its files ([`Hangup::Reload`]), sets a
//! [`Reload`] request instead. SIGTERM and SIGHUP are read by one thread
//! through `signal-hook`'s iterator: `ctrlc`'s own SIGTERM handling would
//! also take SIGHUP as a stop, with no way to tell the two apart.

use signal_hook::consts::{SIGHUP, SIGTERM};
use signal_hook::iterator::Signals;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A shared "stop now" flag. Threads poll [`Shutdown::is_triggered`] between
/// units of work; tests and `run` callers trigger it directly.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

/// What SIGHUP does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hangup {
    /// Stops the process, as SIGTERM does.
    Stop,
    /// Asks it to read its files again ([`Reload::take`]); it keeps running.
    Reload,
}

/// SIGHUPs received and not yet acted on (a service that reloads polls it).
#[derive(Debug, Clone, Default)]
pub struct Reload(Arc<AtomicU64>);

impl Reload {
    /// A request as SIGHUP makes it (tests and callers may request too).
    pub fn request(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a reload was requested since the last call (several SIGHUPs
    /// in between are one reload).
    pub fn take(&self) -> bool {
        self.0.swap(0, Ordering::AcqRel) > 0
    }
}

/// Why the signal handlers could not be installed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SignalError {
    /// The SIGINT handler (`ctrlc`).
    Interrupt(ctrlc::Error),
    /// The SIGTERM/SIGHUP reader (`signal-hook`) or its thread.
    Terminate(std::io::Error),
}

impl fmt::Display for SignalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignalError::Interrupt(e) => write!(f, "SIGINT: {e}"),
            SignalError::Terminate(e) => write!(f, "SIGTERM/SIGHUP: {e}"),
        }
    }
}

impl std::error::Error for SignalError {}

impl Shutdown {
    /// A flag that is not yet triggered and is tied to no signal.
    pub fn new() -> Self {
        Shutdown::default()
    }

    /// A flag set by SIGINT, SIGTERM or SIGHUP; `on_signal` runs once per
    /// signal after the flag is set (e.g. to unblock a server). Only one
    /// handler may be installed per process.
    ///
    /// Errors: the handler could not be installed.
    pub fn install<F>(on_signal: F) -> Result<Shutdown, SignalError>
    where
        F: Fn() + Send + Sync + 'static,
    {
        Shutdown::install_with(on_signal, Hangup::Stop).map(|(s, _)| s)
    }

    /// As [`Shutdown::install`], with SIGHUP doing what `hangup` says; the
    /// [`Reload`] it sets (never set with [`Hangup::Stop`]).
    ///
    /// Errors: a handler could not be installed.
    pub fn install_with<F>(on_signal: F, hangup: Hangup) -> Result<(Shutdown, Reload), SignalError>
    where
        F: Fn() + Send + Sync + 'static,
    {
        let s = Shutdown::new();
        let reload = Reload::default();
        let on_signal = Arc::new(on_signal);
        let (flag, then) = (s.clone(), Arc::clone(&on_signal));
        ctrlc::set_handler(move || {
            flag.trigger();
            then();
        })
        .map_err(SignalError::Interrupt)?;
        let mut signals = Signals::new([SIGTERM, SIGHUP]).map_err(SignalError::Terminate)?;
        let (flag, requests) = (s.clone(), reload.clone());
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    if signal == SIGHUP && hangup == Hangup::Reload {
                        log::info!("SIGHUP: reloading");
                        requests.request();
                        continue;
                    }
                    flag.trigger();
                    on_signal();
                }
            })
            .map_err(SignalError::Terminate)?;
        Ok((s, reload))
    }

    /// Sets the flag.
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is set.
    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Starts logging to stderr (journald keeps it) at `RUST_LOG`, default `info`.
pub fn init_logging() {
    let env = env_logger::Env::default().default_filter_or("info");
    let _ = env_logger::Builder::from_env(env)
        .format_timestamp_millis()
        .try_init();
}
