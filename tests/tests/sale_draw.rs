//! Specifies that a draw is checkable by anyone with Python's standard
//! library: `scripts/verify-draw.py` recomputes the winners of a draw made
//! by `seckill_common::draw` from the revealed seed, the published
//! commitment and entries, agrees on every figure, and refuses a tampered
//! entry list, a seed that is not the committed one and a winners list in
//! another order.

use crate::support::ops::repo_file;
use seckill_common::draw::{buyer_hash, commitment, draw, Entry, SEED_LEN};
use serde_json::{json, Value};
use std::process::Command;

const SALE: u64 = 42;
const UNITS: u64 = 500;

/// 2,000 entries of 1 to 3 units, the seed and the published draw.
fn published() -> (Vec<Entry>, Value) {
    let seed: [u8; SEED_LEN] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
    let entries: Vec<Entry> = (0..2000)
        .map(|i| Entry {
            buyer_hash: buyer_hash(SALE, &format!("buyer-{i}")),
            quantity: 1 + (i % 3) as u32,
        })
        .collect();
    let outcome = draw(&seed, "beacon-round-4242", &entries, UNITS);
    let hex: String = seed.iter().map(|b| format!("{b:02x}")).collect();
    let d = json!({
        "units": UNITS,
        "seed": hex,
        "commitment": commitment(&seed),
        "public_value": "beacon-round-4242",
        "entries_digest": outcome.entries_digest,
        "entries": entries.iter().map(|e| json!({"buyer_hash": e.buyer_hash, "quantity": e.quantity})).collect::<Vec<_>>(),
        "winners": outcome.winners.iter().map(|&i| entries[i].buyer_hash.clone()).collect::<Vec<_>>(),
    });
    assert_eq!(
        outcome.units_given, UNITS,
        "2,000 entries of 1-3 units fill 500"
    );
    (entries, d)
}

/// `scripts/verify-draw.py` on `d` (extra arguments after the file): its
/// exit code and standard output.
fn verify(d: &Value, extra: &[&str]) -> (i32, String) {
    let dir = seckill_tests::TempDir::new();
    let file = dir.path().join("draw.json");
    std::fs::write(&file, d.to_string()).expect("write the draw");
    let out = Command::new("python3")
        .arg(repo_file("scripts/verify-draw.py"))
        .arg(&file)
        .args(extra)
        .output()
        .expect("python3 runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_standard_library_check_agrees_with_the_draw() {
    let (entries, d) = published();
    let winners = d["winners"].as_array().map_or(0, Vec::len);
    let (code, out) = verify(&d, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out,
        format!(
            "draw verified: 2000 entries, digest {}, {winners} winners (500 units of 500)\n",
            d["entries_digest"].as_str().unwrap_or_default()
        )
    );
    // A buyer finds their own entry by the hash they compute themselves.
    let first = d["winners"][0].as_str().unwrap_or_default();
    let i = entries
        .iter()
        .position(|e| e.buyer_hash == first)
        .unwrap_or(usize::MAX);
    let (code, out) = verify(&d, &["--buyer", &format!("{SALE}:buyer-{i}")]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(&format!(
            "buyer buyer-{i}: hash {first}: won (position 1)\n"
        )),
        "{out}"
    );
}

#[test]
fn a_tampered_entry_list_a_wrong_seed_or_reordered_winners_fail_the_check() {
    let (_, d) = published();
    let mut more_units = d.clone();
    more_units["entries"][7]["quantity"] = json!(3 - (7 % 3) + 1);
    let mut dropped = d.clone();
    if let Some(a) = dropped["entries"].as_array_mut() {
        a.remove(1234);
    }
    let mut other_seed = d.clone();
    other_seed["seed"] = json!("00".repeat(SEED_LEN));
    let mut swapped = d.clone();
    if let Some(w) = swapped["winners"].as_array_mut() {
        w.swap(0, 1);
    }
    for (what, bad, says) in [
        (
            "an entry's quantity changed",
            more_units,
            "the entries' digest is",
        ),
        ("an entry removed", dropped, "the entries' digest is"),
        (
            "a seed other than the committed one",
            other_seed,
            "the seed's SHA-256 is",
        ),
        ("two winners swapped", swapped, "the winners recomputed ("),
    ] {
        let (code, out) = verify(&bad, &[]);
        assert_eq!(code, 1, "{what}: {out}");
        assert!(
            out.contains(&format!("verify-draw: MISMATCH: {says}")),
            "{what}: {out}"
        );
    }
}
