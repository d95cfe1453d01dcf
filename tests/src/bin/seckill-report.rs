//! `seckill-report`: writes the self-contained HTML report of one or more
//! runs (`seckill_tests::report_html`) from their JSON reports
//! (`seckill-load --report-json`, or the demo's `demo.json`). Thin main:
//! parse the command line, read, render, write.
//!
//! usage: `seckill-report --out FILE [--title TEXT] REPORT.json...`; each
//! input is one section, named by its file stem; `--help` prints what it
//! does. Exit codes: 0 written (or the help), 2 an input could not be read
//! or parsed or the output written, 64 bad command line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: seckill-report --out FILE [--title TEXT] REPORT.json...";

/// `seckill-report --help`: the usage, then what it does and its exit codes.
const HELP: &str = "\
usage: seckill-report --out FILE [--title TEXT] REPORT.json...

Writes one self-contained HTML page (FILE) from the JSON reports of load
runs (`seckill-load --report-json`, or the demo's demo.json). Each
REPORT.json is one section of the page, named by its file stem.
  --out FILE     the HTML file to write (required)
  --title TEXT   the page's title (default: seckill run report)
  --help         this text
Exit codes: 0 written, 2 an input could not be read or parsed or the
output written, 64 bad command line.";

/// What the command line asks: a report, or the help text.
enum Asked {
    Report(Args),
    Help,
}

/// What the command line asked for.
struct Args {
    out: PathBuf,
    title: String,
    inputs: Vec<PathBuf>,
}

fn parse() -> Result<Asked, lexopt::Error> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_env();
    let (mut out, mut title, mut inputs) = (None, "seckill run report".to_string(), Vec::new());
    while let Some(arg) = p.next()? {
        match arg {
            Long("out") => out = Some(PathBuf::from(p.value()?)),
            Long("title") => title = p.value()?.string()?,
            Long("help") | Short('h') => return Ok(Asked::Help),
            Value(v) => inputs.push(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let out = out.ok_or("--out FILE is required")?;
    if inputs.is_empty() {
        return Err("at least one REPORT.json is required".into());
    }
    Ok(Asked::Report(Args { out, title, inputs }))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Asked::Report(a)) => a,
        Ok(Asked::Help) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("seckill-report: {e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    let mut sections = Vec::new();
    for path in &args.inputs {
        let read = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()));
        match read {
            Ok(v) => {
                let name = path.file_stem().map_or_else(
                    || path.display().to_string(),
                    |s| s.to_string_lossy().into(),
                );
                sections.push((name, v));
            }
            Err(e) => {
                eprintln!("seckill-report: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    let html = seckill_tests::report_html::page(&args.title, &sections);
    if let Err(e) = std::fs::write(&args.out, html) {
        eprintln!("seckill-report: {}: {e}", args.out.display());
        return ExitCode::from(2);
    }
    ExitCode::SUCCESS
}
