//! Owns the audited run of an operator's change to a sale (`sale pause |
//! resume | end | extend | add-stock`): the checks, `--dry-run`, the
//! write-ahead audit, and the completion of a change a killed command left
//! without its completion row. The change itself (MySQL decides, Redis
//! follows) is `seckill_common::sale_admin`.
//!
//! Write-ahead, as `settle.rs` does for a finding: the `started` row (who,
//! what, which sale) is committed first; then, holding the review file's
//! write lock, MySQL's decision (keyed by the started row,
//! `PendingSaleAction::key`), Redis's step in every bucket and the `done`
//! row. A checked refusal or a change with nothing to do is one row
//! (`refused`, `no_change`) and no effect.
//!
//! A `started` row without completion is completed by the next of these
//! commands or `run`, before they act, under the same write lock (so no
//! command is then between its lock and its commit): MySQL's
//! `sale_changes` row of the action says whether the change was decided.
//! Decided: Redis's step is repeated (it follows MySQL's row, and an
//! add-stock's units go in once by the action's mark in each bucket) and
//! the row is `done` under the original actor. Not decided: `failed`,
//! nothing changed. A command still between its started row and its lock
//! finds its row completed and stops without acting.

use crate::error::RunError;
use crate::output::outln;
use crate::review::sale_actions::{action_key, PendingSaleAction};
use crate::review::{ActionKind, ActionStatus, Review};
use crate::sale_admin_cli::{AdminChange, SaleAdminArgs};
use crate::settle::Outcome;
use mysql::prelude::Queryable;
use seckill_common::keys::SaleKeys;
use seckill_common::redis_target::Con;
use seckill_common::sale_admin::{self, Added, Change};
use seckill_common::timefmt::format_ms;
use seckill_common::{now_ms, Config};

/// Longest sale window: as `sale create` allows.
const MAX_WINDOW_MS: u64 = crate::cli::MAX_WINDOW_MS;

/// What MySQL holds of a sale, for the checks.
#[derive(Debug, Clone)]
struct SaleNow {
    starts_at_ms: u64,
    ends_at_ms: u64,
    total_stock: u64,
    paused_reason: Option<String>,
    paused_by: Option<String>,
    archived_by: Option<String>,
    /// The data-loss pause (`sale_redis_state.paused_reason`).
    data_loss: Option<String>,
}

fn sale_now(db: &mut mysql::Conn, id: u64) -> Result<Option<SaleNow>, RunError> {
    type Row = (
        i64,
        i64,
        u64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let row: Option<Row> = db.exec_first(
        "SELECT CAST(UNIX_TIMESTAMP(s.starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(s.ends_at) * 1000 AS SIGNED), s.total_stock,
                s.paused_reason, s.paused_by, s.archived_by, r.paused_reason
         FROM sales s LEFT JOIN sale_redis_state r ON r.sale_id = s.id WHERE s.id = ?",
        (id,),
    )?;
    Ok(row.map(|(s, e, total, pr, pb, ab, dl)| SaleNow {
        starts_at_ms: s.max(0) as u64,
        ends_at_ms: e.max(0) as u64,
        total_stock: total,
        paused_reason: pr,
        paused_by: pb,
        archived_by: ab,
        data_loss: dl,
    }))
}

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
pub fn sale_admin(config: &Config, a: &SaleAdminArgs) -> Result<u8, RunError> {
    let review = Review::open(&config.review_db)?;
    let mut db = seckill_common::schema::connect(&config.mysql_url, config.mysql_timeout)?;
    let mut redis = crate::run_cmd::redis_connect(config)?;
    if !a.dry_run {
        complete_pending(&review, &mut redis, &mut db)?;
    }
    let Some(s) = sale_now(&mut db, a.sale_id)? else {
        return Err(RunError::Refused(format!(
            "no sale {} in MySQL: `seckill-reconciler sale list` shows the sales",
            a.sale_id
        )));
    };
    let buckets = seckill_common::data_loss::bucket_count(&mut redis, &mut db, a.sale_id)
        .map_err(|e| RunError::Refused(e.to_string()))?;
    let checked = check(&review, a, &s, buckets, now_ms())?;
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
        return Ok(1);
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
        return Ok(Checked::Final(Outcome::refused(format!(
            "sale {id} was archived by {by}: it takes no change"
        ))));
    }
    let refused = |t: String| Ok(Checked::Final(Outcome::refused(t)));
    let no_change = |t: String| Ok(Checked::Final(Outcome::no_change(t)));
    match &a.change {
        AdminChange::Pause(reason) => match (&s.paused_reason, &s.paused_by) {
            (Some(r), by) => no_change(format!(
                "sale {id} is paused already (by {}: {r})",
                by.as_deref().unwrap_or("?")
            )),
            (None, _) => Ok(Checked::Go {
                change: Change::Pause {
                    reason: reason.clone(),
                },
                would: format!(
                    "pause sale {id} ({reason}): purchases answered 503 sale_paused until \
                     `sale resume {id}`"
                ),
            }),
        },
        AdminChange::Resume => {
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
                Some(r) => Ok(Checked::Go {
                    change: Change::Resume,
                    would: format!("resume sale {id} (paused: {r}): purchases taken again"),
                }),
            }
        }
        AdminChange::End => {
            if s.ends_at_ms <= now {
                return no_change(format!(
                    "sale {id} ended already at {}",
                    format_ms(s.ends_at_ms)
                ));
            }
            let at = now.max(s.starts_at_ms + 1);
            Ok(Checked::Go {
                change: Change::EndAt { ends_at_ms: at },
                would: format!(
                    "end sale {id} at {} (was {}): later purchases answered 403 sale_ended",
                    format_ms(at),
                    format_ms(s.ends_at_ms)
                ),
            })
        }
        AdminChange::Extend(t) => {
            let t = *t;
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
        AdminChange::AddStock(n) => {
            let n = *n;
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
    }
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

/// Runs `change` written ahead (see the module doc); returns the outcome
/// as recorded.
#[allow(clippy::too_many_arguments)] // the action's who, what and where
fn written_ahead(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
    a: &SaleAdminArgs,
    action: ActionKind,
    buckets: u32,
    change: &Change,
    would: &str,
) -> Result<Outcome, RunError> {
    let at = format_ms(now_ms());
    let intent = format!("started: {would}");
    let id = review.record_sale_action(
        &at,
        &a.by,
        a.sale_id,
        action,
        &intent,
        ActionStatus::Started,
        None,
    )?;
    let key = action_key(id, &at);
    review.immediate(|| -> Result<Outcome, RunError> {
        if review.is_completed(id)? {
            return Err(RunError::Refused(format!(
                "action {id} was completed by another process as interrupted before its \
                 effect; nothing done: run the command again"
            )));
        }
        sale_admin::decide(db, a.sale_id, &key, &a.by, change, would)?;
        let text = follow(redis, db, a.sale_id, buckets, &key)?;
        let o = Outcome::done(format!("{would}; {text}"));
        let now = format_ms(now_ms());
        review.record_sale_action(&now, &a.by, a.sale_id, action, &o.text, o.status, Some(id))?;
        Ok(o)
    })
}

/// Redis's step of action `key` on sale `sale_id`: its window end and
/// operator pause from MySQL, and an add-stock's units (once, by the
/// action's mark); says what it did.
fn follow(
    redis: &mut Con,
    db: &mut mysql::Conn,
    sale_id: u64,
    buckets: u32,
    key: &str,
) -> Result<String, RunError> {
    let Some(settings) = sale_admin::settings(db, sale_id)? else {
        return Ok("MySQL no longer holds the sale; Redis unchanged".into());
    };
    let held = sale_admin::follow(redis, sale_id, buckets, &settings)?;
    let mut text = match held {
        0 => "Redis does not hold the sale: `sale load` puts it there as MySQL says".to_string(),
        n => format!("Redis follows in {n} bucket(s)"),
    };
    let Some(d) = sale_admin::decided(db, key)? else {
        return Ok(text);
    };
    if let (Some(units), Some(before)) = (d.units, d.total_before) {
        let mut added = 0;
        for b in 0..buckets.max(1) {
            let n = sale_admin::added_to_bucket(before, units, buckets, b);
            let k = SaleKeys::bucket(sale_id, b);
            if sale_admin::add_to_bucket(redis, &k, key, n)? != Added::NotLoaded {
                added += n;
            }
        }
        text = format!("{text}; {added} of {units} unit(s) in Redis's stock");
    }
    Ok(text)
}

/// Completes every sale action a killed command left `started` (see the
/// module doc); returns how many.
///
/// Errors: SQLite, MySQL or Redis failures (nothing recorded then; a later
/// command or run does it).
pub fn complete_pending(
    review: &Review,
    redis: &mut Con,
    db: &mut mysql::Conn,
) -> Result<usize, RunError> {
    if review.pending_sale_actions()?.is_empty() {
        return Ok(0);
    }
    review.immediate(|| -> Result<usize, RunError> {
        let pending = review.pending_sale_actions()?; // again, under the lock
        for p in &pending {
            let o = observe(redis, db, p)?;
            let now = format_ms(now_ms());
            review.record_sale_action(
                &now,
                &p.actor,
                p.sale_id,
                p.action,
                &o.text,
                o.status,
                Some(p.id),
            )?;
            log::warn!(
                "action {} ({} of sale {} by {}) was interrupted; recorded now as {}: {}",
                p.id,
                p.action,
                p.sale_id,
                p.actor,
                o.status.as_str(),
                o.text
            );
        }
        Ok(pending.len())
    })
}

/// What interrupted action `p` came to: MySQL's decision, and Redis's
/// step completed when it was decided.
fn observe(
    redis: &mut Con,
    db: &mut mysql::Conn,
    p: &PendingSaleAction,
) -> Result<Outcome, RunError> {
    let key = p.key();
    if sale_admin::decided(db, &key)?.is_none() {
        return Ok(Outcome::failed(format!(
            "interrupted before its effect: MySQL holds no change of action {}; nothing changed",
            p.id
        )));
    }
    let buckets = seckill_common::data_loss::bucket_count(redis, db, p.sale_id)
        .map_err(|e| RunError::Refused(e.to_string()))?;
    let text = follow(redis, db, p.sale_id, buckets, &key)?;
    Ok(Outcome::done(format!(
        "{} of sale {} (recorded after an interruption: MySQL holds its change); {text}",
        p.action, p.sale_id
    )))
}

/// Why `sale load` must not load sale `id`: a paused sale (Redis lost data
/// of it: `sale repair` rebuilds it; an operator's pause: a load would
/// offer its units before the pause is written); `None` when it may.
///
/// Errors: MySQL failures.
pub fn load_refusal(db: &mut mysql::Conn, id: u64) -> Result<Option<String>, RunError> {
    Ok(match sale_now(db, id)? {
        Some(SaleNow {
            data_loss: Some(r), ..
        }) => Some(format!(
            "sale {id} is paused ({r}): `seckill-reconciler run`, then `sale repair {id} \
             --by NAME` rebuilds its Redis state"
        )),
        Some(SaleNow {
            paused_reason: Some(r),
            paused_by,
            ..
        }) => Some(format!(
            "sale {id} is paused by {} ({r}): `sale resume {id} --by NAME` first",
            paused_by.as_deref().unwrap_or("?")
        )),
        _ => None,
    })
}
