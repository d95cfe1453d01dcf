//! Owns the operator's time syntax: RFC 3339 (any offset) or `now`,
//! `now+30s`, `now+2h`, and formatting Unix ms back to RFC 3339 UTC.

use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Parses `s` into Unix ms. `now_ms` is the clock (injected for tests).
///
/// Errors: a human-readable reason.
pub fn parse_time_ms(s: &str, now_ms: u64) -> Result<u64, String> {
    if s == "now" {
        return Ok(now_ms);
    }
    if let Some(rest) = s.strip_prefix("now+") {
        let d: Duration = humantime::parse_duration(rest)
            .map_err(|_| "expected now+DURATION such as now+30s or now+2h".to_string())?;
        return Ok(now_ms.saturating_add(d.as_millis() as u64));
    }
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|_| "expected RFC 3339 (2026-11-29T20:00:00Z), now or now+30s".to_string())?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).map_err(|_| "before 1970".to_string())
}

/// Formats Unix ms as RFC 3339 UTC with milliseconds, e.g. `2026-11-29T20:00:00.000Z`.
pub fn format_ms(ms: u64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{ms}ms"))
}
