//! Owns writing the commands' results to stdout. `println!` panics when
//! stdout is a closed pipe (`seckill-reconciler findings --json | head -c 600`:
//! EPIPE, "failed printing to stdout: Broken pipe"); here a reader that went
//! away simply ends the output: nobody is left to read the rest, so that is
//! not an error of the command.

use std::fmt;
use std::io::{self, BufWriter, Write};

/// Runs `write` on a buffered, locked stdout and flushes it.
///
/// Returns `Ok(())` when everything was written or the reader closed the pipe
/// (EPIPE: the rest is dropped quietly); any other write error is returned.
pub fn write_stdout(write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> io::Result<()> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let written = write(&mut out).and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Writes one line to stdout; the `println!` of short results. A closed pipe
/// drops the line quietly; another write error is logged (the command has
/// already done its work, so it does not change the exit code).
pub fn line(args: fmt::Arguments<'_>) {
    if let Err(e) = write_stdout(|w| writeln!(w, "{args}")) {
        log::warn!("stdout: {e}");
    }
}

/// `outln!("...", args)`: [`line()`] with `format!` syntax.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// `s` with each control character escaped (`\n`, `\u{1b}`...): text read
/// from Redis (a dead letter's reason, a foreign entry) printed in a table
/// stays on its line and sends no escape sequence to the operator's
/// terminal.
pub fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}
