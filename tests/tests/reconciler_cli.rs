//! Specifies `seckill-reconciler` as a command-line tool, through the real
//! binary on real Redis, MariaDB and SQLite: `findings` and `resolve` never
//! create a review file (a missing `SECKILL_REVIEW_DB` is reported, not
//! shown as "no findings"), a reader closing the pipe early (`| head`) ends
//! the output quietly, and a usage error is one line plus a pointer to
//! `--help`.

use crate::support::reconciler as support;

use std::io::Read;
use std::process::Stdio;
use support::{ok, World};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn findings_and_resolve_never_create_a_review_file() {
    let w = World::new(3);
    let path = w.review_path();
    let missing = format!(
        "seckill-reconciler: no review file at {}: set SECKILL_REVIEW_DB \
         (the reconciler's `run` creates it)\n",
        path.display()
    );
    for args in [
        &["findings"][..],
        &["findings", "--state", "all", "--json"],
        &["resolve", "1", "--dismiss", "--by", "alice"],
    ] {
        let out = w.cmd("0s", args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), missing, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(!path.exists(), "{args:?} created {}", path.display());
    }

    // The variable forgotten: the default ./seckill-review.sqlite3 is not made.
    let out = seckill_tests::command("seckill-reconciler")
        .arg("findings")
        .current_dir(w.dir.path())
        .env_remove("SECKILL_REVIEW_DB")
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: no review file at ./seckill-review.sqlite3: set \
         SECKILL_REVIEW_DB (the reconciler's `run` creates it)\n"
    );
    assert!(!w.dir.path().join("seckill-review.sqlite3").exists());

    // An empty file (no `run` ever wrote it) is no review store either.
    std::fs::write(&path, b"").unwrap();
    let out = w.cmd("0s", &["findings"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no review store in"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);

    // `run` creates (sets up) it; then `findings` reads it.
    assert_eq!(w.run(), 0);
    let out = w.cmd("0s", &["findings"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "no findings\n");
}

#[test]
fn a_reader_closing_the_pipe_early_ends_findings_quietly() {
    let w = World::new(3);
    assert_eq!(w.run(), 0);
    // Far more findings than a pipe buffers (64 KiB), written straight into
    // the review file: the command must hit the closed pipe.
    let mut c = rusqlite::Connection::open(w.review_path()).unwrap();
    let tx = c.transaction().unwrap();
    for i in 0..1000 {
        tx.execute(
            "INSERT INTO findings (kind, sale_id, subject, severity, evidence, state,
               first_seen, last_seen)
             VALUES ('dead_letter', ?1, ?2, 'normal', ?3, 'open',
               '2026-11-29T20:00:00.000Z', '2026-11-29T20:00:00.000Z')",
            rusqlite::params![
                w.sale as i64,
                format!("entry:{i:032x}"),
                format!("{{\"reason\":\"test entry {i}\"}}")
            ],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    drop(c);

    for args in [&["findings", "--json"][..], &["findings"]] {
        let mut child = seckill_tests::command("seckill-reconciler")
            .args(args)
            .env("SECKILL_MYSQL_URL", w.db.url())
            .env("SECKILL_REDIS_URL", w.redis.url())
            .env("SECKILL_REVIEW_DB", w.review_path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `| head -c 600`: read 600 bytes, then close the pipe.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 600];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

#[test]
fn a_usage_error_is_one_line_and_a_pointer_to_help() {
    let w = World::new(1);
    let out = w.cmd("0s", &["findings", "--state", "closed"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty());
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: --state \"closed\": expected open, auto_fixed, resolved or all\n\
         run `seckill-reconciler findings --help` for usage\n"
    );
    let out = w.cmd("0s", &["frobnicate"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(stderr(&out).lines().count(), 2, "{}", stderr(&out));

    let help = w.cmd("0s", &["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.starts_with("usage: seckill-reconciler COMMAND [ARGS] [OPTIONS]\n"));
    assert!(text.contains("  resolve FINDING_ID"), "{text}");
    assert!(text.lines().count() > 15, "{text}");
}

#[test]
fn each_command_has_its_own_help_and_a_missing_argument_is_named() {
    let w = World::new(1);
    // A group without its subcommand lists them (exit 64).
    let out = w.cmd("0s", &["sale"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(out.stdout.is_empty());
    let text = stderr(&out);
    assert!(
        text.starts_with("seckill-reconciler: sale: missing SUBCOMMAND, one of:\n  sale create "),
        "{text}"
    );
    assert!(text.contains("\n  sale show ID "), "{text}");
    assert!(
        text.ends_with("\nrun `seckill-reconciler sale --help` for usage\n"),
        "{text}"
    );
    assert!(!text.contains("resolve"), "{text}");

    // A missing argument is named, with the command's own help.
    let out = w.cmd("0s", &["resolve"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: resolve: missing FINDING_ID\n\
         run `seckill-reconciler resolve --help` for usage\n"
    );
    let out = w.cmd("0s", &["sale", "show"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: sale show: missing ID\n\
         run `seckill-reconciler sale show --help` for usage\n"
    );
    let out = w.cmd("0s", &["run", "now"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: run: unexpected argument \"now\"\n\
         run `seckill-reconciler run --help` for usage\n"
    );

    // `X --help` prints X's help only, each its own.
    let mut seen = std::collections::HashSet::new();
    for (args, usage) in [
        (&["run", "--help"][..], "usage: seckill-reconciler run\n"),
        (
            &["resolve", "--help"],
            "usage: seckill-reconciler resolve FINDING_ID (--reorder | --rollback | --recreate | --dismiss) \
             --by NAME [--note TEXT] [--dry-run]\n",
        ),
        (
            &["sale", "create", "--help"],
            "usage: seckill-reconciler sale create --sku SKU --stock N",
        ),
        (
            &["sale", "--help"],
            "usage: seckill-reconciler sale SUBCOMMAND [ARGS] [OPTIONS]\n",
        ),
        (
            &["help", "findings"],
            "usage: seckill-reconciler findings [",
        ),
    ] {
        let out = w.cmd("0s", args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.starts_with(usage), "{args:?}: {text}");
        assert!(text.lines().count() < 30, "{args:?}: {text}");
        assert!(seen.insert(text), "{args:?}: the same text as another");
    }
    let run = ok(&w.cmd("0s", &["run", "--help"]));
    assert!(
        !run.contains("--sku") && !run.contains("--reorder"),
        "{run}"
    );
}

#[test]
fn a_token_longer_than_the_gateways_maximum_is_issued_with_a_warning() {
    let w = World::new(1);
    let keys = w.dir.path().join("signing.json");
    let keys = keys.to_str().unwrap();
    ok(&w.cmd(
        "0s",
        &[
            "token", "keygen", "--alg", "HS256", "--kid", "k1", "--out", keys,
        ],
    ));
    let out = w.cmd(
        "0s",
        &[
            "token", "issue", "--user", "alice", "--key", keys, "--ttl", "48h",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches('.').count(), 2);
    assert_eq!(
        stderr(&out),
        "seckill-reconciler: warning: --ttl 48h is longer than SECKILL_AUTH_MAX_TTL (24h): \
         a gateway with that maximum refuses this token (401 invalid_token); issue it with \
         --ttl 24h or less, or raise SECKILL_AUTH_MAX_TTL on the gateway\n"
    );
    // At the maximum: no warning.
    let out = w.cmd(
        "0s",
        &[
            "token", "issue", "--user", "alice", "--key", keys, "--ttl", "24h",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

/// `token keygen --alg RS256` (or ES256) is a usage error pointing at the
/// provider's published keys; `token issue` on the gateway's public file
/// says so and names the signing file.
#[test]
fn keygen_of_a_providers_algorithm_and_issue_from_the_public_file_say_what_to_use() {
    let dir = seckill_tests::TempDir::new();
    let path = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let (signing, public) = (path("signing.jwks"), path("gateway.jwks"));
    let run = |args: &[&str]| {
        seckill_tests::command("seckill-reconciler")
            .args(args)
            .output()
            .unwrap()
    };
    for alg in ["RS256", "ES256"] {
        let out = run(&[
            "token", "keygen", "--alg", alg, "--kid", "r1", "--out", &signing,
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{err}");
        assert!(
            err.starts_with(&format!(
                "seckill-reconciler: --alg {alg}: expected HS256 or EdDSA"
            )),
            "{err}"
        );
        assert!(
            err.contains("SECKILL_AUTH_KEYS") && err.contains("published JWKS"),
            "{err}"
        );
        assert!(!err.contains("random bytes"), "{err}");
        assert!(!std::path::Path::new(&signing).exists());
    }
    let out = run(&[
        "token", "keygen", "--alg", "EdDSA", "--kid", "e1", "--out", &signing, "--public", &public,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&["token", "issue", "--user", "alice", "--key", &public]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        format!(
            "seckill-reconciler: {public}: no key that can sign: the file holds only public \
             keys (the gateway's file, `token keygen --public`); give --key the signing file \
             keygen wrote with --out (the one holding the private keys)\n"
        )
    );
}

/// `token keygen`, `token issue` and `findings` open neither Redis nor
/// MySQL: malformed `SECKILL_REDIS_URL` and `SECKILL_MYSQL_URL` do not
/// stop them; a command that opens them is still refused at start.
#[test]
fn commands_that_open_no_service_ignore_malformed_service_urls() {
    let dir = seckill_tests::TempDir::new();
    let keys = dir.path().join("signing.json");
    let keys = keys.to_str().unwrap();
    let review = dir.path().join("review.sqlite3");
    let bad = |args: &[&str]| {
        seckill_tests::command("seckill-reconciler")
            .args(args)
            .env("SECKILL_REDIS_URL", "localhost:6379")
            .env("SECKILL_MYSQL_URL", "mysql://root@127.0.0.1:notaport/x")
            .env("SECKILL_REVIEW_DB", &review)
            .output()
            .unwrap()
    };
    let out = bad(&[
        "token", "keygen", "--alg", "HS256", "--kid", "k1", "--out", keys,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "k1\n");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(keys).unwrap()).unwrap();
    assert_eq!(written["keys"][0]["kid"], "k1", "{written}");
    let out = bad(&["token", "issue", "--user", "alice", "--key", keys]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches('.').count(), 2);
    let out = bad(&["sale", "list"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(
            "seckill-reconciler: invalid configuration: SECKILL_REDIS_URL=\"localhost:6379\""
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_review_file_in_a_missing_directory_names_the_variable_and_the_path() {
    let w = World::new(1);
    let path = w.dir.path().join("nowhere").join("review.sqlite3");
    let out = seckill_tests::command("seckill-reconciler")
        .arg("run")
        .env("SECKILL_MYSQL_URL", w.db.url())
        .env("SECKILL_REDIS_URL", w.redis.url())
        .env("SECKILL_REVIEW_DB", &path)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "seckill-reconciler: review store SECKILL_REVIEW_DB={}: its directory {} does \
             not exist: create it, or set SECKILL_REVIEW_DB to a file in an existing one\n",
            path.display(),
            path.parent().unwrap().display()
        )
    );
    assert!(!path.parent().unwrap().exists());
}

#[test]
fn an_archive_delay_beyond_the_lookback_is_refused_with_the_lookbacks_value() {
    let w = World::new(1);
    for (lookback, after, shown) in [(None, "48h", "24h"), (Some("2h"), "3h", "2h")] {
        let mut c = seckill_tests::command("seckill-reconciler");
        c.arg("run")
            .env("SECKILL_MYSQL_URL", w.db.url())
            .env("SECKILL_REDIS_URL", w.redis.url())
            .env("SECKILL_REVIEW_DB", w.review_path())
            .env("SECKILL_ARCHIVE_AFTER", after)
            .env_remove("SECKILL_RECONCILE_LOOKBACK");
        if let Some(l) = lookback {
            c.env("SECKILL_RECONCILE_LOOKBACK", l);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            stderr(&out),
            format!(
                "seckill-reconciler: invalid configuration: SECKILL_ARCHIVE_AFTER=\"{after}\": \
                 expected a duration such as 1h, below SECKILL_RECONCILE_LOOKBACK ({shown}), \
                 0, or off\n"
            ),
        );
    }
    assert!(!w.review_path().exists());
}
