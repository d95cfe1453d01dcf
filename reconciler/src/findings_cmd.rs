//! Owns `seckill-reconciler findings`: the review store's findings as a
//! readable table (default) or as JSON for scripts (`--json`: an array of
//! objects with the fields of `review_findings::Finding`).

use crate::cli::FindingsArgs;
use crate::error::RunError;
use crate::review::Review;
use seckill_common::Config;

/// Widest evidence text shown in the table (the JSON has all of it).
const EVIDENCE_WIDTH: usize = 100;

/// Prints the findings selected by `args`; exit code 0.
pub fn findings(config: &Config, args: &FindingsArgs) -> Result<u8, RunError> {
    let review = Review::open(&config.review_db)?;
    let rows = review.list_findings(args.state.as_deref(), args.sale)?;
    if args.json {
        let text = serde_json::to_string_pretty(&rows)
            .map_err(|e| RunError::Refused(format!("json: {e}")))?;
        println!("{text}");
        return Ok(0);
    }
    if rows.is_empty() {
        println!("no findings");
        return Ok(0);
    }
    println!(
        "{:>5}  {:<10}  {:<20}  {:>6}  {:<32}  {:<12}  {:>6}  {:<24}  {:>5}  evidence",
        "id", "state", "kind", "sale", "subject", "user", "order", "last seen", "seen"
    );
    for f in &rows {
        let mut evidence = f.fix.clone().unwrap_or_else(|| f.evidence.to_string());
        if f.severity == "critical" {
            evidence = format!("CRITICAL {evidence}");
        }
        if evidence.chars().count() > EVIDENCE_WIDTH {
            evidence = evidence.chars().take(EVIDENCE_WIDTH).collect::<String>() + "...";
        }
        println!(
            "{:>5}  {:<10}  {:<20}  {:>6}  {:<32}  {:<12}  {:>6}  {:<24}  {:>5}  {}",
            f.id,
            f.state,
            f.kind,
            f.sale_id,
            f.subject,
            f.user_id.as_deref().unwrap_or("-"),
            f.order_id
                .map_or_else(|| "-".to_string(), |o| o.to_string()),
            f.last_seen,
            f.times_seen,
            evidence
        );
    }
    Ok(0)
}
