//! Owns recording one sale's observations of a `run` in the review store:
//! findings opened, seen again or reopened, compensations logged, findings
//! no longer seen closed, one SQLite transaction per sale.

use crate::error::RunError;
use crate::review::findings::{FindingState, Observation};
use crate::review::{ActionKind, ActionStatus, Review, RunCounts};
use seckill_common::now_ms;
use seckill_common::timefmt::format_ms;

/// Records one sale's observations in one SQLite transaction, logs each
/// compensation in `actions`, and (with `close_unseen`) closes the sale's
/// findings no longer seen.
pub fn record(
    review: &Review,
    run_id: i64,
    sale_id: u64,
    observations: &[Observation],
    counts: &mut RunCounts,
    close_unseen: bool,
) -> Result<(), RunError> {
    let now = format_ms(now_ms());
    review.immediate(|| -> Result<(), RunError> {
        for o in observations {
            let rec = review.record_observation(o, run_id, &now)?;
            // A finding settled for good (dismissed) stays closed: seen
            // again, it is no news for the run's line.
            if rec.state != FindingState::Resolved {
                counts.by_kind[o.kind.index()] += 1;
            }
            if rec.is_new {
                counts.new_findings += 1;
            }
            if rec.reopened {
                counts.reopened += 1;
                log::warn!(
                    "finding {} reopened: observed again after it was closed",
                    rec.id
                );
            }
            if let Some(fix) = &o.fixed {
                counts.auto_fixed += 1;
                review.record_action(
                    &now,
                    "reconciler",
                    rec.id,
                    ActionKind::Compensate,
                    fix,
                    ActionStatus::Done,
                    None,
                )?;
            }
        }
        if close_unseen {
            review.close_unobserved(sale_id, run_id, &now)?;
        }
        Ok(())
    })
}
