//! Owns `sale pause | resume | end | extend | add-stock`: the checks,
//! `--dry-run`, and the change run written ahead (`sale_admin_settle.rs`).
//! A checked refusal or a change with nothing to do is one audit row
//! (`refused`, `no_change`) and no effect.

use crate::config::Config;
use crate::connect;
use crate::error::{RunError, EXIT_REFUSED};
use crate::output::outln;
use crate::review::{ActionKind, ActionStatus, Review};
use crate::sale_admin_cli::{AdminChange, SaleAdminArgs};
use crate::sale_admin_settle::{complete_pending, written_ahead};
use crate::sale_read::{sale_now, SaleNow};
use crate::settle::Outcome;
use seckill_common::now_ms;
use seckill_common::sale_admin::{self, Change, END_MARGIN_MS};
use seckill_common::timefmt::format_ms;

/// Longest sale window: as `sale create` allows.
const MAX_WINDOW_MS: u64 = crate::cli::MAX_WINDOW_MS;

/// What the checks decided.
enum Checked {
    /// Recorded as is, no effect (`refused` or `no_change`).
    Final(Outcome),
    /// The change may go ahead; `would` says what it does.
    Go { change: Change, would: String },
}

/// The audit kind of a change.
fn kind(c: &AdminChange) -> ActionKind {
    match c {
        AdminChange::Pause(_) => ActionKind::Pause,
        AdminChange::Resume => ActionKind::Resume,
        AdminChange::End => ActionKind::End,
        AdminChange::Extend(_) => ActionKind::Extend,
        AdminChange::AddStock(_) => ActionKind::AddStock,
    }
}

/// Runs one change; exit 0 done (or nothing to do), 1 refused, the same
/// for `--dry-run` (which records nothing).
///
/// Errors: Redis, MySQL or SQLite failures ([`RunError`], exit 2);
/// [`RunError::Refused`] for a sale MySQL does not hold.
pub fn run(config: &Config, a: &SaleAdminArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let mut db = connect::mysql(&config.services)?;
    let mut redis = connect::redis(&config.services)?;
    if !a.dry_run {
        complete_pending(&review, &mut redis, &mut db)?;
    }
    let Some(s) = sale_now(&mut db, a.sale_id)? else {
        return Err(RunError::NoSuch(format!(
            "no sale {} in MySQL: `seckill-reconciler sale list` shows the sales",
            a.sale_id
        )));
    };
    let buckets = seckill_common::data_loss::bucket_count(&mut redis, &mut db, a.sale_id)?;
    // Redis's clock: the one the reservation script judges the window by.
    let now = sale_admin::redis_now_ms(&mut redis)?;
    let checked = check(&review, a, &s, buckets, now)?;
    let action = kind(&a.change);
    let outcome = match checked {
        Checked::Final(o) if a.dry_run => o,
        Checked::Final(o) => {
            let at = format_ms(now_ms());
            review.record_sale_action(&at, &a.by, a.sale_id, action, &o.text, o.status, None)?;
            o
        }
        Checked::Go { would, .. } if a.dry_run => Outcome::done(would),
        Checked::Go { change, would } => written_ahead(
            &review, &mut redis, &mut db, a, action, buckets, &change, &would,
        )?,
    };
    if outcome.status == ActionStatus::Refused {
        eprintln!(
            "seckill-reconciler: refused: {}; nothing changed",
            outcome.text
        );
        return Ok(EXIT_REFUSED);
    }
    if a.dry_run {
        outln!("dry run, nothing changed: {}", outcome.text);
    } else {
        outln!("{}: {}", outcome.status.as_str(), outcome.text);
    }
    Ok(0)
}

/// The checks of change `a` on sale `s` (of `buckets` buckets) at `now`.
fn check(
    review: &Review,
    a: &SaleAdminArgs,
    s: &SaleNow,
    buckets: u32,
    now: u64,
) -> Result<Checked, RunError> {
    let id = a.sale_id;
    if let Some(by) = &s.archived_by {
        return refused(format!(
            "sale {id} was archived by {by}: it takes no change"
        ));
    }
    match &a.change {
        AdminChange::Pause(reason) => check_pause(id, s, reason, now),
        AdminChange::Resume => check_resume(review, id, s, now),
        AdminChange::End => check_end(id, s, now),
        AdminChange::Extend(t) => check_extend(id, s, *t),
        AdminChange::AddStock(n) => check_add_stock(review, id, s, *n, buckets, now),
    }
}

/// A refusal with text `t`.
fn refused(t: String) -> Result<Checked, RunError> {
    Ok(Checked::Final(Outcome::refused(t)))
}

/// Nothing to do (the sale is as asked already), with text `t`.
fn no_change(t: String) -> Result<Checked, RunError> {
    Ok(Checked::Final(Outcome::no_change(t)))
}

/// Pausing sale `id` for `reason` at `now`: refused once it has ended
/// (its buyers hear 403 sale_ended; a pause would turn that into 503
/// sale_paused, which tells them to retry), nothing to do when paused
/// already.
fn check_pause(id: u64, s: &SaleNow, reason: &str, now: u64) -> Result<Checked, RunError> {
    if s.ends_at_ms <= now {
        return refused(format!(
            "sale {id} ended at {}: its purchases are answered 403 sale_ended already \
             (`sale extend {id} --ends-at T` opens it again)",
            format_ms(s.ends_at_ms)
        ));
    }
    match (&s.paused_reason, &s.paused_by) {
        (Some(r), by) => no_change(format!(
            "sale {id} is paused already (by {}: {r})",
            by.as_deref().unwrap_or("?")
        )),
        (None, _) => Ok(Checked::Go {
            change: Change::Pause {
                reason: reason.to_string(),
            },
            would: format!(
                "pause sale {id} ({reason}): purchases answered 503 sale_paused until \
                 `sale resume {id}`"
            ),
        }),
    }
}

/// Resuming sale `id` at `now`: refused while Redis's loss of its data is
/// open (that pause ends by `sale repair`), nothing to do unless an
/// operator paused it; the answer of an ended sale says it takes no
/// purchase.
fn check_resume(review: &Review, id: u64, s: &SaleNow, now: u64) -> Result<Checked, RunError> {
    if let Some(f) = review.open_data_loss(id)? {
        return refused(format!(
            "sale {id} has an open redis_data_loss finding ({f}): `seckill-reconciler \
             sale repair {id} --by NAME` ends that pause"
        ));
    }
    if let Some(r) = &s.data_loss {
        return refused(format!(
            "sale {id} is paused because Redis lost data of it ({r}): \
             `seckill-reconciler run`, then `sale repair {id} --by NAME`"
        ));
    }
    match &s.paused_reason {
        None => no_change(format!("sale {id} is not paused by an operator")),
        Some(r) if s.ends_at_ms <= now => Ok(Checked::Go {
            change: Change::Resume,
            would: format!(
                "resume sale {id} (paused: {r}): it ended at {}, purchases answered 403 \
                 sale_ended",
                format_ms(s.ends_at_ms)
            ),
        }),
        Some(r) => Ok(Checked::Go {
            change: Change::Resume,
            would: format!("resume sale {id} (paused: {r}): purchases taken again"),
        }),
    }
}

/// Ending sale `id` whose Redis clock reads `now`: at `now` plus
/// [`END_MARGIN_MS`] (never before its start), so that every bucket holds
/// the end before it arrives (`seckill_common::sale_admin`); nothing to do
/// when it has ended or ends by then.
fn check_end(id: u64, s: &SaleNow, now: u64) -> Result<Checked, RunError> {
    if s.ends_at_ms <= now {
        return no_change(format!(
            "sale {id} ended already at {}",
            format_ms(s.ends_at_ms)
        ));
    }
    let at = (now + END_MARGIN_MS).max(s.starts_at_ms + 1);
    if s.ends_at_ms <= at {
        return no_change(format!(
            "sale {id} ends at {} already, within {END_MARGIN_MS} ms",
            format_ms(s.ends_at_ms)
        ));
    }
    Ok(Checked::Go {
        change: Change::EndAt { ends_at_ms: at },
        would: format!(
            "end sale {id} at {} (was {}; Redis's clock + {END_MARGIN_MS} ms, in every bucket \
             before it arrives): later purchases answered 403 sale_ended",
            format_ms(at),
            format_ms(s.ends_at_ms)
        ),
    })
}

/// Moving sale `id`'s end to `t`: only later, and within the longest
/// window.
fn check_extend(id: u64, s: &SaleNow, t: u64) -> Result<Checked, RunError> {
    if t == s.ends_at_ms {
        return no_change(format!("sale {id} ends at {} already", format_ms(t)));
    }
    if t < s.ends_at_ms {
        return refused(format!(
            "--ends-at {} is before the sale's end {}: `sale end {id}` ends it now",
            format_ms(t),
            format_ms(s.ends_at_ms)
        ));
    }
    if t - s.starts_at_ms > MAX_WINDOW_MS {
        return refused(format!(
            "--ends-at {}: the sale window would be longer than 366 days",
            format_ms(t)
        ));
    }
    Ok(Checked::Go {
        change: Change::EndAt { ends_at_ms: t },
        would: format!(
            "extend sale {id} to {} (was {})",
            format_ms(t),
            format_ms(s.ends_at_ms)
        ),
    })
}

/// Adding `n` units to sale `id` (of `buckets` buckets): refused once it
/// has ended, while Redis's loss of its data is open, or past the most
/// stock a sale takes.
fn check_add_stock(
    review: &Review,
    id: u64,
    s: &SaleNow,
    n: u64,
    buckets: u32,
    now: u64,
) -> Result<Checked, RunError> {
    if s.ends_at_ms <= now {
        return refused(format!(
            "sale {id} ended at {}: `sale extend {id} --ends-at T` first",
            format_ms(s.ends_at_ms)
        ));
    }
    if s.data_loss.is_some() || review.open_data_loss(id)?.is_some() {
        return refused(format!(
            "sale {id} is paused because Redis lost data of it: `sale repair {id} \
             --by NAME` first"
        ));
    }
    if s.total_stock + n > crate::cli::MAX_STOCK {
        return refused(format!(
            "sale {id} would offer {} units, more than {}",
            s.total_stock + n,
            crate::cli::MAX_STOCK
        ));
    }
    Ok(Checked::Go {
        change: Change::AddStock { units: n },
        would: format!(
            "add {n} unit(s) to sale {id} (total {} -> {}){}",
            s.total_stock,
            s.total_stock + n,
            split_text(s.total_stock, n, buckets)
        ),
    })
}

/// Where added units go in a sale of `buckets` buckets, as text (empty
/// for one bucket).
fn split_text(total_before: u64, n: u64, buckets: u32) -> String {
    if buckets <= 1 {
        return String::new();
    }
    let per: Vec<String> = (0..buckets)
        .map(|b| {
            format!(
                "bucket {b} +{}",
                sale_admin::added_to_bucket(total_before, n, buckets, b)
            )
        })
        .collect();
    format!(", {}", per.join(", "))
}
