//! Tests of the admission layer without HTTP: identities checked with
//! real signed tokens, and the shares charged and counted.

use super::*;
use crate::admission::credentials::Refused;
use crate::admission::identity::Denied;
use crate::admission::verifier::Verifier;
use crate::config::LimitSettings;
use seckill_common::token::{generate, Alg, Claims, KeySet, Signer};

/// An admission verifying HS256 and EdDSA tokens of audience `seckill`,
/// with a buyer share of `burst` (one more a second), and both signers.
pub(crate) fn jwt_admission(burst: u32) -> (Admission, Signer, Signer) {
    let hs = generate(Alg::Hs256, "h").unwrap();
    let ed = generate(Alg::EdDsa, "e").unwrap();
    let public =
        seckill_common::token::parse(&KeySet::of(vec![hs.clone(), ed.clone()]).to_jwks(false))
            .unwrap();
    let limits = LimitSettings {
        buyer_rate: 1,
        buyer_burst: burst,
        address_rate: 0,
        address_burst: 1,
        slots: 1024,
    };
    let admission = Admission {
        identity: Identity::Jwt(Box::new(Verifier::new(
            &public,
            "seckill",
            30,
            24 * 3600,
            1000,
        ))),
        limits: Limits::new(&limits),
        shed: Shed::new(2),
        metrics: Arc::new(Metrics::default()),
    };
    (
        admission,
        Signer::new(&hs).unwrap(),
        Signer::new(&ed).unwrap(),
    )
}

/// A bearer token for `sub` signed by `s`.
pub(crate) fn token(s: &Signer, sub: &str) -> Credentials {
    Credentials::Bearer(s.mint(&Claims::new(sub, "seckill", 60)).unwrap())
}

#[test]
fn a_signed_token_names_the_buyer_and_a_body_may_only_agree() {
    let (a, hs, ed) = jwt_admission(5);
    let m = &a.metrics;
    for s in [&hs, &ed] {
        assert_eq!(
            a.identity.buyer(&token(s, "alice"), None, m),
            Ok("alice".into())
        );
        assert_eq!(
            a.identity
                .buyer(&token(s, "alice"), Some("alice".into()), m),
            Ok("alice".into())
        );
        assert_eq!(
            a.identity.buyer(&token(s, "alice"), Some("bob".into()), m),
            Err(Denied::UserMismatch)
        );
    }
    assert_eq!(
        a.identity.reader(&token(&hs, "alice"), Some("bob"), m),
        Err(Denied::UserMismatch)
    );
    assert_eq!(
        a.identity.reader(&token(&hs, "alice"), None, m),
        Ok("alice".into())
    );
}

#[test]
fn a_forged_missing_or_expired_token_is_refused() {
    let (a, hs, _) = jwt_admission(5);
    let m = &a.metrics;
    // Signed by a key the gateway does not hold, under a kid it does.
    let stranger = Signer::new(&generate(Alg::Hs256, "h").unwrap()).unwrap();
    let forged = token(&stranger, "alice");
    assert_eq!(
        a.identity.buyer(&forged, None, m),
        Err(Denied::Token(Refused::Invalid))
    );
    assert_eq!(
        a.identity
            .buyer(&Credentials::Missing, Some("alice".into()), m),
        Err(Denied::Token(Refused::Invalid))
    );
    let mut old = Claims::new("alice", "seckill", 60);
    old.exp = seckill_common::now_ms() / 1000 - 3600;
    let expired = Credentials::Bearer(hs.mint(&old).unwrap());
    assert_eq!(
        a.identity.buyer(&expired, None, m),
        Err(Denied::Token(Refused::Expired))
    );
    assert_eq!(m.tokens_verified.get(), 0);
}

#[test]
fn without_tokens_the_body_names_the_buyer() {
    let (mut a, _, _) = jwt_admission(5);
    a.identity = Identity::Unverified;
    assert!(a.identity.body_names_buyer());
    let m = &a.metrics;
    assert_eq!(
        a.identity
            .buyer(&Credentials::Missing, Some("carol".into()), m),
        Ok("carol".into())
    );
    assert_eq!(
        a.identity.buyer(&Credentials::Missing, None, m),
        Err(Denied::NoUser)
    );
}

#[test]
fn a_buyers_share_is_charged_per_sale_and_counted_when_used_up() {
    let (a, _, _) = jwt_admission(2);
    assert!(a.charge_buyer(1, "alice"));
    assert!(a.charge_buyer(1, "alice"));
    assert!(!a.charge_buyer(1, "alice"), "burst of 2, one more a second");
    assert!(a.charge_buyer(2, "alice"), "another sale, another share");
    assert!(a.charge_buyer(1, "bob"));
    assert_eq!(a.metrics.limited_buyer.get(), 1);
    let addr: IpAddr = "10.0.0.1".parse().unwrap();
    assert!(a.charge_address(addr), "address rate 0: no limit");
    assert_eq!(a.metrics.limited_address.get(), 0);
}
