//! Owns the lottery of a draw sale as a pure computation anyone can repeat:
//! the seed's public commitment, the buyer hashes entries are published
//! under, the digest of the frozen entries, the draw key, the order of the
//! entries and the units given down that order.
//!
//! The rules, each checkable with nothing but SHA-256 and HMAC-SHA256
//! (`scripts/verify-draw.py` repeats them with Python's standard library):
//!
//! - **commitment** = hex(SHA-256(seed)), published when the sale is
//!   created, while the 32-byte seed stays secret until the draw;
//! - **buyer hash** = hex(SHA-256(`"seckill-draw-buyer\n" + sale id + "\n" +
//!   user id`)): a buyer computes their own; the sale id in it keeps one
//!   buyer's hashes of two sales apart;
//! - **entries digest** = hex(SHA-256(the lines `"BUYER_HASH,QUANTITY\n"`
//!   sorted)), over the entries frozen when the window closed;
//! - **draw key** = HMAC-SHA256(key = seed, message = `"seckill-draw-key\n" +
//!   digest + "\n" + public value`), the public value being empty when the
//!   sale names none (a randomness beacon's round or a lottery's result,
//!   published after the entries closed);
//! - **order**: the entries by HMAC-SHA256(draw key, buyer hash) ascending
//!   (hex), ties (never seen: they need a SHA-256 collision) by buyer hash;
//! - **units**: down that order, an entry whose quantity fits in what is
//!   left wins all of it; one that does not fit is skipped, not cut, and
//!   the next is tried; the entries that did not win keep their order as
//!   the waitlist.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Length of a draw seed in bytes.
pub const SEED_LEN: usize = 32;

/// One frozen entry: the buyer, by their published hash, and the units
/// they asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// [`buyer_hash`] of the entry's buyer (64 lowercase hex digits).
    pub buyer_hash: String,
    /// Units asked for (1 to the sale's limit per purchase).
    pub quantity: u32,
}

/// The result of a draw: winners and waitlist, both in draw order, as
/// indexes into the entries given to [`draw`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The entries' digest the draw key was derived from.
    pub entries_digest: String,
    /// The winning entries, each given its whole quantity.
    pub winners: Vec<usize>,
    /// The entries that did not win, in draw order.
    pub waitlist: Vec<usize>,
    /// Units given to the winners (at most the sale's units).
    pub units_given: u64,
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA256 of `message` under `key`.
fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length: `new_from_slice` cannot fail here.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC-SHA256 accepts every key length"),
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// The seed's public commitment: hex(SHA-256(seed)).
pub fn commitment(seed: &[u8; SEED_LEN]) -> String {
    hex(&Sha256::digest(seed))
}

/// The hash a buyer's entry is published under in `sale`.
pub fn buyer_hash(sale: u64, user_id: &str) -> String {
    hex(&Sha256::digest(
        format!("seckill-draw-buyer\n{sale}\n{user_id}").as_bytes(),
    ))
}

/// The digest of the frozen entries: SHA-256 of their sorted
/// `BUYER_HASH,QUANTITY` lines, each ended by a newline.
pub fn entries_digest(entries: &[Entry]) -> String {
    let mut lines: Vec<String> = entries
        .iter()
        .map(|e| format!("{},{}\n", e.buyer_hash, e.quantity))
        .collect();
    lines.sort_unstable();
    let mut h = Sha256::new();
    for l in &lines {
        h.update(l.as_bytes());
    }
    hex(&h.finalize())
}

/// The draw key: HMAC-SHA256 under the seed of the entries' digest and the
/// public value (empty when none).
pub fn draw_key(seed: &[u8; SEED_LEN], digest: &str, public_value: &str) -> [u8; 32] {
    hmac(
        seed,
        format!("seckill-draw-key\n{digest}\n{public_value}").as_bytes(),
    )
}

/// The entries' indexes in draw order under `key`.
pub fn draw_order(key: &[u8; 32], entries: &[Entry]) -> Vec<usize> {
    let mut keyed: Vec<(String, &str, usize)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            (
                hex(&hmac(key, e.buyer_hash.as_bytes())),
                e.buyer_hash.as_str(),
                i,
            )
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// The draw of `units` among `entries` with `seed` and the sale's public
/// value (empty when none): see the module's rules.
pub fn draw(seed: &[u8; SEED_LEN], public_value: &str, entries: &[Entry], units: u64) -> Outcome {
    let entries_digest = entries_digest(entries);
    let key = draw_key(seed, &entries_digest, public_value);
    let mut left = units;
    let mut winners = Vec::new();
    let mut waitlist = Vec::new();
    for i in draw_order(&key, entries) {
        let q = u64::from(entries[i].quantity);
        if q <= left && q > 0 {
            left -= q;
            winners.push(i);
        } else {
            waitlist.push(i);
        }
    }
    Outcome {
        entries_digest,
        winners,
        waitlist,
        units_given: units - left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: usize, quantity: impl Fn(usize) -> u32) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                buyer_hash: buyer_hash(7, &format!("u{i}")),
                quantity: quantity(i),
            })
            .collect()
    }

    #[test]
    fn the_commitment_and_buyer_hash_are_sha256_of_what_the_rules_say() {
        // SHA-256 of 32 zero bytes, and of "seckill-draw-buyer\n7\nalice".
        assert_eq!(
            commitment(&[0; SEED_LEN]),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert_eq!(
            buyer_hash(7, "alice"),
            hex(&Sha256::digest(b"seckill-draw-buyer\n7\nalice"))
        );
        assert_ne!(buyer_hash(7, "alice"), buyer_hash(8, "alice"));
    }

    #[test]
    fn the_digest_does_not_depend_on_the_order_entries_arrived_in() {
        let mut e = entries(50, |i| 1 + (i % 3) as u32);
        let d = entries_digest(&e);
        e.reverse();
        assert_eq!(entries_digest(&e), d);
        e[0].quantity += 1;
        assert_ne!(entries_digest(&e), d);
    }

    #[test]
    fn the_same_seed_and_entries_give_the_same_winners_and_another_seed_others() {
        let e = entries(1000, |_| 1);
        let a = draw(&[1; SEED_LEN], "", &e, 100);
        assert_eq!(a, draw(&[1; SEED_LEN], "", &e, 100));
        assert_eq!(
            (a.winners.len(), a.waitlist.len(), a.units_given),
            (100, 900, 100)
        );
        let b = draw(&[2; SEED_LEN], "", &e, 100);
        let c = draw(&[1; SEED_LEN], "beacon round 42", &e, 100);
        assert_ne!(a.winners, b.winners);
        assert_ne!(a.winners, c.winners);
    }

    #[test]
    fn an_entry_that_does_not_fit_is_skipped_not_cut() {
        let e = entries(200, |i| if i % 2 == 0 { 3 } else { 1 });
        let units = 10;
        let o = draw(&[9; SEED_LEN], "", &e, units);
        let given: u64 = o.winners.iter().map(|&i| u64::from(e[i].quantity)).sum();
        assert_eq!(given, o.units_given);
        assert_eq!(given, units, "200 entries of 1 and 3 units fill 10 exactly");
        // Every waitlisted entry before the last winner was too big for what
        // was left when its turn came.
        let order = draw_order(&draw_key(&[9; SEED_LEN], &o.entries_digest, ""), &e);
        let mut left = units;
        for i in order {
            let q = u64::from(e[i].quantity);
            if o.winners.contains(&i) {
                left -= q;
            } else {
                assert!(
                    q > left || left == 0,
                    "entry {i} ({q}) skipped with {left} left"
                );
            }
        }
        assert_eq!(o.winners.len() + o.waitlist.len(), 200);
    }
}
