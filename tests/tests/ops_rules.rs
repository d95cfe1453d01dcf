//! Checks the shipped Prometheus rules (`ops/prometheus/seckill.rules.yml`)
//! with Prometheus' own tool: `promtool check rules` accepts the file, and
//! `promtool test rules` passes every unit test of
//! `ops/prometheus/tests/*.yml` (per alert: the series that must fire it
//! and the series that must not). promtool comes from Debian's
//! `prometheus` package, which `scripts/test.sh` installs; without it these
//! tests fail.

use crate::support::ops::{prometheus_dir, promtool};

/// The unit-test files, sorted (relative to `ops/prometheus`).
fn test_files() -> Vec<String> {
    let dir = prometheus_dir().join("tests");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yml"))
        .map(|n| format!("tests/{n}"))
        .collect();
    files.sort();
    files
}

#[test]
fn promtool_check_rules_accepts_the_rules_file() {
    let (code, said) = promtool(&["check", "rules", "seckill.rules.yml"]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("SUCCESS: 33 rules found"), "{said}");
}

#[test]
fn promtool_test_rules_passes_a_test_file_per_alert() {
    let files = test_files();
    // One file per alert of the rules file.
    let rules = std::fs::read_to_string(prometheus_dir().join("seckill.rules.yml"))
        .expect("read seckill.rules.yml");
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert: "))
        .count();
    assert_eq!(files.len(), alerts, "{files:?}");
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let (code, said) = promtool(&args);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(said.matches("SUCCESS").count(), alerts, "{said}");
    assert!(!said.contains("FAILED"), "{said}");
}
