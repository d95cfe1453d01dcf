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

/// Formats Unix ms as RFC 3339 UTC with exactly three millisecond digits,
/// e.g. `2026-11-29T20:00:00.000Z`, so that the text sorts like the time
/// (the review file's queries order by it; `Rfc3339` itself drops trailing
/// zeros: `.35Z` sorted after `.357Z`).
pub fn format_ms(ms: u64) -> String {
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .unwrap_or_else(|| format!("{ms}ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_ms_always_writes_three_millisecond_digits() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        let t = parse_time_ms("2026-11-29T21:08:44.35Z", 0).unwrap();
        assert_eq!(format_ms(t), "2026-11-29T21:08:44.350Z");
        assert_eq!(format_ms(t + 7), "2026-11-29T21:08:44.357Z");
        // The text sorts like the time.
        assert!(format_ms(t) < format_ms(t + 7));
        assert_eq!(parse_time_ms(&format_ms(t + 7), 0), Ok(t + 7));
    }

    #[test]
    fn operator_times() {
        assert_eq!(parse_time_ms("now", 5), Ok(5));
        assert_eq!(parse_time_ms("now+30s", 5), Ok(30_005));
        assert_eq!(
            parse_time_ms("2026-11-29T20:00:00+08:00", 0),
            parse_time_ms("2026-11-29T12:00:00Z", 0)
        );
        assert_eq!(
            parse_time_ms("tomorrow", 0),
            Err("expected RFC 3339 (2026-11-29T20:00:00Z), now or now+30s".to_string())
        );
        assert_eq!(
            parse_time_ms("now+soon", 0),
            Err("expected now+DURATION such as now+30s or now+2h".to_string())
        );
        assert_eq!(
            parse_time_ms("1969-12-31T23:59:59Z", 0),
            Err("before 1970".to_string())
        );
    }
}
