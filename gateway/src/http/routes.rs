//! Owns the URL and method table of the v1 API: which handler a request goes
//! to, and the strict parsing of sale ids and user ids in paths. Anything
//! else (query strings, `..`, trailing slashes, ids that are not numbers)
//! ends here as a 400 or 404, never in a handler.

use crate::metrics::Label;
use tiny_http::Method;

/// Where a request goes. Paths are matched segment by segment, as sent
/// (no percent-decoding, no normalisation: `%31` is not `1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /healthz`.
    Healthz,
    /// `GET /readyz`.
    Readyz,
    /// `GET /metrics`.
    Metrics,
    /// `GET /v1/sales/{sale_id}`.
    Sale(u64),
    /// `POST /v1/sales/{sale_id}/purchases`.
    Purchase(u64),
    /// `GET /v1/sales/{sale_id}/purchases/{user_id}`.
    PurchaseStatus(u64, String),
    /// `GET /v1/sales/{sale_id}/purchases/me`: the token's own purchase.
    MyPurchase(u64),
    /// `DELETE /v1/sales/{sale_id}/purchases/me`: the token's buyer cancels
    /// the unpaid order (`payments.rs`).
    CancelMyPurchase(u64),
    /// `POST /v1/payments`: the payment service reports a payment
    /// (`payments.rs`).
    Payment,
    /// A known path with the wrong method; holds the `Allow` value.
    WrongMethod(&'static str),
    /// A sale path whose id is not a sale id (404 `sale_not_found`).
    NoSuchSale,
    /// A request we refuse to interpret (400 with this detail).
    Invalid(&'static str),
    /// No such path (404 `not_found`).
    NotFound,
}

impl Route {
    /// The metrics label of this route.
    pub fn label(&self) -> Label {
        match self {
            Route::Healthz => Label::Healthz,
            Route::Readyz => Label::Readyz,
            Route::Metrics => Label::Metrics,
            Route::Sale(_) => Label::Sale,
            Route::Purchase(_) => Label::Purchase,
            Route::PurchaseStatus(..) | Route::MyPurchase(_) => Label::PurchaseStatus,
            Route::Payment => Label::Payment,
            Route::CancelMyPurchase(_) => Label::Cancel,
            _ => Label::Other,
        }
    }
}

/// A sale id as written in a path: 1-20 ASCII digits, a positive `u64`.
pub fn parse_sale_id(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u64>().ok().filter(|&n| n > 0)
}

/// Routes `method url`.
pub fn route(method: &Method, url: &str) -> Route {
    if url.contains(['?', '#']) {
        return Route::Invalid("query strings are not accepted");
    }
    let Some(path) = url.strip_prefix('/') else {
        return Route::Invalid("the request target must be an absolute path");
    };
    let segs: Vec<&str> = path.split('/').collect();
    let get = *method == Method::Get;
    let want =
        |ok: bool, allow: &'static str, r: Route| if ok { r } else { Route::WrongMethod(allow) };
    match segs.as_slice() {
        ["healthz"] => want(get, "GET", Route::Healthz),
        ["readyz"] => want(get, "GET", Route::Readyz),
        ["metrics"] => want(get, "GET", Route::Metrics),
        ["v1", "payments"] => want(*method == Method::Post, "POST", Route::Payment),
        ["v1", "sales", id, rest @ ..] if rest.len() <= 2 => {
            let Some(sale) = parse_sale_id(id) else {
                return Route::NoSuchSale;
            };
            match rest {
                [] => want(get, "GET", Route::Sale(sale)),
                ["purchases"] => want(*method == Method::Post, "POST", Route::Purchase(sale)),
                ["purchases", "me"] => match *method {
                    Method::Get => Route::MyPurchase(sale),
                    Method::Delete => Route::CancelMyPurchase(sale),
                    _ => Route::WrongMethod("GET, DELETE"),
                },
                // A trailing slash, whatever the method (README, openapi:
                // 404 `not_found`; it was 405 `Allow: GET` for a POST).
                ["purchases", ""] => Route::NotFound,
                ["purchases", user] => {
                    if !get {
                        Route::WrongMethod("GET")
                    } else if seckill_common::is_valid_token(user) {
                        Route::PurchaseStatus(sale, (*user).to_string())
                    } else {
                        Route::Invalid(crate::purchase::body::USER_ID_RULE)
                    }
                }
                _ => Route::NotFound,
            }
        }
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_table() {
        let (g, p) = (Method::Get, Method::Post);
        assert_eq!(route(&p, "/v1/sales/42/purchases"), Route::Purchase(42));
        assert_eq!(route(&g, "/v1/sales/42"), Route::Sale(42));
        assert_eq!(
            route(&g, "/v1/sales/42/purchases/bob"),
            Route::PurchaseStatus(42, "bob".into())
        );
        assert_eq!(
            route(&g, "/v1/sales/42/purchases/me"),
            Route::MyPurchase(42)
        );
        assert_eq!(
            route(&g, "/v1/sales/42/purchases"),
            Route::WrongMethod("POST")
        );
        assert_eq!(route(&p, "/healthz"), Route::WrongMethod("GET"));
        assert_eq!(route(&g, "/metrics"), Route::Metrics);
        assert_eq!(route(&p, "/v1/payments"), Route::Payment);
        assert_eq!(route(&g, "/v1/payments"), Route::WrongMethod("POST"));
        assert_eq!(
            route(&Method::Delete, "/v1/sales/42/purchases/me"),
            Route::CancelMyPurchase(42)
        );
        assert_eq!(
            route(&p, "/v1/sales/42/purchases/me"),
            Route::WrongMethod("GET, DELETE")
        );
        assert_eq!(
            route(&Method::Delete, "/v1/sales/42/purchases/bob"),
            Route::WrongMethod("GET")
        );
    }

    #[test]
    fn odd_paths_never_reach_a_handler() {
        let p = Method::Post;
        assert_eq!(route(&p, "/v1/sales/../../etc/passwd"), Route::NotFound);
        assert_eq!(route(&p, "/v1/sales/abc/purchases"), Route::NoSuchSale);
        assert_eq!(
            route(&p, "/v1/sales/99999999999999999999999/purchases"),
            Route::NoSuchSale
        );
        assert_eq!(route(&p, "/v1/sales/0/purchases"), Route::NoSuchSale);
        for m in [&p, &Method::Get, &Method::Delete, &Method::Put] {
            assert_eq!(route(m, "/v1/sales/1/purchases/"), Route::NotFound);
        }
        assert_eq!(route(&p, "/v1/sales/1/purchases/x/y"), Route::NotFound);
        assert!(matches!(
            route(&p, "/v1/sales/1/purchases?x=1"),
            Route::Invalid(_)
        ));
        assert!(matches!(
            route(&Method::Get, "/v1/sales/1/purchases/a%20b"),
            Route::Invalid(_)
        ));
        assert!(matches!(route(&p, "*"), Route::Invalid(_)));
        assert_eq!(route(&Method::Get, "/healthz/"), Route::NotFound);
    }
}
