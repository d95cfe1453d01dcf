//! Checks the crate doc's layer invariants on the sources themselves: the
//! modules each layer may name, tiny_http only in `http/`, the token
//! verifier below the identity rule (never the reverse), and every file
//! opening with what it owns. (Comments that tell history and functions
//! over 100 lines are refused workspace-wide by `tests/tests/tidy.rs`.)

use std::path::{Path, PathBuf};

/// The crate's top modules each layer may name (`crate::X`), by layer.
const RULES: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "server",
            "http",
            "queries",
            "payments",
            "purchase",
            "admission",
            "redis",
            "metrics",
            "config",
        ],
    ),
    (
        "http",
        &[
            "http",
            "queries",
            "payments",
            "purchase",
            "admission",
            "redis",
            "metrics",
            "config",
        ],
    ),
    (
        "queries",
        &["queries", "purchase", "redis", "metrics", "config"],
    ),
    (
        "payments",
        &["payments", "purchase", "redis", "metrics", "config"],
    ),
    (
        "purchase",
        &["purchase", "admission", "redis", "metrics", "config"],
    ),
    ("admission", &["admission", "metrics", "config"]),
    ("redis", &["redis", "metrics"]),
    ("metrics", &["metrics"]),
    ("config", &["config"]),
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's sources, as (path under `src/`, text).
fn files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    paths.sort();
    assert!(paths.len() > 20, "the sources are found under {src:?}");
    paths
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .map(|r| r.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            (rel, text)
        })
        .collect()
}

/// The layer of a file: its folder, or its file name.
fn layer(rel: &str) -> &str {
    let first = rel.split('/').next().unwrap_or(rel);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The crate modules `text` names (`crate::X`, and each of a grouped
/// `crate::{X, Y::z}`), outside its tests.
fn named(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let names = match rest.strip_prefix('{') {
            Some(group) => group_heads(group),
            None => vec![ident(rest)],
        };
        for name in names {
            if !name.is_empty() && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// The identifier `s` starts with.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The first name of each item of a `{...}` group whose text follows the
/// opening brace: the items are split at commas outside inner braces.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && !c.is_whitespace() => {
                heads.push(ident(&group[i..]));
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

#[test]
fn grouped_imports_are_counted() {
    let text = "use crate::{\n    http::Reply,\n    redis::{link, fitness},\n    metrics,\n};\nuse crate::config::X;";
    assert_eq!(named(text), ["http", "redis", "metrics", "config"]);
}

#[test]
fn each_layer_names_only_the_layers_it_may_use() {
    let mut broken = Vec::new();
    for (rel, text) in files() {
        let l = layer(&rel);
        if matches!(l, "lib" | "main" | "layers") {
            continue;
        }
        let Some((_, allowed)) = RULES.iter().find(|(name, _)| *name == l) else {
            broken.push(format!("{rel}: in no layer of the crate doc"));
            continue;
        };
        for n in named(&text) {
            if !allowed.contains(&n.as_str()) {
                broken.push(format!("{rel}: layer {l} names crate::{n}"));
            }
        }
        if l != "http" && text.contains("tiny_http") {
            broken.push(format!("{rel}: names tiny_http outside http/"));
        }
    }
    assert!(
        broken.is_empty(),
        "layer rule broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_token_verifier_does_not_use_the_identity_rule() {
    for (rel, text) in files() {
        let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
        if rel == "admission/verifier.rs" {
            assert!(!code.contains("identity::"), "{rel} uses identity");
        }
    }
}

#[test]
fn every_file_opens_with_what_it_owns() {
    for (rel, text) in files() {
        assert!(
            text.starts_with("//!"),
            "{rel} does not open with a //! line"
        );
    }
}
