//! Owns the capped exponential backoff every retry loop uses (the worker's
//! MySQL and Redis retries, the gateway's Redis reconnects).
//!
//! Shape: the first delay is `base`, each further one doubles, up to `cap`;
//! [`Backoff::reset`] starts over at `base`. No jitter: each process has
//! only a handful of retry loops, so there are no herds to spread. The
//! policies in use (set by their callers): the worker, base 20 ms and cap
//! 1,000 ms; the gateway's Redis link, base 50 ms and cap 1,000 ms.

use crate::Shutdown;
use std::time::{Duration, Instant};

/// Longest single sleep of [`Backoff::sleep`] before it looks at the
/// shutdown flag again.
pub const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// Capped exponential backoff: `base`, `2 × base`, `4 × base`, ... up to
/// `cap`, no jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff whose first delay is `base` and whose delays never exceed
    /// `cap` (a `base` above `cap` is lowered to it).
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        let base = if base.as_nanos() > cap.as_nanos() {
            cap
        } else {
            base
        };
        Backoff {
            base,
            cap,
            next: base,
        }
    }

    /// The delay to wait now; the one after it is doubled (at most `cap`).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.cap);
        d
    }

    /// Starts over: the next delay is `base` again (after a success).
    pub fn reset(&mut self) {
        self.next = self.base;
    }

    /// Sleeps the next delay in slices of at most [`SLEEP_SLICE`]; `false`
    /// when `shutdown` was set before or during it (the sleep then ends at
    /// once), `true` when the whole delay passed.
    pub fn sleep(&mut self, shutdown: &Shutdown) -> bool {
        sleep_unless(self.next_delay(), shutdown)
    }
}

/// Sleeps `d` in slices of at most [`SLEEP_SLICE`]; `false` when `shutdown`
/// was set before or during it, `true` when the whole of `d` passed.
pub fn sleep_unless(d: Duration, shutdown: &Shutdown) -> bool {
    let until = Instant::now() + d;
    while !shutdown.is_triggered() {
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(SLEEP_SLICE));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_base_up_to_cap_and_resets() {
        let mut b = Backoff::new(20 * MS, 1000 * MS);
        let got: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), 20 * MS);
        let mut g = Backoff::new(50 * MS, 1000 * MS);
        let got: Vec<u128> = (0..6).map(|_| g.next_delay().as_millis()).collect();
        assert_eq!(got, [50, 100, 200, 400, 800, 1000]);
    }

    #[test]
    fn a_base_above_the_cap_is_the_cap() {
        let mut b = Backoff::new(5000 * MS, 1000 * MS);
        assert_eq!(b.next_delay(), 1000 * MS);
        assert_eq!(b.next_delay(), 1000 * MS);
    }

    #[test]
    fn a_triggered_shutdown_ends_the_sleep_with_false() {
        let s = Shutdown::new();
        s.trigger();
        let mut b = Backoff::new(60_000 * MS, 60_000 * MS);
        assert!(!b.sleep(&s));
        assert!(sleep_unless(Duration::ZERO, &Shutdown::new()));
    }
}
