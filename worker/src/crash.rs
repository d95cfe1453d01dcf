//! Owns the test-only crash points: `SECKILL_WORKER_CRASH_AT` makes the
//! worker abort (as under `kill -9`) or stop itself (`SIGSTOP`) the first
//! time it reaches a chosen moment of a batch, so the crash tests are exact.
//!
//! They exist only in a build with the cargo feature `crash-points`, which
//! nothing enables by default and no crate depends on: only the test build
//! names it (`scripts/test.sh` builds and tests with
//! `--features seckill-worker/crash-points`). A build without it, such as
//! `cargo build --release`, has no code that aborts or stops the process:
//! it logs that it ignores the variable and runs normally.

/// The variable that arms a crash point (test builds only).
pub const ENV: &str = "SECKILL_WORKER_CRASH_AT";

/// Whether this build has crash points (the `crash-points` feature).
pub const COMPILED_IN: bool = cfg!(feature = "crash-points");

/// A moment of a batch a crash point can be armed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// A batch was moved into the processing list; MySQL not touched yet.
    AfterMove,
    /// MySQL committed the batch; Redis not settled yet.
    AfterCommit,
    /// Like `AfterMove`, but the process stops itself (`SIGSTOP`) instead,
    /// to test a paused worker that resumes after being reclaimed; fires
    /// once.
    StopAfterMove,
    /// The expiry sweep expired orders in MySQL; their Redis step not done.
    ExpireAfterMysql,
    /// The expiry sweep did one release's Redis step; MySQL does not know
    /// yet that it is done.
    ExpireAfterRedis,
}

impl CrashPoint {
    /// The value of [`ENV`] that arms this point.
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::AfterMove => "after_move",
            CrashPoint::AfterCommit => "after_commit",
            CrashPoint::StopAfterMove => "stop_after_move",
            CrashPoint::ExpireAfterMysql => "expire_after_mysql",
            CrashPoint::ExpireAfterRedis => "expire_after_redis",
        }
    }
}

/// The crash point this process is armed with, if any.
#[derive(Debug, Default)]
pub struct CrashPoints {
    armed: Option<CrashPoint>,
}

impl CrashPoints {
    /// Reads [`ENV`] (see [`CrashPoints::from_value`]).
    pub fn from_env() -> CrashPoints {
        CrashPoints::from_value(std::env::var(ENV).ok().as_deref())
    }

    /// Arms the point `value` names (`after_move`, `after_commit`,
    /// `stop_after_move`, `expire_after_mysql`, `expire_after_redis`) in a build with crash points, and logs it
    /// (`crash point armed: SECKILL_WORKER_CRASH_AT=...`, which the test
    /// harness waits for). Any other value, and every value in a build
    /// without them, arms nothing and is logged as ignored.
    pub fn from_value(value: Option<&str>) -> CrashPoints {
        let Some(value) = value else {
            return CrashPoints::default();
        };
        if !COMPILED_IN {
            log::warn!(
                "{ENV}={value} ignored: this build has no crash points \
                 (built without the crash-points feature)"
            );
            return CrashPoints::default();
        }
        let points = [
            CrashPoint::AfterMove,
            CrashPoint::AfterCommit,
            CrashPoint::StopAfterMove,
            CrashPoint::ExpireAfterMysql,
            CrashPoint::ExpireAfterRedis,
        ];
        let armed = points.into_iter().find(|p| p.as_str() == value);
        match armed {
            Some(_) => log::warn!("crash point armed: {ENV}={value} (tests only)"),
            None => log::warn!(
                "{ENV}={value} ignored: not a crash point (after_move, after_commit, \
                 stop_after_move, expire_after_mysql, expire_after_redis)"
            ),
        }
        CrashPoints { armed }
    }

    /// The armed point (always `None` in a build without crash points).
    pub fn armed(&self) -> Option<CrashPoint> {
        self.armed
    }

    /// The worker reached `point`: aborts when armed there, stops itself once when `StopAfterMove` is armed
    /// and `point` is `AfterMove`.
    #[cfg(feature = "crash-points")]
    pub fn reached(&mut self, point: CrashPoint) {
        match (self.armed, point) {
            (Some(CrashPoint::AfterMove), CrashPoint::AfterMove)
            | (Some(CrashPoint::AfterCommit), CrashPoint::AfterCommit)
            | (Some(CrashPoint::ExpireAfterMysql), CrashPoint::ExpireAfterMysql)
            | (Some(CrashPoint::ExpireAfterRedis), CrashPoint::ExpireAfterRedis) => {
                log::error!("test crash point {point:?} reached: aborting");
                std::process::abort();
            }
            (Some(CrashPoint::StopAfterMove), CrashPoint::AfterMove) => {
                self.armed = None;
                log::warn!("test crash point {point:?} reached: stopping myself");
                let pid = std::process::id().to_string();
                let _ = std::process::Command::new("kill")
                    .args(["-STOP", &pid])
                    .status();
            }
            _ => {}
        }
    }

    /// Nothing: this build has no crash points.
    #[cfg(not(feature = "crash-points"))]
    #[inline(always)]
    pub fn reached(&mut self, _point: CrashPoint) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs in the release configuration (`cargo test -p seckill-worker`,
    /// which `scripts/test.sh` runs without the feature).
    #[cfg(not(feature = "crash-points"))]
    #[test]
    fn without_the_feature_every_value_is_ignored() {
        const { assert!(!COMPILED_IN) };
        for v in ["after_move", "after_commit", "stop_after_move"] {
            assert_eq!(CrashPoints::from_value(Some(v)).armed(), None, "{v}");
        }
    }

    #[cfg(feature = "crash-points")]
    #[test]
    fn with_the_feature_each_value_arms_its_point() {
        const { assert!(COMPILED_IN) };
        for p in [
            CrashPoint::AfterMove,
            CrashPoint::AfterCommit,
            CrashPoint::StopAfterMove,
        ] {
            assert_eq!(CrashPoints::from_value(Some(p.as_str())).armed(), Some(p));
        }
        assert_eq!(CrashPoints::from_value(Some("after_lunch")).armed(), None);
    }

    #[test]
    fn no_variable_arms_nothing() {
        assert_eq!(CrashPoints::from_value(None).armed(), None);
    }
}
