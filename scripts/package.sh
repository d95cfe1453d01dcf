#!/usr/bin/env bash
# Builds the Debian package of the three services:
# ${CARGO_TARGET_DIR:-target}/debian/seckill_<version>_amd64.deb, with
# cargo-deb from `[package.metadata.deb]` in reconciler/Cargo.toml (what
# goes where: docs/OPERATIONS.md, "Install the package"). Installs cargo-deb
# (crates.io, the version scripts/lib/services.sh pins, `cargo install
# --locked` into cargo's own bin directory) when it is missing or another
# version, and Debian's dpkg-dev when dpkg-shlibdeps is missing.
#
# usage: scripts/package.sh [--no-build] [--deb-version VERSION] [--output DIR]
#   --no-build             package the release binaries already in
#                          ${CARGO_TARGET_DIR:-target}/release (built by
#                          scripts/demo.sh's or this script's cargo build)
#   --deb-version VERSION  the package's version instead of the workspace's
#                          (e.g. 0.1.0+local1 for a second package of one build)
#   --output DIR           where the .deb goes (default: the target
#                          directory's debian/)
# Prints the package's path on its last line. Exits non-zero on failure,
# 64 on a bad command line.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/services.sh

build=1
deb_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0 ;;
    --deb-version) [ $# -ge 2 ] || { echo "package.sh: --deb-version needs a value" >&2; exit 64; }
                   deb_args+=(--deb-version "$2"); shift ;;
    --output) [ $# -ge 2 ] || { echo "package.sh: --output needs a directory" >&2; exit 64; }
              mkdir -p "$2"; deb_args+=(--output "$2"); shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
  shift
done

ensure_cargo_deb
# dpkg-shlibdeps (the Depends: line from the binaries' libraries) and strip.
ensure_package dpkg-shlibdeps dpkg-dev
if [ "$build" -eq 1 ]; then
  # The command scripts/demo.sh builds with: one set of release artefacts.
  cargo build --release -p seckill-gateway -p seckill-worker -p seckill-reconciler \
    -p seckill-tests --bins
fi
# --no-build: the binaries above; cargo-deb strips them (the release
# profile keeps line tables for backtraces, the package does not need them).
cargo deb -p seckill-reconciler --no-build --strip "${deb_args[@]}"
