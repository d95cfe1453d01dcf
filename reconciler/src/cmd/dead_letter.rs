//! Owns `seckill-reconciler dead-letter list SALE|payments`: the dead
//! letters of a sale (every bucket) or of the payment queue, one a line,
//! read [`LIST_CHUNK`](crate::redis_read::LIST_CHUNK) entries a call and
//! changing nothing.
//!
//! A sale's entry is named as its `dead_letter` finding is: the
//! reservation id, or `entry:<fnv1a hex>` of the message when it has none.
//! A payment entry is named by `entry` (16 hex digits, the FNV-1a of the
//! entry's text: what `dead-letter requeue` and `drop` take) and by the
//! subject of its finding (`payment:ID`, `cancel:RESERVATION`). A sale's
//! list shows its dead-letter entries head first, then anything else pushed
//! onto it.

use crate::config::Config;
use crate::connect;
use crate::error::RunError;
use crate::output::{one_line, write_stdout};
use crate::payment_dead_letters::{payment_entries, PaymentEntry};
use crate::redis_read::{dead_letters_into, DeadLetters};
use crate::rules::dead_letter::fnv1a;
use seckill_common::message::OrderMessage;
use seckill_common::timefmt::format_ms;
use std::io::{self, Write};

/// Which dead-letter list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterList {
    /// A sale's (all its buckets).
    Sale(u64),
    /// The payment queue's.
    Payments,
}

/// Prints the list; exit code 0 (a sale Redis does not hold lists what
/// its bucket 0 still has, and says it is not in Redis).
///
/// Errors: Redis failures, stdout.
pub fn run(config: &Config, which: DeadLetterList) -> Result<u8, RunError> {
    let mut con = connect::redis(&config.services)?;
    match which {
        DeadLetterList::Sale(id) => {
            let k = seckill_common::buckets::count(&mut con, id)?;
            let mut dead = DeadLetters::default();
            for keys in seckill_common::buckets::all(id, k.unwrap_or(1)) {
                dead_letters_into(&mut con, keys, &mut dead)?;
            }
            write_stdout(|w| write_sale(w, id, k.is_some(), &dead))
        }
        DeadLetterList::Payments => {
            let entries = payment_entries(&mut con)?;
            write_stdout(|w| write_payments(w, &entries))
        }
    }
    .map_err(RunError::Output)?;
    Ok(0)
}

fn write_sale(w: &mut dyn Write, sale: u64, in_redis: bool, dead: &DeadLetters) -> io::Result<()> {
    if dead.entries.is_empty() && dead.foreign.is_empty() {
        // An id mistyped, or a sale archived or lost, is not "a sale with
        // no dead letters": say so, as `queue show` does.
        let where_ = if in_redis { "" } else { "not in Redis, " };
        return writeln!(w, "sale {sale}: {where_}no dead letters");
    }
    let rows: Vec<[String; 6]> = dead
        .entries
        .iter()
        .map(|d| {
            let reserved = OrderMessage::parse(d.message.as_bytes())
                .map_or_else(|_| "-".to_string(), |m| format_ms(m.reserved_at_ms));
            [
                d.reservation_id
                    .clone()
                    .unwrap_or_else(|| format!("entry:{:016x}", fnv1a(d.message.as_bytes()))),
                d.attempts.to_string(),
                d.worker.clone(),
                reserved,
                format_ms(d.at_ms),
                d.reason.clone(),
            ]
        })
        .chain(dead.foreign.iter().map(|raw| {
            [
                format!("entry:{:016x}", fnv1a(raw.as_bytes())),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "(not a dead-letter entry)".into(),
            ]
        }))
        .collect();
    let header = [
        "id",
        "attempts",
        "worker",
        "reserved at",
        "dead-lettered at",
        "reason",
    ];
    write_columns(w, &header, &rows)
}

fn write_payments(w: &mut dyn Write, entries: &[PaymentEntry]) -> io::Result<()> {
    if entries.is_empty() {
        return writeln!(w, "payments: no dead letters");
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            [
                e.entry.clone(),
                e.subject.clone(),
                e.received_ms.map_or_else(|| "-".to_string(), format_ms),
                e.reason.clone(),
            ]
        })
        .collect();
    write_columns(w, &["entry", "subject", "received at", "reason"], &rows)
}

/// A table: each column as wide as its widest cell, the last one unpadded;
/// control characters in a cell escaped ([`one_line`]).
fn write_columns<const N: usize>(
    w: &mut dyn Write,
    header: &[&str; N],
    rows: &[[String; N]],
) -> io::Result<()> {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|r| r.each_ref().map(|c| one_line(c).into_owned()))
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (wd, c) in widths.iter_mut().zip(r) {
            *wd = (*wd).max(c.chars().count());
        }
    }
    let line = |w: &mut dyn Write, cells: [&str; N]| -> io::Result<()> {
        let mut s = String::new();
        for (i, (c, wd)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<wd$}  "));
            }
        }
        writeln!(w, "{s}")
    };
    line(w, *header)?;
    for r in &rows {
        line(w, r.each_ref().map(String::as_str))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payment_dead_letters::payment_entry;

    #[test]
    fn an_entry_with_control_characters_stays_on_its_line_and_reaches_no_terminal() {
        // An entry as anything that can write the list may leave it: a reason
        // with a newline and an escape sequence (one that clears a terminal).
        let raw = br#"{"message":"x","reason":"line1\nline2 \u001b[2J"}"#;
        let e = payment_entry(raw);
        let mut out = Vec::new();
        write_payments(&mut out, std::slice::from_ref(&e)).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.lines().count(), 2, "{out:?}");
        assert!(!out.contains('\u{1b}'), "{out:?}");
        assert!(out.ends_with("line1\\nline2 \\u{1b}[2J\n"), "{out:?}");
    }
}
