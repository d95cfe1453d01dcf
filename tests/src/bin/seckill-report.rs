//! `seckill-report`: writes the self-contained HTML report of one or more
//! runs (`seckill_tests::report_html`) from their JSON reports
//! (`seckill-load --report-json`, or the demo's `demo.json`). Thin main:
//! parse the command line, read, render, write.
//!
//! usage: `seckill-report --out FILE [--title TEXT] REPORT.json...`; each
//! input is one section, named by its file stem. Exit codes: 0 written, 2 an
//! input could not be read or parsed or the output written, 64 bad command
//! line.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: seckill-report --out FILE [--title TEXT] REPORT.json...";

/// What the command line asked for.
struct Args {
    out: PathBuf,
    title: String,
    inputs: Vec<PathBuf>,
}

fn parse() -> Result<Args, lexopt::Error> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_env();
    let (mut out, mut title, mut inputs) = (None, "seckill run report".to_string(), Vec::new());
    while let Some(arg) = p.next()? {
        match arg {
            Long("out") => out = Some(PathBuf::from(p.value()?)),
            Long("title") => title = p.value()?.string()?,
            Value(v) => inputs.push(PathBuf::from(v)),
            _ => return Err(arg.unexpected()),
        }
    }
    let out = out.ok_or("--out FILE is required")?;
    if inputs.is_empty() {
        return Err("at least one REPORT.json is required".into());
    }
    Ok(Args { out, title, inputs })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
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
