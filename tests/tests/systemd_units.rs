//! Specifies the unit files in `systemd/`: each passes `systemd-analyze
//! verify` without a single warning (with `ExecStart=` pointed at the binaries
//! this build made), carries the hardening the deployment issue lists, and
//! keeps its `systemd-analyze security` exposure at 2.0 or below; the nginx
//! drop-in verifies on Debian's own nginx.service and gives the descriptor
//! limit scripts/nginx-crowd.sh gives the workers.
//!
//! Needs `systemd-analyze` (Debian package `systemd`; `scripts/test.sh`
//! installs it), not a running systemd: it works as root in a container.

use seckill_tests::{bin, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;

const SERVICES: [&str; 3] = [
    "seckill-gateway.service",
    "seckill-worker@.service",
    "seckill-reconciler.service",
];

fn unit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd")
}

fn read_unit(name: &str) -> String {
    std::fs::read_to_string(unit_dir().join(name)).unwrap()
}

/// The name to hand to systemd-analyze: a template needs an instance.
fn instance(name: &str) -> String {
    name.replace("@.", "@w1.")
}

/// Copies every unit into a temporary directory with
/// `/usr/bin/seckill-X` replaced by the built binary.
fn units_with_built_binaries() -> TempDir {
    let dir = TempDir::new();
    for name in SERVICES.iter().chain(["seckill-reconciler.timer"].iter()) {
        let mut text = read_unit(name);
        for b in ["seckill-gateway", "seckill-worker", "seckill-reconciler"] {
            let built = bin(b);
            text = text.replace(
                &format!("/usr/bin/{b}"),
                built.to_str().expect("utf-8 path"),
            );
        }
        assert!(!text.contains("/usr/bin/"), "{name}: unknown binary");
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn analyze(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("systemd-analyze (Debian package systemd; scripts/test.sh installs it)");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_unit_passes_systemd_analyze_verify_without_warnings() {
    let dir = units_with_built_binaries();
    for name in SERVICES.iter().chain(["seckill-reconciler.timer"].iter()) {
        let unit = format!("./{}", instance(name));
        let (code, _, stderr) = analyze(dir.path(), &["verify", &unit]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert_eq!(stderr.trim(), "", "{name} has warnings");
    }
}

#[test]
fn verify_catches_a_broken_unit() {
    // The check above means something only if verify fails on a bad unit.
    let dir = units_with_built_binaries();
    let path = dir.path().join("seckill-gateway.service");
    let text = std::fs::read_to_string(&path).unwrap();
    let broken = text.replace(
        bin("seckill-gateway").to_str().unwrap(),
        "/nonexistent/seckill-gateway",
    );
    std::fs::write(&path, broken).unwrap();
    let (code, _, stderr) = analyze(dir.path(), &["verify", "./seckill-gateway.service"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("/nonexistent/seckill-gateway"), "{stderr}");
}

#[test]
fn services_carry_the_required_hardening() {
    for name in SERVICES {
        let text = read_unit(name);
        for line in [
            "DynamicUser=yes",
            "ProtectSystem=strict",
            "ProtectHome=true",
            "PrivateTmp=true",
            "NoNewPrivileges=true",
            "EnvironmentFile=/etc/seckill/seckill.env",
        ] {
            assert!(text.lines().any(|l| l == line), "{name} lacks {line}");
        }
        assert!(
            text.lines().any(|l| l.starts_with("TimeoutStopSec=")),
            "{name}"
        );
    }
    for name in ["seckill-gateway.service", "seckill-worker@.service"] {
        let text = read_unit(name);
        for line in [
            "Type=notify",
            "Restart=on-failure",
            "RestartPreventExitStatus=2",
            "StartLimitBurst=5",
            "StartLimitIntervalSec=60",
        ] {
            assert!(text.lines().any(|l| l == line), "{name} lacks {line}");
        }
    }
    let worker = read_unit("seckill-worker@.service");
    assert!(worker
        .lines()
        .any(|l| l == "Environment=SECKILL_WORKER_ID=%i"));
    let rec = read_unit("seckill-reconciler.service");
    for line in [
        "Type=oneshot",
        "StateDirectory=seckill",
        "ExecStart=/usr/bin/seckill-reconciler run",
    ] {
        assert!(rec.lines().any(|l| l == line), "reconciler lacks {line}");
    }
    let timer = read_unit("seckill-reconciler.timer");
    for line in ["OnCalendar=*-*-* *:*:00", "Persistent=true"] {
        assert!(timer.lines().any(|l| l == line), "timer lacks {line}");
    }
}

#[test]
fn services_expose_at_most_2_0_by_systemd_analyze_security() {
    let dir = units_with_built_binaries();
    for name in SERVICES {
        let unit = format!("./{}", instance(name));
        let (code, stdout, stderr) = analyze(
            dir.path(),
            &["security", "--offline=true", "--no-pager", &unit],
        );
        assert_eq!(code, 0, "{name}: {stderr}");
        let text = stdout + &stderr;
        let figure: f64 = text
            .lines()
            .find_map(|l| l.split("exposure level for ").nth(1))
            .and_then(|rest| rest.split(": ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no exposure figure in {text}"));
        // The figure docs/OPERATIONS.md gives, exactly (systemd-analyze
        // prints one decimal).
        assert_eq!(figure, 1.2, "{name}: exposure {figure}");
    }
}

#[test]
fn the_example_env_file_parses_as_configuration() {
    let text = read_unit("seckill.env");
    let mut vars = std::collections::HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (k, v) = line.split_once('=').unwrap();
        assert!(k.starts_with("SECKILL_") || k == "RUST_LOG", "{k}");
        assert_ne!(k, "SECKILL_WORKER_ID", "the unit instance sets it");
        vars.insert(k.to_string(), v.to_string());
    }
    vars.remove("RUST_LOG");
    seckill_tests::common::Config::from_map(&vars).expect("every value parses");
}

/// `systemd/nginx.service.d/seckill.conf` on Debian's own nginx.service
/// (from the installed package) in a scratch directory.
fn nginx_with_drop_in(drop_in: &str) -> TempDir {
    let dir = TempDir::new();
    std::fs::copy(
        "/lib/systemd/system/nginx.service",
        dir.path().join("nginx.service"),
    )
    .expect("Debian's nginx.service (./scripts/test.sh installs nginx)");
    std::fs::create_dir(dir.path().join("nginx.service.d")).unwrap();
    std::fs::write(dir.path().join("nginx.service.d/seckill.conf"), drop_in).unwrap();
    dir
}

#[test]
fn the_nginx_drop_in_verifies_on_debian_s_unit_and_gives_the_main_file_s_limit() {
    let drop_in = read_unit("nginx.service.d/seckill.conf");
    let dir = nginx_with_drop_in(&drop_in);
    let (code, _, stderr) = analyze(dir.path(), &["verify", "./nginx.service"]);
    assert_eq!((code, stderr.trim()), (0, ""), "{stderr}");
    // The drop-in is read: a bad value in it is a warning.
    let dir = nginx_with_drop_in(&drop_in.replace("LimitNOFILE=", "LimitNOFILE=x"));
    let (_, _, stderr) = analyze(dir.path(), &["verify", "./nginx.service"]);
    assert!(stderr.contains("seckill.conf"), "{stderr}");
    // The service's limit is the workers' (`worker_rlimit_nofile` as
    // scripts/nginx-crowd.sh sets it).
    let value = |text: &str, prefix: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix}"))
            .to_string()
    };
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nginx-crowd.sh"),
    )
    .unwrap();
    assert_eq!(
        value(&drop_in, "LimitNOFILE="),
        value(&script, "RLIMIT_NOFILE=")
    );
}
