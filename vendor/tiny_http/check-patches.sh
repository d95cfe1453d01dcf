#!/usr/bin/env bash
# Checks that this directory is tiny_http 0.12.0 as published on crates.io
# with patches/*.patch applied in order, and nothing else: downloads the
# upstream crate (checked against the crates.io index checksum), keeps the
# files this fork keeps, applies each patch, and compares the result with
# this tree. Exits 0 when they match, 1 when they differ or a patch does not
# apply; skips (exit 0, with a message) when the crate cannot be downloaded.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version=0.12.0
sha256=389915df6413a2e74fb181895f933386023c71110878cd0825588928e64cdc82
kept=(Cargo.toml LICENSE-APACHE LICENSE-MIT README.md src)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetched=
for url in \
    "https://static.crates.io/crates/tiny_http/tiny_http-$version.crate" \
    "https://crates.io/api/v1/crates/tiny_http/$version/download"; do
    if curl -fsSL --max-time 30 -o "$work/crate.tar.gz" "$url" 2>/dev/null; then
        fetched=$url
        break
    fi
done
if [ -z "$fetched" ]; then
    echo "check-patches.sh: SKIPPED: cannot download tiny_http $version from crates.io (offline?)"
    exit 0
fi
if ! echo "$sha256  $work/crate.tar.gz" | sha256sum -c --quiet -; then
    echo "check-patches.sh: the downloaded crate ($fetched) is not tiny_http $version (checksum)" >&2
    exit 1
fi
tar -xzf "$work/crate.tar.gz" -C "$work"
mkdir "$work/tree"
for f in "${kept[@]}"; do cp -r "$work/tiny_http-$version/$f" "$work/tree/"; done
for p in "$here"/patches/*.patch; do
    if ! (cd "$work/tree" && git apply --whitespace=nowarn "$p"); then
        echo "check-patches.sh: $(basename "$p") does not apply" >&2
        exit 1
    fi
done
if diff -r -u --exclude=patches --exclude=check-patches.sh --exclude=PATCHES.md \
    "$work/tree" "$here"; then
    echo "check-patches.sh: vendor/tiny_http == tiny_http $version + $(ls "$here"/patches/*.patch | wc -l) patches"
else
    echo "check-patches.sh: vendor/tiny_http differs from tiny_http $version + patches (diff above)" >&2
    exit 1
fi
