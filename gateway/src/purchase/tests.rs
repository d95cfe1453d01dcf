//! Tests of the purchase layer without HTTP and without a Redis call:
//! admission decisions, the sold-out memory answering a crowd, and what
//! Redis's replies conclude to.

use super::*;
use crate::admission::credentials::Refused;
use crate::admission::tests::{jwt_admission, token};
use crate::redis::reserver::Mode;
use buyer_set::BuyerSet;
use seckill_common::redis_target::Target;

const RID: &str = "0123456789abcdef0123456789abcdef";

/// A purchase path whose Redis (port 1) is never reached by these tests.
fn purchases() -> Purchases {
    let metrics = Arc::new(Metrics::default());
    let client = Target::open("redis://127.0.0.1:1/").unwrap();
    let timeout = std::time::Duration::from_millis(10);
    let links = Arc::new(LinkPool::new(&client, 1, timeout, &metrics));
    let (loader, _requests) = buyers::loader();
    Purchases {
        soldout: Arc::new(SoldOutCache::new(100)),
        paused: Default::default(),
        buckets: Arc::new(BucketCounts::default()),
        buyers: loader,
        reserver: Reserver::new(Mode::RoundTrip, links.clone(), timeout, metrics.clone()),
        links,
        fitness: Arc::new(Fitness::default()),
        metrics,
    }
}

fn replied(outcome: ReserveOutcome, seq: u64, stock: Option<u64>) -> Result<Replied, Unavailable> {
    Ok(Replied {
        outcome,
        seq,
        stock,
    })
}

#[test]
fn a_sold_out_sale_answers_from_memory_winners_with_their_id_and_others_sold_out() {
    let (a, hs, ed) = jwt_admission(1);
    let p = purchases();
    let now = Instant::now();
    assert!(p.soldout.closed(7, Closed::SoldOut, 3, now));
    let mut set = BuyerSet::default();
    assert!(set.insert("alice", RID));
    p.soldout.loaded(7, 3, Some(set), false, u64::MAX);
    for s in [&hs, &ed] {
        assert_eq!(
            p.admit(&a, 7, b"{}", &token(s, "alice")),
            Err(Decision::AlreadyPurchased(RID.into()))
        );
        for _ in 0..3 {
            assert_eq!(
                p.admit(&a, 7, b"{}", &token(s, "bob")),
                Err(Decision::Closed(Closed::SoldOut))
            );
        }
    }
    // Answers from memory cost no share (the share is 1).
    assert_eq!(a.metrics.limited_buyer.get(), 0);
    assert_eq!(p.metrics.outcome_total(Outcome::SoldOutFromMemory), 6);
}

#[test]
fn a_body_a_token_or_an_unfit_redis_is_decided_before_the_sale() {
    let (a, hs, _) = jwt_admission(1);
    let p = purchases();
    assert_eq!(
        p.admit(&a, 7, b"", &token(&hs, "alice")),
        Err(Decision::Invalid("empty body"))
    );
    assert_eq!(
        p.admit(&a, 7, br#"{"user_id":"bob"}"#, &token(&hs, "alice")),
        Err(Decision::Denied(Denied::UserMismatch))
    );
    assert_eq!(
        p.admit(&a, 7, b"{}", &Credentials::Bearer("x.y.z".into())),
        Err(Decision::Denied(Denied::Token(Refused::Invalid)))
    );
    p.soldout.closed(8, Closed::Ended, 0, Instant::now());
    assert_eq!(
        p.admit(&a, 8, b"{}", &token(&hs, "alice")),
        Err(Decision::Closed(Closed::Ended))
    );
    // Not remembered: the buyer's share is charged, once.
    assert_eq!(
        p.admit(&a, 9, b"{}", &token(&hs, "alice")),
        Ok(("alice".into(), 1))
    );
    assert_eq!(
        p.admit(&a, 9, b"{}", &token(&hs, "alice")),
        Err(Decision::TooManyRequests)
    );
}

#[test]
fn redis_replies_conclude_to_decisions_and_teach_the_memory() {
    let p = purchases();
    let conclude = |o| p.conclude(5, 1, "alice", 1, o);
    assert_eq!(
        conclude(replied(ReserveOutcome::Reserved(RID.into()), 1, None)),
        Decision::Reserved(RID.into())
    );
    assert_eq!(conclude(Err(Unavailable)), Decision::Unavailable);
    assert_eq!(
        conclude(replied(ReserveOutcome::NotStarted, 1, None)),
        Decision::NotStarted
    );
    assert_eq!(
        conclude(replied(ReserveOutcome::Paused("lost".into()), 1, None)),
        Decision::Paused
    );
    assert!(matches!(p.soldout.get(5, Instant::now()), Known::Ask));
    assert_eq!(
        conclude(replied(ReserveOutcome::SoldOut, 2, None)),
        Decision::Closed(Closed::SoldOut)
    );
    assert!(matches!(
        p.soldout.get(5, Instant::now()),
        Known::Closed(Closed::SoldOut, None)
    ));
    // A reservation that ran after the sell-out reopens the sale.
    conclude(replied(ReserveOutcome::Reserved(RID.into()), 3, None));
    assert!(matches!(p.soldout.get(5, Instant::now()), Known::Ask));
    // One lost bucket of a split sale says nothing of the sale.
    assert_eq!(
        p.conclude(
            6,
            4,
            "alice",
            1,
            replied(ReserveOutcome::UnknownSale, 0, None)
        ),
        Decision::Unavailable
    );
    assert!(matches!(p.soldout.get(6, Instant::now()), Known::Ask));
    assert_eq!(
        p.conclude(
            6,
            1,
            "alice",
            1,
            replied(ReserveOutcome::UnknownSale, 0, None)
        ),
        Decision::Closed(Closed::Unknown)
    );
}

/// The units script's answers: none is remembered as sold out (fewer
/// units than asked for is not sold out), a repeat is the reservation.
#[test]
fn units_replies_conclude_to_their_decisions_and_leave_the_memory_alone() {
    use seckill_common::allowance::{Entry, Held};
    let p = purchases();
    let held = Held(vec![Entry {
        reservation_id: RID.into(),
        quantity: 3,
    }]);
    for (o, d) in [
        (
            ReserveOutcome::NotEnoughStock(2),
            Decision::NotEnoughStock(2),
        ),
        (
            ReserveOutcome::LimitReached(held.clone()),
            Decision::LimitReached(held),
        ),
        (ReserveOutcome::AboveMax(3), Decision::AboveMax(3)),
        (ReserveOutcome::OnePerBuyer, Decision::AboveMax(1)),
        (
            ReserveOutcome::Replayed(RID.into()),
            Decision::Reserved(RID.into()),
        ),
        (
            ReserveOutcome::KeyReused(RID.into()),
            Decision::KeyReused(RID.into()),
        ),
        (ReserveOutcome::KeyRequired, Decision::KeyRequired),
    ] {
        assert_eq!(p.conclude(5, 1, "alice", 3, replied(o, 4, None)), d);
        assert!(matches!(p.soldout.get(5, Instant::now()), Known::Ask));
    }
    // None of them took a unit (a replay is the reservation made before);
    // a reservation of 3 units counts one purchase and 3 units.
    assert_eq!(p.metrics.units_reserved_total(), 0);
    assert_eq!(
        p.conclude(
            5,
            1,
            "alice",
            3,
            replied(ReserveOutcome::Reserved(RID.into()), 5, None)
        ),
        Decision::Reserved(RID.into())
    );
    assert_eq!(
        (
            p.metrics.outcome_total(Outcome::Reserved),
            p.metrics.units_reserved_total()
        ),
        (1, 3)
    );
    // A split sale of several units per buyer asks for the key too, and
    // its not-enough answer is not sold out either.
    assert_eq!(
        p.conclude(
            6,
            3,
            "alice",
            1,
            replied(ReserveOutcome::KeyRequired, 0, None)
        ),
        Decision::KeyRequired
    );
    assert_eq!(
        p.conclude(
            6,
            3,
            "alice",
            3,
            replied(ReserveOutcome::NotEnoughStock(2), 0, None)
        ),
        Decision::NotEnoughStock(2)
    );
    assert!(matches!(p.soldout.get(6, Instant::now()), Known::Ask));
}

#[test]
fn forged_tokens_to_a_sold_out_sale_are_410_without_a_signature_check_and_a_winner_is_verified() {
    use seckill_common::token::{generate, Alg, Signer};
    let (a, hs, ed) = jwt_admission(1);
    let p = purchases();
    assert!(p.soldout.closed(7, Closed::SoldOut, 3, Instant::now()));
    let mut set = BuyerSet::default();
    assert!(set.insert("alice", RID));
    p.soldout.loaded(7, 3, Some(set), false, u64::MAX);
    // Signed with keys the gateway does not hold, under its kids.
    let forgers = [
        Signer::new(&generate(Alg::Hs256, "h").unwrap()).unwrap(),
        Signer::new(&generate(Alg::EdDsa, "e").unwrap()).unwrap(),
    ];
    for i in 0..200 {
        let forged = token(&forgers[i % 2], &format!("crowd-{i}"));
        assert_eq!(
            p.admit(&a, 7, b"{}", &forged),
            Err(Decision::Closed(Closed::SoldOut))
        );
    }
    for creds in [Credentials::Missing, Credentials::Bearer("x.y.z".into())] {
        assert_eq!(
            p.admit(&a, 7, b"{}", &creds),
            Err(Decision::Closed(Closed::SoldOut))
        );
    }
    assert_eq!(p.metrics.signature_checks.get(), 0);
    assert_eq!(a.metrics.limited_buyer.get(), 0, "no share spent");
    // A forged token naming the winner is checked, and refused.
    for forger in &forgers {
        assert_eq!(
            p.admit(&a, 7, b"{}", &token(forger, "alice")),
            Err(Decision::Denied(Denied::Token(Refused::Invalid)))
        );
    }
    assert_eq!(p.metrics.signature_checks.get(), 2);
    for s in [&hs, &ed] {
        assert_eq!(
            p.admit(&a, 7, b"{}", &token(s, "alice")),
            Err(Decision::AlreadyPurchased(RID.into()))
        );
    }
}
