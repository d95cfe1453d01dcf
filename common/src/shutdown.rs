//! Owns the shutdown signal: a cloneable flag set by SIGINT or SIGTERM (via
//! `ctrlc` with its `termination` feature, so systemd's stop is caught).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "stop now" flag. Threads poll [`Shutdown::is_triggered`] between
/// units of work; tests and `run` callers trigger it directly.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

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
    pub fn install<F>(on_signal: F) -> Result<Shutdown, ctrlc::Error>
    where
        F: Fn() + Send + 'static,
    {
        let s = Shutdown::new();
        let flag = s.clone();
        ctrlc::set_handler(move || {
            flag.trigger();
            on_signal();
        })?;
        Ok(s)
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
