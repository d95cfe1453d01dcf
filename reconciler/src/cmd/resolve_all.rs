//! Owns `seckill-reconciler resolve all`: one action (`--reorder`,
//! `--rollback`, `--recreate`, `--dismiss`) on every open finding of one
//! kind of one sale, each through `resolve` itself (`cmd/resolve.rs`): its
//! checks, its own audit rows written ahead, its own line. A finding
//! already closed by the time its turn comes (a sibling's action closed
//! it) is left alone. Killed part-way, every finding is acted on at most
//! once: the finding in flight is completed by the next command or `run`
//! (`settle.rs`), the ones done are no longer open, and a repeat takes
//! the rest.

use crate::cli::{by_and_note, err, Command, Opts, UsageError};
use crate::cmd::resolve::{self, ResolveAction, ResolveArgs};
use crate::config::Config;
use crate::error::{RunError, EXIT_REFUSED};
use crate::output::outln;
use crate::review::findings::{FindingState, Kind};
use crate::review::Review;

/// Arguments of `resolve all`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolveAllArgs {
    /// The findings' kind (`--kind`).
    pub kind: String,
    /// Their sale (`--sale`; 0: the payment queue's).
    pub sale_id: u64,
    /// The action, as `resolve` takes it; its `finding_id` is set per finding.
    pub each: ResolveArgs,
}

/// `resolve all --kind KIND --sale ID (--reorder|--rollback|--recreate|--dismiss)
/// --by NAME [--note TEXT] [--dry-run]`.
pub fn parse(opts: &mut Opts) -> Result<Command, UsageError> {
    let Some(kind) = opts.take("kind") else {
        return err("--kind KIND is required (a finding kind: `findings --help`)");
    };
    if kind.parse::<Kind>().is_err() {
        let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        return err(format!(
            "--kind {kind:?}: expected one of {}",
            kinds.join(", ")
        ));
    }
    let Some(sale) = opts.take("sale") else {
        return err("--sale ID is required (0: the payment queue's findings)");
    };
    let Ok(sale_id) = sale.parse::<u64>() else {
        return err(format!("--sale {sale:?}: expected a sale id"));
    };
    let mut actions = Vec::new();
    for (flag, action) in [
        ("reorder", ResolveAction::Reorder),
        ("rollback", ResolveAction::Rollback),
        ("recreate", ResolveAction::Recreate),
        ("dismiss", ResolveAction::Dismiss),
    ] {
        while opts.take(flag).is_some() {
            actions.push(action);
        }
    }
    let [action] = actions.as_slice() else {
        return err(
            "resolve all needs exactly one of --reorder, --rollback, --recreate, --dismiss",
        );
    };
    let (by, note) = by_and_note(opts.take("by"), opts.take("note"))?;
    let dry_run = opts.take("dry-run").is_some();
    Ok(Command::ResolveAll(ResolveAllArgs {
        kind,
        sale_id,
        each: ResolveArgs {
            finding_id: 0,
            action: *action,
            by,
            note,
            dry_run,
        },
    }))
}

/// Acts on every open finding of the kind and sale, oldest first; prints
/// each finding's line and a total. Exit 0 when none was refused, 1
/// otherwise (the others were still acted on).
///
/// Errors: no review file, Redis, MySQL or SQLite failures (the findings
/// before stay done; a repeat takes the rest).
pub fn run(config: &Config, a: &ResolveAllArgs) -> Result<u8, RunError> {
    let review = Review::open_existing(&config.review_db)?;
    let mut ids: Vec<i64> = review
        .list_findings(Some(FindingState::Open), Some(a.sale_id))?
        .into_iter()
        .filter(|f| f.kind.as_str() == a.kind)
        .map(|f| f.id)
        .collect();
    ids.sort_unstable();
    if ids.is_empty() {
        outln!(
            "no open {} finding of sale {}; nothing to do",
            a.kind,
            a.sale_id
        );
        return Ok(0);
    }
    let (mut acted, mut refused, mut closed) = (0u64, 0u64, 0u64);
    for id in &ids {
        if !review.finding(*id)?.is_open() {
            closed += 1;
            continue;
        }
        let each = ResolveArgs {
            finding_id: *id,
            ..a.each.clone()
        };
        match resolve::run(config, &each)? {
            0 => acted += 1,
            _ => refused += 1,
        }
    }
    let verb = if a.each.dry_run {
        "would act on"
    } else {
        "acted on"
    };
    outln!(
        "{} open {} finding(s) of sale {}: {verb} {acted}, refused {refused}, closed meanwhile {closed}",
        ids.len(),
        a.kind,
        a.sale_id
    );
    Ok(if refused > 0 { EXIT_REFUSED } else { 0 })
}
