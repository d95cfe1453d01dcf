//! Owns the request plan: which user clicks when, who clicks twice (a
//! second purchase, or the same purchase again with the same
//! `Idempotency-Key`), how many units each purchase asks for (`--quantities`)
//! and where the hostile requests go. Pure and seeded, so a run can be
//! repeated exactly with `--seed`.

/// A hostile request mixed into the crowd, with the answers it may get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostile {
    /// Truncated JSON `{"user_id":` -> 400.
    TruncatedJson,
    /// `{"user_id":42}` -> 400.
    NumericUser,
    /// A user id of 65 characters -> 400.
    LongUser,
    /// A user id with a space and a control character -> 400.
    BadCharacters,
    /// A purchase on a sale id that does not exist -> 404.
    UnknownSale,
    /// A 5,000-byte body, over the 4 KiB limit -> 413 (or a closed connection).
    Oversized,
    /// `/v1/sales/abc/purchases` -> 400 or 404.
    NonNumericSale,
    /// A token with the right `kid` signed by another key -> 401
    /// `invalid_token` (only when the crowd carries tokens).
    ForgedToken,
    /// A token that expired two minutes ago -> 401 `token_expired`.
    ExpiredToken,
    /// A valid token of one user for a body naming another -> 403
    /// `user_mismatch`.
    OtherUserToken,
}

impl Hostile {
    /// The kinds that need tokens, mixed in after [`Hostile::ALL`] when the
    /// crowd carries tokens.
    pub const IDENTITY: [Hostile; 3] = [
        Hostile::ForgedToken,
        Hostile::ExpiredToken,
        Hostile::OtherUserToken,
    ];

    /// Every kind that needs no token, in the order they are mixed in.
    pub const ALL: [Hostile; 7] = [
        Hostile::TruncatedJson,
        Hostile::NumericUser,
        Hostile::LongUser,
        Hostile::BadCharacters,
        Hostile::UnknownSale,
        Hostile::Oversized,
        Hostile::NonNumericSale,
    ];

    /// A short stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Hostile::TruncatedJson => "truncated_json",
            Hostile::NumericUser => "numeric_user_id",
            Hostile::LongUser => "user_id_65_chars",
            Hostile::BadCharacters => "user_id_bad_characters",
            Hostile::UnknownSale => "unknown_sale",
            Hostile::Oversized => "body_over_limit",
            Hostile::NonNumericSale => "non_numeric_sale_id",
            Hostile::ForgedToken => "forged_token",
            Hostile::ExpiredToken => "expired_token",
            Hostile::OtherUserToken => "other_users_token",
        }
    }

    /// The `error` code the answer must carry, where one is documented
    /// beside the status (the identity kinds).
    pub fn code(self) -> Option<&'static str> {
        match self {
            Hostile::ForgedToken => Some("invalid_token"),
            Hostile::ExpiredToken => Some("token_expired"),
            Hostile::OtherUserToken => Some("user_mismatch"),
            _ => None,
        }
    }

    /// The statuses the gateway API (README "HTTP API") documents for this request.
    /// `0` stands for "the server closed the connection", allowed only where
    /// the API allows it (an oversized body may be cut off).
    pub fn allowed(self) -> &'static [u16] {
        match self {
            Hostile::UnknownSale => &[404],
            Hostile::Oversized => &[413, 0],
            Hostile::NonNumericSale => &[400, 404],
            Hostile::ForgedToken | Hostile::ExpiredToken => &[401],
            Hostile::OtherUserToken => &[403],
            _ => &[400],
        }
    }

    /// The request's path and body for `sale_id`.
    pub fn path_and_body(self, sale_id: u64) -> (String, Vec<u8>) {
        let purchases = format!("/v1/sales/{sale_id}/purchases");
        match self {
            Hostile::TruncatedJson => (purchases, br#"{"user_id":"#.to_vec()),
            Hostile::NumericUser => (purchases, br#"{"user_id":42}"#.to_vec()),
            Hostile::LongUser => (
                purchases,
                format!(r#"{{"user_id":"{}"}}"#, "x".repeat(65)).into_bytes(),
            ),
            Hostile::BadCharacters => (purchases, b"{\"user_id\":\"a b\\u0001\"}".to_vec()),
            Hostile::UnknownSale => (
                format!(
                    "/v1/sales/{}/purchases",
                    sale_id.saturating_add(1_000_000_000)
                ),
                br#"{"user_id":"hostile-unknown-sale"}"#.to_vec(),
            ),
            Hostile::Oversized => (
                purchases,
                format!(r#"{{"user_id":"big","pad":"{}"}}"#, "p".repeat(5000)).into_bytes(),
            ),
            Hostile::NonNumericSale => (
                "/v1/sales/abc/purchases".to_string(),
                br#"{"user_id":"hostile-abc"}"#.to_vec(),
            ),
            // The token (`drive.rs`) is of `hostile-token`; the mismatch
            // names someone else.
            Hostile::ForgedToken | Hostile::ExpiredToken => (purchases, b"{}".to_vec()),
            Hostile::OtherUserToken => (purchases, br#"{"user_id":"hostile-victim"}"#.to_vec()),
        }
    }
}

/// One planned purchase: who, which of their purchases, how many units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buy {
    /// User number `n` (its id is `PREFIX-n`).
    pub user: u32,
    /// Which of the user's purchases: 0 the first, 1 a second one (a new
    /// `Idempotency-Key`, [`idempotency_key`]). A same-key retry repeats
    /// its purchase's number.
    pub key: u8,
    /// Units asked for (1 unless `--quantities` mixes more).
    pub quantity: u8,
    /// This is a retry of purchase `key` with the same key and body.
    pub retry: bool,
}

impl Buy {
    /// User `user`'s first purchase of one unit (what every purchase is
    /// without `--quantities`).
    pub fn first(user: u32) -> Buy {
        Buy {
            user,
            key: 0,
            quantity: 1,
            retry: false,
        }
    }
}

/// The `Idempotency-Key` of purchase number `key` (of whichever user: the
/// reservation id is drawn from the sale, the user and the key).
pub fn idempotency_key(key: u8) -> String {
    format!("k{key}")
}

/// One planned request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A purchase.
    Purchase(Buy),
    /// A hostile request.
    Hostile(Hostile),
}

/// What to plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSpec {
    /// Distinct users, each clicking once.
    pub users: u32,
    /// Share of users who click twice, 0.0 to 1.0.
    pub duplicates: f64,
    /// Hostile requests mixed in (the kinds in turn).
    pub hostile: u32,
    /// How far (in requests) a second click may trail the first: about the
    /// number of connections, so both are in flight together.
    pub spread: u32,
    /// Seed of the shuffle.
    pub seed: u64,
    /// The crowd carries tokens: the identity kinds are mixed in too.
    pub identity: bool,
    /// Weights of 1, 2, 3, ... units per purchase (`--quantities 70:20:10`);
    /// empty: one unit each.
    pub quantities: Vec<u32>,
    /// Share of users who send their first purchase again with the same
    /// key and body, 0.0 to 1.0.
    pub retry_same_key: f64,
}

/// splitmix64: a tiny, well-mixed generator; the plan needs repeatability,
/// not cryptographic strength.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The number of users who click twice: `users × duplicates`, rounded.
pub fn duplicate_count(spec: &PlanSpec) -> u32 {
    ((spec.users as f64) * spec.duplicates.clamp(0.0, 1.0)).round() as u32
}

/// The number of users who retry with the same key: `users ×
/// retry_same_key`, rounded.
pub fn retry_count(spec: &PlanSpec) -> u32 {
    ((spec.users as f64) * spec.retry_same_key.clamp(0.0, 1.0)).round() as u32
}

/// A quantity drawn by `weights` (index i weighs i + 1 units); 1 when
/// there are none (or they are all 0), and `rng` is then not drawn from.
pub fn draw_quantity(rng: &mut Rng, weights: &[u32]) -> u8 {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if weights.len() < 2 || total == 0 {
        return 1;
    }
    let mut x = rng.below(total);
    for (i, &w) in weights.iter().enumerate() {
        if x < u64::from(w) {
            return (i + 1) as u8;
        }
        x -= u64::from(w);
    }
    1
}

/// Builds the plan: users in random order, a second purchase (a new key)
/// for [`duplicate_count`] of them and a same-key retry of the first for
/// [`retry_count`] of them, each at most `spread` requests after the
/// first, the hostile requests at random places, but for the identity
/// kinds, which come first ([`lead`]). Quantities are drawn from their own
/// generator, so the order of the users does not depend on them.
pub fn build(spec: &PlanSpec) -> Vec<Step> {
    let mut rng = Rng::new(spec.seed);
    let mut units = Rng::new(spec.seed ^ 0x5155_414e_5449_5459);
    let mut order: Vec<u32> = (0..spec.users).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let dups = duplicate_count(spec) as u64;
    let retries = retry_count(spec) as u64;
    // Sort keys: first clicks at 4i, a second purchase or a retry a little
    // later, hostile requests anywhere; the low bits keep kinds apart on
    // equal positions.
    let mut keyed: Vec<(u64, Step)> =
        Vec::with_capacity(order.len() + (dups + retries) as usize + 8);
    for (i, &user) in order.iter().enumerate() {
        let i = i as u64;
        let first = Buy {
            quantity: draw_quantity(&mut units, &spec.quantities),
            ..Buy::first(user)
        };
        keyed.push((i * 4, Step::Purchase(first)));
        // Users are already shuffled, so "the first `dups` by user number"
        // (and "the last `retries`") is a random choice of positions.
        if (user as u64) < dups {
            let later = i + 1 + rng.below(spec.spread.max(1) as u64);
            let second = Buy {
                key: 1,
                quantity: draw_quantity(&mut units, &spec.quantities),
                ..first
            };
            keyed.push((later * 4 + 1, Step::Purchase(second)));
        }
        if u64::from(spec.users - user) <= retries {
            let later = i + 1 + rng.below(spec.spread.max(1) as u64);
            let again = Buy {
                retry: true,
                ..first
            };
            keyed.push((later * 4 + 3, Step::Purchase(again)));
        }
    }
    let n = order.len().max(1) as u64;
    let kinds: Vec<Hostile> = if spec.identity {
        Hostile::ALL
            .iter()
            .chain(&Hostile::IDENTITY)
            .copied()
            .collect()
    } else {
        Hostile::ALL.to_vec()
    };
    let mut lead = Vec::new();
    for h in 0..spec.hostile {
        let kind = kinds[h as usize % kinds.len()];
        if Hostile::IDENTITY.contains(&kind) {
            lead.push(Step::Hostile(kind));
        } else {
            keyed.push((rng.below(n) * 4 + 2, Step::Hostile(kind)));
        }
    }
    keyed.sort_by_key(|(k, _)| *k);
    lead.extend(keyed.into_iter().map(|(_, s)| s));
    lead
}

/// How many steps open `plan` with the identity kinds, which [`build`]
/// puts first: a sale the gateway knows sold out is answered 410 whatever
/// the token (public facts before identity), so a bad token is sure to
/// hear 401 or 403 only before the crowd can sell the sale out
/// (`drive.rs` sends these alone, first).
pub fn lead(plan: &[Step]) -> usize {
    plan.iter()
        .take_while(|s| matches!(s, Step::Hostile(h) if Hostile::IDENTITY.contains(h)))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn plan_has_every_user_the_duplicates_and_the_hostile_requests() {
        let spec = PlanSpec {
            users: 1000,
            duplicates: 0.1,
            hostile: 9,
            spread: 64,
            seed: 7,
            identity: false,
            quantities: Vec::new(),
            retry_same_key: 0.0,
        };
        let plan = build(&spec);
        assert_eq!(plan.len(), 1000 + 100 + 9);
        let mut clicks: HashMap<u32, u32> = HashMap::new();
        let mut hostile = 0;
        for s in &plan {
            match s {
                Step::Purchase(b) => *clicks.entry(b.user).or_default() += 1,
                Step::Hostile(_) => hostile += 1,
            }
        }
        assert_eq!(clicks.len(), 1000);
        assert_eq!(clicks.values().filter(|&&c| c == 2).count(), 100);
        assert_eq!(hostile, 9);
        assert_eq!(build(&spec), plan, "same seed, same plan");
        assert_eq!(lead(&plan), 0);
    }

    #[test]
    fn quantities_follow_the_mix_and_retries_repeat_the_first_purchase() {
        let spec = PlanSpec {
            users: 10_000,
            duplicates: 0.25,
            hostile: 0,
            spread: 64,
            seed: 3,
            identity: false,
            quantities: vec![70, 20, 10],
            retry_same_key: 0.5,
        };
        let plan = build(&spec);
        assert_eq!(plan.len(), 10_000 + 2_500 + 5_000);
        let buys: Vec<Buy> = plan
            .iter()
            .filter_map(|s| match s {
                Step::Purchase(b) => Some(*b),
                Step::Hostile(_) => None,
            })
            .collect();
        let firsts: HashMap<u32, Buy> = buys
            .iter()
            .filter(|b| b.key == 0 && !b.retry)
            .map(|b| (b.user, *b))
            .collect();
        assert_eq!(firsts.len(), 10_000);
        let by_units = |q: u8| firsts.values().filter(|b| b.quantity == q).count();
        // 70 / 20 / 10 % of 10,000 within a few percent (seeded: exact
        // figures for this seed, stable from run to run).
        let (one, two, three) = (by_units(1), by_units(2), by_units(3));
        assert_eq!(one + two + three, 10_000);
        assert!((6_700..7_300).contains(&one), "{one}");
        assert!((1_700..2_300).contains(&two), "{two}");
        assert!((800..1_200).contains(&three), "{three}");
        let at: HashMap<Buy, usize> = buys.iter().enumerate().map(|(i, b)| (*b, i)).collect();
        let retries: Vec<&Buy> = buys.iter().filter(|b| b.retry).collect();
        assert_eq!(retries.len(), 5_000);
        for r in retries {
            let first = firsts[&r.user];
            assert_eq!((r.key, r.quantity), (first.key, first.quantity));
            assert!(at[r] > at[&first], "a retry follows its purchase");
        }
        let seconds = buys.iter().filter(|b| b.key == 1).count();
        assert_eq!(seconds, 2_500);
        assert_eq!(build(&spec), plan, "same seed, same plan");
    }

    #[test]
    fn without_a_mix_every_purchase_is_one_unit_and_the_order_is_unchanged() {
        let mut spec = PlanSpec {
            users: 500,
            duplicates: 0.1,
            hostile: 7,
            spread: 16,
            seed: 11,
            identity: false,
            quantities: Vec::new(),
            retry_same_key: 0.0,
        };
        let plain = build(&spec);
        assert!(plain
            .iter()
            .all(|s| !matches!(s, Step::Purchase(b) if b.quantity != 1 || b.retry)));
        spec.quantities = vec![1];
        assert_eq!(build(&spec), plain, "a one-unit mix draws nothing");
        spec.quantities = vec![50, 50];
        let users = |p: &[Step]| -> Vec<u32> {
            p.iter()
                .filter_map(|s| match s {
                    Step::Purchase(b) => Some(b.user),
                    Step::Hostile(_) => None,
                })
                .collect()
        };
        assert_eq!(users(&build(&spec)), users(&plain), "the same crowd order");
    }

    #[test]
    fn the_identity_kinds_lead_the_plan() {
        let spec = PlanSpec {
            users: 100,
            duplicates: 0.1,
            hostile: 10,
            spread: 8,
            seed: 6,
            identity: true,
            quantities: Vec::new(),
            retry_same_key: 0.0,
        };
        let plan = build(&spec);
        assert_eq!(lead(&plan), 3);
        assert_eq!(
            plan[..3],
            Hostile::IDENTITY.map(Step::Hostile),
            "one of each, first"
        );
        assert_eq!(plan.len(), 100 + 10 + 10);
    }
}
