//! Owns the command line: raw arguments are parsed with lexopt, then
//! validated into a typed [`Command`]; nothing here touches the network.

use lexopt::prelude::*;
use seckill_common::timefmt::parse_time_ms;
use std::ffi::OsString;
use std::fmt;

/// The usage text printed by `--help` and after a command-line error.
pub const USAGE: &str = "\
usage: seckill-reconciler COMMAND [OPTIONS]

commands:
  migrate                       create the MySQL database if missing and apply the schema
  sale create --sku SKU --stock N --starts-at T --ends-at T [--title TEXT] [--price-cents N]
                                T: RFC 3339 (2026-11-29T20:00:00Z, +08:00 offsets too),
                                   now, now+30s, now+2h
  sale load ID                  put a MySQL sale into Redis unless Redis holds live state
  sale show ID                  MySQL and Redis figures side by side

configuration comes from SECKILL_* environment variables (see README).
exit codes: 0 ok, 1 open findings (run), 2 could not run, 64 bad command line";

/// A validated command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Print usage.
    Help,
    /// Apply the MySQL schema.
    Migrate,
    /// Create a sale in MySQL and load it into Redis.
    SaleCreate(SaleCreate),
    /// Load sale ID into Redis.
    SaleLoad(u64),
    /// Show sale ID.
    SaleShow(u64),
}

/// Arguments of `sale create`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleCreate {
    /// 1-64 characters of `A-Z a-z 0-9 _ . -`.
    pub sku: String,
    /// 1 ..= [`MAX_STOCK`] units.
    pub stock: u64,
    /// Window start, Unix ms.
    pub starts_at_ms: u64,
    /// Window end, Unix ms; after the start, at most [`MAX_WINDOW_MS`] later.
    pub ends_at_ms: u64,
    /// At most 255 characters.
    pub title: String,
    /// At most [`MAX_PRICE_CENTS`].
    pub price_cents: u64,
}

/// Largest stock one sale may offer (a flash sale of more is a typo).
pub const MAX_STOCK: u64 = 100_000_000;
/// Longest sale window: 366 days in ms.
pub const MAX_WINDOW_MS: u64 = 366 * 24 * 3600 * 1000;
/// Highest price: one billion currency units, in cents.
pub const MAX_PRICE_CENTS: u64 = 100_000_000_000;

/// A command line that cannot be run; printed with the usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError(e.to_string())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

fn string(v: OsString, what: &str) -> Result<String, UsageError> {
    v.into_string()
        .map_err(|_| UsageError(format!("{what}: not valid UTF-8")))
}

fn parse_u64(v: &str, what: &str) -> Result<u64, UsageError> {
    v.parse()
        .map_err(|_| UsageError(format!("{what}: {v:?} is not a non-negative integer")))
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    parse_at(args, seckill_common::now_ms())
}

/// [`parse`] with the clock given (for `now+30s`), so tests are exact.
pub fn parse_at(
    args: impl IntoIterator<Item = OsString>,
    now_ms: u64,
) -> Result<Command, UsageError> {
    let mut p = lexopt::Parser::from_args(args);
    let mut words = Vec::new();
    let mut opts: Vec<(String, String)> = Vec::new();
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Long(name) => {
                let name = name.to_string();
                let v = string(p.value()?, &name)?;
                opts.push((name, v));
            }
            Value(v) => words.push(string(v, "argument")?),
            other => return Err(other.unexpected().into()),
        }
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let take = |opts: &mut Vec<(String, String)>, name: &str| -> Option<String> {
        let i = opts.iter().position(|(n, _)| n == name)?;
        Some(opts.remove(i).1)
    };
    let cmd = match words.as_slice() {
        [] | ["help"] => Command::Help,
        ["migrate"] => Command::Migrate,
        ["sale", "load", id] => Command::SaleLoad(parse_u64(id, "sale id")?),
        ["sale", "show", id] => Command::SaleShow(parse_u64(id, "sale id")?),
        ["sale", "create"] => {
            let sku =
                take(&mut opts, "sku").ok_or_else(|| UsageError("--sku is required".into()))?;
            let stock =
                take(&mut opts, "stock").ok_or_else(|| UsageError("--stock is required".into()))?;
            let starts = take(&mut opts, "starts-at")
                .ok_or_else(|| UsageError("--starts-at is required".into()))?;
            let ends = take(&mut opts, "ends-at")
                .ok_or_else(|| UsageError("--ends-at is required".into()))?;
            let title = take(&mut opts, "title").unwrap_or_default();
            let price = take(&mut opts, "price-cents").unwrap_or_else(|| "0".into());
            if !seckill_common::is_valid_token(&sku) {
                return err(format!(
                    "--sku {sku:?}: expected 1-64 characters of A-Z a-z 0-9 _ . -"
                ));
            }
            let stock: u64 = stock
                .parse()
                .ok()
                .filter(|n| (1..=MAX_STOCK).contains(n))
                .ok_or_else(|| {
                    UsageError(format!(
                        "--stock {stock:?}: expected an integer from 1 to {MAX_STOCK}"
                    ))
                })?;
            let starts_at_ms = parse_time_ms(&starts, now_ms)
                .map_err(|e| UsageError(format!("--starts-at {starts:?}: {e}")))?;
            let ends_at_ms = parse_time_ms(&ends, now_ms)
                .map_err(|e| UsageError(format!("--ends-at {ends:?}: {e}")))?;
            if ends_at_ms <= starts_at_ms {
                return err("--ends-at must be after --starts-at");
            }
            if ends_at_ms - starts_at_ms > MAX_WINDOW_MS {
                return err("the sale window is longer than 366 days");
            }
            if ends_at_ms <= now_ms {
                return err("--ends-at is in the past: the sale would never open");
            }
            if title.chars().count() > 255 || title.chars().any(char::is_control) {
                return err("--title: at most 255 characters, no control characters");
            }
            let price_cents = parse_u64(&price, "--price-cents")?;
            if price_cents > MAX_PRICE_CENTS {
                return err(format!("--price-cents: at most {MAX_PRICE_CENTS}"));
            }
            Command::SaleCreate(SaleCreate {
                sku,
                stock,
                starts_at_ms,
                ends_at_ms,
                title,
                price_cents,
            })
        }
        _ => return err(format!("unknown command: {}", words.join(" "))),
    };
    if let Some((name, _)) = opts.first() {
        return err(format!("unexpected option --{name}"));
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, UsageError> {
        parse_at(s.split_whitespace().map(OsString::from), 1_790_000_000_000)
    }

    #[test]
    fn sale_create_accepts_relative_and_absolute_times() {
        let c = p("sale create --sku A-1 --stock 10 --starts-at now+30s --ends-at 2027-01-15T08:00:00+08:00 --price-cents 1999").unwrap();
        assert_eq!(
            c,
            Command::SaleCreate(SaleCreate {
                sku: "A-1".into(),
                stock: 10,
                starts_at_ms: 1_790_000_030_000,
                ends_at_ms: 1_799_971_200_000,
                title: String::new(),
                price_cents: 1999,
            })
        );
    }

    #[test]
    fn sale_create_rejects_bad_values() {
        for bad in [
            "sale create --sku A --stock 0 --starts-at now --ends-at now+1h",
            "sale create --sku A --stock -5 --starts-at now --ends-at now+1h",
            "sale create --sku A --stock 1000000000 --starts-at now --ends-at now+1h",
            "sale create --sku A --stock 5 --starts-at now+1h --ends-at now",
            "sale create --sku A --stock 5 --starts-at now --ends-at now",
            "sale create --sku A --stock 5 --starts-at yesterday --ends-at now+1h",
            "sale create --sku A --stock 5 --starts-at now --ends-at now+1000d",
            "sale create --sku a/b --stock 5 --starts-at now --ends-at now+1h",
            "sale create --stock 5 --starts-at now --ends-at now+1h",
            "sale create --sku A --stock 5 --starts-at now --ends-at now+1h --price-cents 1e9",
            "sale create --sku A --stock 5 --starts-at now --ends-at now+1h --colour red",
            "sale load x",
            "sale frobnicate 1",
        ] {
            assert!(p(bad).is_err(), "accepted: {bad}");
        }
    }

    #[test]
    fn simple_commands_parse() {
        assert_eq!(p("migrate").unwrap(), Command::Migrate);
        assert_eq!(p("sale load 42").unwrap(), Command::SaleLoad(42));
        assert_eq!(p("sale show 7").unwrap(), Command::SaleShow(7));
        assert_eq!(p("--help").unwrap(), Command::Help);
    }
}
