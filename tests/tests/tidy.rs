//! Checks the conventions a reader relies on, on the workspace's own files
//! (fast, no services): no file holds a merge's conflict marker; every
//! source path a doc or a code comment names exists; every doc link to an
//! anchor finds its heading; no doc or
//! comment tells the history of the work instead of the code (sessions of
//! work, passes of review, issue numbers, the word before with a colon,
//! what an earlier build did); every Rust source file opens with a `//!`
//! line saying what it owns; no test function is over 150 lines; no
//! function of a crate's sources or examples
//! is over [`MAX_FN_LINES`] lines outside its tests.
//!
//! Each failure names the file, the line and what to fix.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root (this crate is `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Folders never walked: build output, version control, vendored code
/// (upstream's conventions), the demo's and benchmarks' run folders.
fn skipped(name: &str) -> bool {
    name == "target" || name == "vendor" || name == "node_modules" || name.starts_with('.')
}

/// Every file under `dir`, recursively, as paths relative to the root.
fn files_under(root: &Path, dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() {
                if !skipped(&name) {
                    stack.push(path);
                }
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// The docs the checks read: the README and every `docs/*.md`.
fn docs(root: &Path) -> Vec<String> {
    let mut out = vec!["README.md".to_string()];
    out.extend(
        files_under(root, "docs")
            .into_iter()
            .filter(|f| f.ends_with(".md")),
    );
    out
}

/// The top folders whose paths a doc may name, resolved from the root.
const TOP: [&str; 10] = [
    "common",
    "gateway",
    "worker",
    "reconciler",
    "tests",
    "scripts",
    "systemd",
    "ops",
    "vendor",
    "docs",
];

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '@')
}

/// Whether `token` names a Rust file by a placeholder (`AREA_TOPIC.rs`,
/// `tests/tests/NAME.rs`): its stem is capitals and underscores.
fn placeholder(token: &str) -> bool {
    let last = token.rsplit('/').next().unwrap_or("");
    last.strip_suffix(".rs").is_some_and(|stem| {
        !stem.is_empty() && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// The source paths `line` names: a top folder, `/`, then a path that ends
/// in a file extension or a `/` (a folder), with or without a leading
/// `./`; and Rust files named without their crate (`rules/transfers.rs`).
/// A path next to `*`, `{` or `<` is a pattern, not a path, and is left
/// out; so is a path inside a longer one (a URL's).
fn named_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    let mut prev: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if !path_char(c) || prev.is_some_and(path_char) {
            prev = Some(c);
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let len = rest.find(|c: char| !path_char(c)).unwrap_or(rest.len());
        let (token, after) = rest.split_at(len);
        let pattern = prev == Some('*') || after.starts_with(['*', '{', '<']);
        prev = token.chars().last();
        rest = after;
        let token = token
            .strip_prefix("./")
            .unwrap_or(token)
            .trim_end_matches('.');
        if pattern || token.starts_with(['/', '.']) || placeholder(token) {
            continue;
        }
        match token.split_once('/') {
            Some((top, tail)) if TOP.contains(&top) && !tail.is_empty() => {}
            // A Rust file named without its crate (`answer.rs`,
            // `rules/transfers.rs`): some file must end so.
            _ if token.ends_with(".rs") => {
                out.push(token.to_string());
                continue;
            }
            _ => continue,
        }
        let last = token.rsplit('/').next().unwrap_or("");
        if token.ends_with('/') || last.contains('.') {
            out.push(token.to_string());
        }
    }
    out
}

/// Whether a path [`named_paths`] found exists: a path under a top folder
/// from the root, a Rust file named without its crate as the end of some
/// Rust file's path.
struct PathIndex {
    root: PathBuf,
    rust_files: Vec<String>,
}

impl PathIndex {
    fn new(root: &Path) -> Self {
        let rust_files = [
            "common",
            "gateway",
            "worker",
            "reconciler",
            "tests",
            "vendor",
        ]
        .iter()
        .flat_map(|d| files_under(root, d))
        .filter(|f| f.ends_with(".rs"))
        .map(|f| format!("/{f}"))
        .collect();
        PathIndex {
            root: root.to_path_buf(),
            rust_files,
        }
    }

    fn exists(&self, p: &str) -> bool {
        match p.split_once('/') {
            Some((top, _)) if TOP.contains(&top) => self.root.join(p).exists(),
            _ => self
                .rust_files
                .iter()
                .any(|f| f.ends_with(&format!("/{p}"))),
        }
    }
}

#[test]
fn every_source_path_a_doc_names_exists() {
    let root = root();
    let index = PathIndex::new(&root);
    let mut missing = Vec::new();
    for doc in docs(&root) {
        let text = fs::read_to_string(root.join(&doc)).expect("a doc is readable");
        for (n, line) in text.lines().enumerate() {
            for p in named_paths(line) {
                if !index.exists(&p) {
                    missing.push(format!("{doc}:{}: `{p}` does not exist", n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs name source paths that do not exist (fix the path or the sentence):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_source_path_a_comment_names_exists() {
    let root = root();
    let index = PathIndex::new(&root);
    let mut missing = Vec::new();
    for file in commented_files(&root) {
        let Ok(text) = fs::read_to_string(root.join(&file)) else {
            continue;
        };
        // A comment may name a path from its own crate's folder
        // (`tests/main.rs` in the `tests` crate).
        let krate = root.join(file.split('/').next().unwrap_or(""));
        for (line, comment) in comments(&file, &text) {
            for p in named_paths(&comment) {
                if !index.exists(&p) && !krate.join(&p).exists() {
                    missing.push(format!("{file}:{line}: `{p}` does not exist"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "comments name source paths that do not exist (fix the path or the sentence):\n{}",
        missing.join("\n")
    );
}

/// The comment text of a source file, one entry per line that holds a
/// comment: `(line number, text)`. Rust: what follows `//` at the start of
/// a line or after code; shell, systemd and Python: what follows `#`
/// (Python's docstrings too: a Python file is read whole).
fn comments(path: &str, text: &str) -> Vec<(usize, String)> {
    let rust = path.ends_with(".rs");
    let python = path.ends_with(".py");
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let comment = if python {
            Some(t)
        } else if rust {
            t.strip_prefix("//")
                .or_else(|| line.split_once(" // ").map(|(_, c)| c))
        } else {
            t.strip_prefix('#').filter(|_| !t.starts_with("#!"))
        };
        if let Some(c) = comment {
            out.push((n + 1, c.trim_start_matches(['/', '!']).trim().to_string()));
        }
    }
    out
}

/// Why `text` (lower case, comment lines joined by spaces) tells history
/// rather than the code, if it does.
fn history(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || matches!(c, '(' | ')' | ',' | ';' | '"' | '`' | '*'))
        .filter(|w| !w.is_empty())
        .collect();
    const SESSION_BEFORE: [&str; 18] = [
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
        "tenth", "earlier", "previous", "later", "last", "next", "this", "work", "helper",
    ];
    // A word as compared: without the punctuation that may follow it.
    let bare = |w: &str| w.trim_end_matches([':', '.', '!', '?']).to_string();
    for (i, raw) in words.iter().enumerate() {
        let w = bare(raw);
        let w = w.as_str();
        let prev = if i > 0 {
            bare(words[i - 1])
        } else {
            String::new()
        };
        let prev = prev.as_str();
        let next = words.get(i + 1).copied().unwrap_or("");
        let number = |s: &str| {
            s.trim_start_matches('#')
                .starts_with(|c: char| c.is_ascii_digit())
        };
        if (w == "session" || w == "sessions" || w == "session's")
            && (SESSION_BEFORE.contains(&prev) || number(next))
        {
            return Some(format!("a work session (\"{prev} {w} {next}\")"));
        }
        if (w == "pass" || w == "passes" || w == "review") && prev == "hostile" {
            return Some(format!("a review pass (\"{prev} {w}\")"));
        }
        if (w == "issue" || w == "issues") && number(next) {
            return Some(format!("an issue number (\"{w} {next}\")"));
        }
        if w.len() > 1 && w.starts_with('#') && w[1..].chars().all(|c| c.is_ascii_digit()) {
            return Some(format!("an issue number (\"{w}\")"));
        }
        if w == "build" && prev == "previous" {
            return Some("\"previous build\" (say what holds now)".into());
        }
        if *raw == "before:" {
            return Some("\"before:\" (say why the code is as it is now)".into());
        }
    }
    None
}

/// The files whose comments are checked: the crates' sources, the tests,
/// the scripts and the units.
fn commented_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for dir in [
        "common/src",
        "gateway/src",
        "gateway/examples",
        "worker/src",
        "reconciler/src",
        "tests/src",
        "tests/tests",
        "scripts",
        "systemd",
    ] {
        out.extend(files_under(root, dir).into_iter().filter(|f| {
            f.ends_with(".rs")
                || f.ends_with(".sh")
                || f.ends_with(".py")
                || f.ends_with(".service")
                || f.ends_with(".timer")
                || f.ends_with(".conf")
                || f.ends_with(".env")
        }));
    }
    out
}

#[test]
fn no_doc_or_comment_tells_history() {
    let root = root();
    let mut found = Vec::new();
    for doc in docs(&root) {
        let text = fs::read_to_string(root.join(&doc)).expect("a doc is readable");
        let lines: Vec<&str> = text.lines().collect();
        for n in 0..lines.len() {
            // A line with its neighbour, so that a phrase split over two
            // lines is seen; reported at the line it starts on.
            let pair = format!("{} {}", lines[n], lines.get(n + 1).unwrap_or(&"")).to_lowercase();
            let alone = history(&lines.get(n + 1).unwrap_or(&"").to_lowercase());
            if let Some(why) = history(&pair).filter(|w| alone.as_ref() != Some(w)) {
                found.push(format!("{doc}:{}: {why}", n + 1));
            }
        }
    }
    for file in commented_files(&root) {
        let Ok(text) = fs::read_to_string(root.join(&file)) else {
            continue;
        };
        let c = comments(&file, &text);
        for k in 0..c.len() {
            let joined = match c.get(k + 1) {
                Some((m, next)) if *m == c[k].0 + 1 => format!("{} {next}", c[k].1),
                _ => c[k].1.clone(),
            };
            let alone = c
                .get(k + 1)
                .and_then(|(_, next)| history(&next.to_lowercase()));
            if let Some(why) = history(&joined.to_lowercase()).filter(|w| alone.as_ref() != Some(w))
            {
                found.push(format!("{file}:{}: {why}", c[k].0));
            }
        }
    }
    assert!(
        found.is_empty(),
        "docs and comments tell history instead of what is true now and why \
         (rewrite the sentence; history belongs in commit messages):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_rust_file_opens_with_what_it_owns() {
    let root = root();
    let mut bare = Vec::new();
    for dir in ["common", "gateway", "worker", "reconciler", "tests"] {
        for f in files_under(&root, dir)
            .into_iter()
            .filter(|f| f.ends_with(".rs"))
        {
            let text = fs::read_to_string(root.join(&f)).unwrap_or_default();
            if !text.starts_with("//!") {
                bare.push(f);
            }
        }
    }
    assert!(
        bare.is_empty(),
        "every .rs file starts with a `//!` line saying what it owns; these do not:\n{}",
        bare.join("\n")
    );
}

/// Longest function outside tests, in lines (its `fn` line to its closing
/// brace).
const MAX_FN_LINES: usize = 100;

/// The functions of `text` (outside its tests: what follows its first
/// `#[cfg(test)]`) longer than [`MAX_FN_LINES`], as (line, length).
fn long_functions(text: &str) -> Vec<(usize, usize)> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    functions_over(code, MAX_FN_LINES)
}

/// The functions of `text` longer than `limit` lines, as (line, length): a
/// `fn` line and the first line after it that closes at its indent.
fn functions_over(text: &str, limit: usize) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "]
            .iter()
            .any(|p| t.starts_with(p));
        if !is_fn || line.trim_end().ends_with(';') {
            continue;
        }
        let indent = line.len() - t.len();
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(len) = lines[i + 1..].iter().position(|l| l.trim_end() == close) {
            if len + 2 > limit {
                out.push((i + 1, len + 2));
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_100_lines() {
    let root = root();
    let mut long = Vec::new();
    for krate in ["common", "gateway", "worker", "reconciler", "tests"] {
        for dir in ["src", "examples"] {
            for f in files_under(&root, &format!("{krate}/{dir}"))
                .into_iter()
                .filter(|f| f.ends_with(".rs"))
            {
                let text = fs::read_to_string(root.join(&f)).unwrap_or_default();
                for (line, len) in long_functions(&text) {
                    long.push(format!("{f}:{line}: {len} lines"));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split each by step into functions that do one \
         job):\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert_eq!(
        named_paths("see `common/src/keys.rs`, ./scripts/test.sh and reconciler/src/rules/."),
        [
            "common/src/keys.rs",
            "scripts/test.sh",
            "reconciler/src/rules/"
        ]
    );
    assert!(named_paths(
        "tests/tests/worker_*.rs, *_support.rs, gateway/worker/reconciler, https://x/tests/a.rs"
    )
    .is_empty());
    assert_eq!(
        named_paths("(`rules/transfers.rs`, answer.rs)"),
        ["rules/transfers.rs", "answer.rs"]
    );
    assert_eq!(
        named_paths("`AREA_TOPIC.rs`, tests/tests/NAME.rs, docs/DESIGN.md"),
        ["docs/DESIGN.md"]
    );
    assert!(history("as the hostile pass found").is_some());
    assert!(history("(the hostile pass: up to").is_some());
    assert!(history("(issue 10 §4)").is_some());
    assert!(history("the seventh session").is_some());
    assert!(history("fixed in #12").is_some());
    assert!(history("before: it took two units").is_some());
    assert!(history("the previous build grew").is_some());
    assert!(history("each mysql session sets its limits; pkcs#8 keys; rfc 7518 §3.2").is_none());
    let body = "    x();\n".repeat(MAX_FN_LINES - 2);
    let at_most = format!("fn a() {{\n{body}}}\n");
    let over = format!("pub fn b() {{\n{body}    y();\n}}\n");
    assert!(long_functions(&at_most).is_empty());
    assert_eq!(long_functions(&over), [(1, MAX_FN_LINES + 1)]);
    assert!(long_functions(&format!("#[cfg(test)]\n{over}")).is_empty());
}

/// A merge's conflict marker at the start of `line`: seven `<`, `|` or
/// `>` then a space or the line's end, or seven `=` alone (built here so
/// that this file holds none).
fn conflict_marker(line: &str) -> bool {
    let opening = ["<", "|", ">"].map(|c| c.repeat(7));
    opening.iter().any(|m| {
        line.strip_prefix(m.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
    }) || line == "=".repeat(7)
}

/// Every file of the workspace a merge can touch: all but build output,
/// version control, vendored code and run folders (see [`skipped`]).
fn workspace_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if skipped(&name) {
            continue;
        }
        if e.path().is_dir() {
            out.extend(files_under(root, &name));
        } else {
            out.push(name);
        }
    }
    out
}

#[test]
fn no_file_holds_a_conflict_marker() {
    let root = root();
    let mut found = Vec::new();
    for file in workspace_files(&root) {
        let Ok(text) = fs::read_to_string(root.join(&file)) else {
            continue; // not text
        };
        for (n, line) in text.lines().enumerate() {
            if conflict_marker(line) {
                found.push(format!("{file}:{}: {line}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a merge left conflict markers (keep what is true of both sides, then remove them):\n{}",
        found.join("\n")
    );
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, every
/// character but letters, digits, `-` and `_` dropped.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks), a
/// repeated one numbered `-1`, `-2`, ... as GitHub numbers them.
fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if in_code || !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let a = anchor_of(line[hashes..].trim_end_matches('#'));
        let seen = out
            .iter()
            .filter(|o| {
                **o == a
                    || o.strip_prefix(&format!("{a}-"))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        out.push(if seen == 0 { a } else { format!("{a}-{seen}") });
    }
    out
}

/// The `(file, anchor)` of each Markdown link of `line` that names an
/// anchor: `[x](#a)` (file empty) or `[x](FILE.md#a)`.
fn anchor_links(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for part in line.split("](").skip(1) {
        let target = part.split([')', ' ']).next().unwrap_or("");
        if let Some((file, anchor)) = target.split_once('#') {
            if file.is_empty() || file.ends_with(".md") {
                out.push((file.to_string(), anchor.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_doc_link_to_an_anchor_finds_its_heading() {
    let root = root();
    let mut broken = Vec::new();
    for doc in docs(&root) {
        let text = fs::read_to_string(root.join(&doc)).expect("a doc is readable");
        let dir = Path::new(&doc).parent().unwrap_or(Path::new(""));
        for (n, line) in text.lines().enumerate() {
            for (file, anchor) in anchor_links(line) {
                let target = if file.is_empty() {
                    doc.clone()
                } else {
                    dir.join(&file).to_string_lossy().into_owned()
                };
                let Ok(target_text) = fs::read_to_string(root.join(&target)) else {
                    broken.push(format!("{doc}:{}: `{file}` does not exist", n + 1));
                    continue;
                };
                if !anchors(&target_text).contains(&anchor) {
                    broken.push(format!(
                        "{doc}:{}: no heading of {target} has the anchor #{anchor}",
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "doc links to anchors that no heading has (fix the link or the heading):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_new_checks_see_what_they_look_for() {
    let marker = format!("{} HEAD", "<".repeat(7));
    assert!(conflict_marker(&marker));
    assert!(conflict_marker(&"=".repeat(7)));
    assert!(!conflict_marker(&format!(" {marker}")));
    assert!(!conflict_marker("<<< not one"));
    assert_eq!(
        anchor_of("Operator commands (`seckill-reconciler`)"),
        "operator-commands-seckill-reconciler"
    );
    assert_eq!(anchors("# A\n```\n# not\n```\n## A\n"), ["a", "a-1"]);
    assert_eq!(
        anchor_links("see [x](docs/OPERATIONS.md#the-demo) and [y](#a-b), [z](https://e/#q)"),
        [
            ("docs/OPERATIONS.md".to_string(), "the-demo".to_string()),
            (String::new(), "a-b".to_string())
        ]
    );
    let body = "    x();\n".repeat(MAX_TEST_FN_LINES - 2);
    assert!(functions_over(&format!("fn a() {{\n{body}}}\n"), MAX_TEST_FN_LINES).is_empty());
    assert_eq!(
        functions_over(
            &format!("fn b() {{\n{body}    y();\n}}\n"),
            MAX_TEST_FN_LINES
        ),
        [(1, MAX_TEST_FN_LINES + 1)]
    );
}

#[test]
fn the_operations_contents_list_every_section() {
    let root = root();
    let text = fs::read_to_string(root.join("docs/OPERATIONS.md")).expect("docs/OPERATIONS.md");
    let first = text.find("\n## ").unwrap_or(text.len());
    let contents = &text[..first];
    let mut in_code = false;
    let mut missing = Vec::new();
    for line in text[first..].lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let heading = line
            .strip_prefix("## ")
            .or_else(|| line.strip_prefix("### "));
        if let Some(h) = heading.filter(|_| !in_code) {
            if !contents.contains(&format!("(#{})", anchor_of(h))) {
                missing.push(h.to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/OPERATIONS.md's contents (above its first section) link no entry for:\n{}",
        missing.join("\n")
    );
}

/// Every finding kind the reconciler stores (`Kind` in
/// `reconciler/src/review/findings.rs`: its `Variant => "name"` lines).
fn finding_kinds(root: &Path) -> Vec<String> {
    let src = fs::read_to_string(root.join("reconciler/src/review/findings.rs"))
        .expect("reconciler/src/review/findings.rs");
    let start = src.find("pub enum Kind {").expect("the Kind enum");
    let body = &src[start..];
    let body = &body[..body.find("\n    }").unwrap_or(body.len())];
    body.lines()
        .filter_map(|l| l.split_once("=> \"").map(|(_, r)| r))
        .filter_map(|r| r.split_once('"').map(|(name, _)| name.to_string()))
        .collect()
}

#[test]
fn every_finding_kind_has_its_settling_command_in_operations() {
    let root = root();
    let ops = fs::read_to_string(root.join("docs/OPERATIONS.md")).expect("docs/OPERATIONS.md");
    let heading = "### Which command settles each finding";
    let start = ops.find(heading).expect("the settling table's section");
    let section = &ops[start + heading.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    let kinds = finding_kinds(&root);
    assert!(kinds.len() > 10, "the kinds are read: {kinds:?}");
    let missing: Vec<&String> = kinds
        .iter()
        .filter(|k| {
            !section
                .lines()
                .any(|l| l.starts_with('|') && l.contains(&format!("`{k}`")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "finding kinds with no row in OPERATIONS.md's \"{heading}\" table (a row: the kind in \
         backticks, then the command that settles it): {missing:?}"
    );
}

#[test]
fn every_alert_names_its_runbook_entry() {
    let root = root();
    let ops = fs::read_to_string(root.join("docs/OPERATIONS.md")).expect("docs/OPERATIONS.md");
    let entries = anchors(&ops);
    let mut wrong = Vec::new();
    let mut alerts = 0;
    for file in files_under(&root, "ops/prometheus") {
        if !file.ends_with(".rules.yml") {
            continue;
        }
        let text = fs::read_to_string(root.join(&file)).expect("a rules file is readable");
        let mut alert: Option<String> = None;
        for line in text.lines() {
            let t = line.trim();
            if let Some(name) = t.strip_prefix("- alert: ") {
                if let Some(a) = alert.replace(name.to_string()) {
                    wrong.push(format!("{file}: {a} has no runbook_url"));
                }
                alerts += 1;
            } else if let Some(url) = t.strip_prefix("runbook_url: ") {
                let Some(a) = alert.take() else { continue };
                let want = format!("docs/OPERATIONS.md#{}", a.to_lowercase());
                if url != want || !entries.contains(&a.to_lowercase()) {
                    wrong.push(format!(
                        "{file}: {a}'s runbook_url is {url}: want {want}, a `#### {a}` entry"
                    ));
                }
            }
        }
        if let Some(a) = alert {
            wrong.push(format!("{file}: {a} has no runbook_url"));
        }
    }
    assert!(alerts > 20, "the alerts are read ({alerts})");
    assert!(
        wrong.is_empty(),
        "every alert's runbook_url names its entry in docs/OPERATIONS.md:\n{}",
        wrong.join("\n")
    );
}

/// Longest test function, in lines: a test reads as a specification, its
/// set-up and repeated checks in helpers.
const MAX_TEST_FN_LINES: usize = 150;

#[test]
fn no_test_function_is_over_150_lines() {
    let root = root();
    let mut long = Vec::new();
    for f in files_under(&root, "tests/tests") {
        if f.ends_with(".rs") {
            let text = fs::read_to_string(root.join(&f)).unwrap_or_default();
            for (line, len) in functions_over(&text, MAX_TEST_FN_LINES) {
                long.push((f.clone(), line, len));
            }
        }
    }
    for krate in ["common", "gateway", "worker", "reconciler", "tests"] {
        for f in files_under(&root, &format!("{krate}/src"))
            .into_iter()
            .filter(|f| f.ends_with(".rs"))
        {
            let text = fs::read_to_string(root.join(&f)).unwrap_or_default();
            if let Some(at) = text.find("#[cfg(test)]") {
                let skipped_lines = text[..at].lines().count();
                for (line, len) in functions_over(&text[at..], MAX_TEST_FN_LINES) {
                    long.push((f.clone(), line + skipped_lines, len));
                }
            }
        }
    }
    let long: Vec<String> = long
        .into_iter()
        .map(|(f, line, len)| format!("{f}:{line}: {len} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "test functions over {MAX_TEST_FN_LINES} lines (move set-up and repeated checks into \
         helpers, or split the behaviours into tests of their own):\n{}",
        long.join("\n")
    );
}
