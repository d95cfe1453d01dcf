//! Owns what the tests read from `seckill-load --json`: the names of the
//! invariants it checks, in the order of its report
//! (`tests/src/load/invariants.rs`), and each one's verdict.

/// Every invariant `seckill-load` checks when it verifies Redis and MySQL,
/// in report order (docs/DEMO.md shows a report).
pub const INVARIANTS: [&str; 13] = [
    "purchases_answered",
    "hostile_refused",
    "one_reservation_per_user",
    "reserved_le_stock",
    "no_undersell",
    "redis_stock",
    "redis_flow_records",
    "queues_drained",
    "orders_match_reservations",
    "every_202_has_its_order",
    "no_user_with_two_orders",
    "ledger_rows_match_orders",
    "mysql_stock",
];

/// Every invariant `seckill-load --quantities` checks (a quantity mix with
/// an `Idempotency-Key` per purchase), in report order: those of
/// [`INVARIANTS`] counted in units, one reservation per purchase key for
/// one reservation per user, the same-key retries, the per-buyer limit in
/// the answers and Redis (`buyers_within_limit`) and in MySQL
/// (`no_user_over_limit`, for `no_user_with_two_orders`).
pub const UNIT_INVARIANTS: [&str; 15] = [
    "purchases_answered",
    "hostile_refused",
    "one_reservation_per_key",
    "same_key_retries",
    "reserved_le_stock",
    "no_undersell",
    "buyers_within_limit",
    "redis_stock",
    "redis_flow_records",
    "queues_drained",
    "orders_match_reservations",
    "every_202_has_its_order",
    "no_user_over_limit",
    "ledger_rows_match_orders",
    "mysql_stock",
];

/// The invariant `seckill-load --outage` checks right after
/// `purchases_answered` (which then allows 503 answers): no buyer answered
/// only 503 holds a reservation or an order.
pub const OUTAGE: &str = "unavailable_reserved_nothing";

/// The invariants of the order-lifecycle phase (`--pay-share`), after
/// [`INVARIANTS`] in the report (`tests/src/load/lifecycle.rs`).
pub const LIFECYCLE: [&str; 4] = [
    "payments_applied_once",
    "unpaid_orders_expired",
    "returned_units_resold",
    "lifecycle_books",
];

/// The report's `(name, ok)` pairs, in its order.
pub fn verdicts(report: &serde_json::Value) -> Vec<(String, bool)> {
    report["invariants"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or("?").to_string(),
                        c["ok"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// [`INVARIANTS`], each with `ok` unless it is named in `failing`.
pub fn expected(failing: &[&str]) -> Vec<(String, bool)> {
    INVARIANTS
        .iter()
        .map(|name| (name.to_string(), !failing.contains(name)))
        .collect()
}

/// [`UNIT_INVARIANTS`], each with `ok` unless it is named in `failing`.
pub fn expected_units(failing: &[&str]) -> Vec<(String, bool)> {
    UNIT_INVARIANTS
        .iter()
        .map(|name| (name.to_string(), !failing.contains(name)))
        .collect()
}

/// [`INVARIANTS`] then [`LIFECYCLE`], each with `ok`.
pub fn expected_with_lifecycle() -> Vec<(String, bool)> {
    INVARIANTS
        .iter()
        .chain(LIFECYCLE.iter())
        .map(|name| (name.to_string(), true))
        .collect()
}
