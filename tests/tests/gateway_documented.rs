//! Specifies, over real HTTP, documented answers no other test exercises:
//! a `failed` purchase status, a bad user id in a GET path, the
//! `Allow` header of GET-only routes, a query string, and the memory fast
//! path for ended and unknown sales (no script call on the second ask).

use crate::support::gateway as gateway_support;

use gateway_support::{get, load_sale, open_sale, request, Client, Gateway};
use seckill_common::keys::SaleKeys;
use seckill_tests::RedisServer;

#[test]
fn documented_answers_over_http() {
    let redis = RedisServer::start();
    open_sale(&redis, 1, 5);
    let g = Gateway::start(&redis, &[]);
    let p = g.port;
    let mut c = Client::connect(p);

    // A dead-lettered (or released) reservation reads `failed`.
    let r = c.buy(1, "alice");
    assert_eq!(r.status, 202);
    let rid = r.json()["reservation_id"].as_str().unwrap().to_string();
    let _: () = redis::cmd("HSET")
        .arg(SaleKeys::new(1).status())
        .arg(&rid)
        .arg("failed")
        .query(&mut redis.con())
        .unwrap();
    let s = get(p, "/v1/sales/1/purchases/alice");
    assert_eq!(s.status, 200);
    assert_eq!(
        s.json(),
        serde_json::json!({"reservation_id": rid, "status": "failed", "quantity": 1})
    );

    // A bad user id in the path: 400 with the rule.
    let bad = get(p, "/v1/sales/1/purchases/a%20b");
    assert_eq!(bad.status, 400);
    assert_eq!(bad.error(), "invalid_request");
    assert_eq!(
        bad.json()["detail"],
        "user_id must be 1-64 characters of A-Z a-z 0-9 _ . -"
    );

    // GET-only routes name their method.
    for path in [
        "/v1/sales/1",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/sales/1/purchases/alice",
    ] {
        let r = request(p, "POST", path, Some("{}"));
        assert_eq!((r.status, r.header("Allow")), (405, Some("GET")), "{path}");
        assert_eq!(r.error(), "method_not_allowed", "{path}");
    }

    // A query string is refused, whatever the route.
    let q = get(p, "/v1/sales/1?verbose=1");
    assert_eq!(
        (q.status, q.error()),
        (400, "invalid_request".into()),
        "{q:?}"
    );
    assert_eq!(q.json()["detail"], "query strings are not accepted");

    // Unknown and ended sales: the second purchase is answered from memory.
    load_sale(&redis, 2, 5, -10_000, 1_000); // ended 9 s ago
    for (sale, status, code) in [(999, 404, "sale_not_found"), (2, 403, "sale_ended")] {
        let first = c.buy(sale, "bob");
        assert_eq!((first.status, first.error()), (status, code.into()));
        let calls = gateway_support::evalsha_calls(&redis);
        let again = c.buy(sale, "carol");
        assert_eq!((again.status, again.error()), (status, code.into()));
        assert_eq!(
            gateway_support::evalsha_calls(&redis),
            calls,
            "sale {sale}: a script call"
        );
    }
}
