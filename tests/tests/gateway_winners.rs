//! Specifies what a winner hears when it retries after the sell-out
//! (docs/reliability.md §1): 409 with its own reservation id, every time, from every gateway,
//! while everyone else gets 410; and after an operator releases one winner,
//! that user may buy again within a second while every other winner still
//! gets 409.

use crate::support::gateway as gateway_support;

use gateway_support::{open_sale, Client, Gateway};
use seckill_tests::RedisServer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Sends `users` (each once) over `connections` keep-alive connections to
/// `port`; returns user -> (status, reservation id of a 202).
fn crowd(
    port: u16,
    sale: u64,
    users: &[String],
    connections: usize,
) -> HashMap<String, (u16, Option<String>)> {
    let next = Arc::new(Mutex::new(users.to_vec()));
    let handles: Vec<_> = (0..connections)
        .map(|_| {
            let next = next.clone();
            thread::spawn(move || {
                let mut c = Client::connect(port);
                let mut out = Vec::new();
                while let Some(u) = next.lock().unwrap().pop() {
                    let r = c.buy(sale, &u);
                    let rid = (r.status == 202)
                        .then(|| r.json()["reservation_id"].as_str().unwrap().to_string());
                    out.push((u, (r.status, rid)));
                }
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

fn winners(answers: &HashMap<String, (u16, Option<String>)>) -> Vec<(String, String)> {
    let mut w: Vec<(String, String)> = answers
        .iter()
        .filter_map(|(u, (_, rid))| rid.clone().map(|r| (u.clone(), r)))
        .collect();
    w.sort();
    w
}

/// The answer a retry must get: 409 `already_purchased` with `rid`.
fn assert_409(r: &gateway_support::Resp, rid: &str, who: &str) {
    assert_eq!(r.status, 409, "{who}: {r:?}");
    assert_eq!(r.error(), "already_purchased", "{who}");
    assert_eq!(r.json()["reservation_id"], rid, "{who}");
}

#[test]
fn winners_retrying_after_the_sell_out_get_409_with_their_id_in_every_trial() {
    let redis = RedisServer::start();
    // Four group-commit threads: more replies concluded out of order.
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_REDIS_THREADS", "4")]);
    let mut wrong = 0;
    for trial in 0..20u64 {
        let sale = 100 + trial;
        open_sale(&redis, sale, 300);
        let users: Vec<String> = (0..1500).map(|i| format!("t{trial}-u{i}")).collect();
        let answers = crowd(g.port, sale, &users, 64);
        let w = winners(&answers);
        assert_eq!(w.len(), 300, "trial {trial}");
        let sold_out = answers.values().filter(|(s, _)| *s == 410).count();
        assert_eq!(sold_out, 1200, "trial {trial}");
        // Five winners retry 20 times each, right after the sell-out.
        let mut c = Client::connect(g.port);
        for (user, rid) in w.iter().step_by(60) {
            for _ in 0..20 {
                let r = c.buy(sale, user);
                if r.status != 409 || r.json()["reservation_id"] != rid.as_str() {
                    wrong += 1;
                }
            }
        }
        // A loser's retry is still 410.
        assert_eq!(c.buy(sale, &format!("t{trial}-late")).status, 410);
    }
    assert_eq!(wrong, 0, "wrong answers to winners' retries over 20 trials");
}

#[test]
fn retries_alternating_between_two_gateways_get_409_from_both() {
    let redis = RedisServer::start();
    open_sale(&redis, 5, 50);
    let g1 = Gateway::start(&redis, &[]);
    let g2 = Gateway::start(&redis, &[]);
    let users: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
    let answers = crowd(g1.port, 5, &users, 16);
    let w = winners(&answers);
    assert_eq!(w.len(), 50);
    // g2 never saw these buyers; its first purchase learns the sell-out.
    let mut c1 = Client::connect(g1.port);
    let mut c2 = Client::connect(g2.port);
    assert_eq!(c2.buy(5, "newcomer").status, 410);
    let mut answered = 0;
    for round in 0..10 {
        for (user, rid) in &w {
            let c = if round % 2 == 0 { &mut c2 } else { &mut c1 };
            assert_409(&c.buy(5, user), rid, user);
            answered += 1;
        }
    }
    assert_eq!(answered, 500);
    assert_eq!(c1.buy(5, "nobody").status, 410);
    assert_eq!(c2.buy(5, "nobody").status, 410);
}

#[test]
fn a_released_winner_may_buy_again_within_a_second_and_the_others_still_get_409() {
    let redis = RedisServer::start();
    open_sale(&redis, 9, 20);
    let g = Gateway::start(&redis, &[]);
    let users: Vec<String> = (0..100).map(|i| format!("u{i}")).collect();
    let w = winners(&crowd(g.port, 9, &users, 8));
    assert_eq!(w.len(), 20);
    let mut c = Client::connect(g.port);
    for (user, rid) in &w {
        assert_409(&c.buy(9, user), rid, user);
    }
    // The operator rolls the first winner back.
    let (released, old_rid) = &w[0];
    let out = seckill_common::release::release(&mut redis.con(), 9, old_rid, &[]).unwrap();
    assert_eq!(
        out,
        seckill_common::release::ReleaseOutcome::Released { stock_after: 1 }
    );
    // Within a second (the sold-out answer is trusted 500 ms, then one
    // purchase rechecks), the released user buys again.
    thread::sleep(Duration::from_secs(1));
    let again = c.buy(9, released);
    assert_eq!(again.status, 202, "{again:?}");
    let new_rid = again.json()["reservation_id"].as_str().unwrap().to_string();
    assert_ne!(&new_rid, old_rid);
    // Sold out again: every winner, the released one included, gets 409
    // with the id it holds now; anyone else 410.
    assert_409(&c.buy(9, released), &new_rid, released);
    for (user, rid) in &w[1..] {
        assert_409(&c.buy(9, user), rid, user);
    }
    assert_eq!(c.buy(9, "u-other").status, 410);
    // No worker: 20 flow records and 20 queued messages, the released
    // one's gone from both.
    assert_eq!(gateway_support::counts(&redis, 9), (0, 20, 20));
}

/// A unit released while another winner keeps retrying: the retries (409)
/// tell the gateway the stock came back, so the next buyer gets it at once
/// (were each retry an inconclusive recheck, the sale would stay
/// remembered sold out and the next buyer hear 410 for as long as the
/// winner retried).
#[test]
fn a_returned_unit_is_sold_at_once_while_a_winner_keeps_retrying() {
    let redis = RedisServer::start();
    open_sale(&redis, 5, 2);
    let g = Gateway::start(&redis, &[("SECKILL_GATEWAY_BUYER_RATE", "0")]);
    let mut c = Client::connect(g.port);
    let first = c.buy(5, "w1");
    assert_eq!(first.status, 202);
    assert_eq!(c.buy(5, "w2").status, 202);
    assert_eq!(c.buy(5, "n1").status, 410);
    let rid = first.json()["reservation_id"].as_str().unwrap().to_string();
    let out = seckill_common::release::release(&mut redis.con(), 5, &rid, &[]).unwrap();
    assert_eq!(
        out,
        seckill_common::release::ReleaseOutcome::Released { stock_after: 1 }
    );
    // w2 retries for 1.2 s: past the memory's 500 ms trust, one of them is
    // the recheck that reaches Redis.
    let port = g.port;
    let retries = thread::spawn(move || {
        let mut c = Client::connect(port);
        let until = std::time::Instant::now() + Duration::from_millis(1200);
        let mut answers = Vec::new();
        while std::time::Instant::now() < until {
            answers.push(c.buy(5, "w2").status);
        }
        answers
    });
    let answers = retries.join().unwrap();
    assert!(answers.iter().all(|&s| s == 409), "{answers:?}");
    assert_eq!(c.buy(5, "n2").status, 202);
    assert_eq!(gateway_support::counts(&redis, 5), (0, 2, 2));
}
