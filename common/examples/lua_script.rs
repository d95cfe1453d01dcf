//! Prints one of the shipped Redis scripts, exactly as the binaries send
//! it, for the benches that load it into a private Redis themselves
//! (`scripts/bench-redis-script.sh`, `scripts/bench-reconciler.sh
//! --backlog`). The scripts are assembled from shared fragments with
//! `concat!`, so cutting them out of the source text gives a fragment, not
//! the script.
//!
//! Usage: `cargo run -q -p seckill-common --example lua_script -- NAME`,
//! NAME one of those [`SCRIPTS`] lists; exit 64 on any other.

use seckill_common::{release, reservation, reserve_units, sale, transfer};
use std::process::ExitCode;

/// Each script by the name this example takes.
const SCRIPTS: [(&str, &str); 6] = [
    ("reserve", reservation::RESERVE_LUA),
    ("reserve_units", reserve_units::RESERVE_UNITS_LUA),
    ("release", release::RELEASE_LUA),
    ("load", sale::LOAD_LUA),
    ("transfer_out", transfer::TRANSFER_OUT_LUA),
    ("transfer_in", transfer::TRANSFER_IN_LUA),
];

fn main() -> ExitCode {
    let wanted = std::env::args().nth(1).unwrap_or_default();
    match SCRIPTS.iter().find(|(name, _)| *name == wanted) {
        Some((_, text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        None => {
            let names: Vec<&str> = SCRIPTS.iter().map(|(name, _)| *name).collect();
            eprintln!("usage: lua_script NAME, NAME one of: {}", names.join(", "));
            ExitCode::from(64)
        }
    }
}
