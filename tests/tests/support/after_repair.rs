//! Owns the check every repair test ends with: the buyers who hold orders
//! are answered 409 with their own reservation ids, and the sale then
//! sells out to exactly its stock, one order per buyer.

use super::gateway::Resp;
use super::worker::wait_orders;
use seckill_tests::TestDb;
use std::collections::HashMap;
use std::time::Duration;

/// After `sale repair` of `sale` (`stock` units): each of `holders`
/// (`u0`, `u1`, ... as `rids` holds them: user → reservation id) buys
/// again and gets 409 with their own id; new buyers `v0`, `v1`, ... then
/// take exactly the `stock - holders` units left, 202 each until 410; MySQL
/// ends with `stock` orders of the sale, no buyer with two.
pub fn holders_409_then_sells_out_exactly(
    mut buy: impl FnMut(&str) -> Resp,
    rids: &HashMap<String, String>,
    holders: u64,
    db: &TestDb,
    (sale, stock): (u64, u64),
) {
    for i in 0..holders {
        let u = format!("u{i}");
        let r = buy(&u);
        assert_eq!(r.status, 409, "{u}: {r:?}");
        assert_eq!(r.json()["reservation_id"], rids[&u].as_str(), "{u}");
    }
    let mut sold = 0;
    for i in 0..stock {
        let r = buy(&format!("v{i}"));
        match r.status {
            202 => sold += 1,
            410 => break,
            s => panic!("v{i}: {s} {r:?}"),
        }
    }
    assert_eq!(sold, stock - holders);
    wait_orders(db, sale, stock as i64, Duration::from_secs(60));
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE sale_id = {sale}"
        )),
        stock as i64
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE sale_id = {sale} \
             GROUP BY user_id HAVING COUNT(*) > 1) t"
        )),
        0
    );
}
