//! Owns the flash sale's invariants: the tally of the gateway's answers and
//! the pure checks of answers against Redis and MySQL (never oversell, never
//! silently undersell, one purchase per user, every reservation an order,
//! ledger rows = orders, stocks that add up).

use super::drive::Record;
use super::plan::Step;
use super::state::{MysqlState, RedisState};
use std::collections::{BTreeMap, HashMap};

/// The answers, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Answers by HTTP status (0 = no answer).
    pub by_status: BTreeMap<u16, u64>,
    /// Purchases sent (first and second clicks).
    pub purchases: u64,
    /// Hostile requests sent.
    pub hostile: u64,
    /// Purchases answered 202.
    pub accepted: u64,
    /// Purchases answered 409.
    pub already_purchased: u64,
    /// Purchases answered 410.
    pub sold_out: u64,
    /// Purchases answered anything else, or not at all.
    pub unexpected: u64,
    /// Hostile requests answered outside their documented statuses.
    pub hostile_misanswered: Vec<String>,
    /// Users who got more than one 202.
    pub users_with_two_202: u64,
    /// 409 answers naming another reservation than the user's 202.
    pub mismatched_409: u64,
    /// user number -> reservation id of its 202.
    pub reserved: HashMap<u32, String>,
    /// Latency percentiles p50, p90, p99 and max, in µs.
    pub latency_us: [u32; 4],
    /// When the last 202 was read, in ms since the first request was sent.
    pub last_202_ms: Option<u32>,
}

/// Counts `records` against `plan`.
pub fn tally(plan: &[Step], records: &[Record]) -> Tally {
    let mut t = Tally::default();
    let mut conflicts: Vec<(u32, String)> = Vec::new();
    let mut lat: Vec<u32> = Vec::with_capacity(records.len());
    for r in records {
        *t.by_status.entry(r.status).or_default() += 1;
        lat.push(r.latency_us);
        match plan.get(r.step) {
            Some(Step::Purchase(u)) => {
                t.purchases += 1;
                match (r.status, &r.reservation_id) {
                    (202, Some(rid)) => {
                        t.accepted += 1;
                        t.last_202_ms = t.last_202_ms.max(Some(r.done_ms));
                        if t.reserved.insert(*u, rid.clone()).is_some() {
                            t.users_with_two_202 += 1;
                        }
                    }
                    (409, Some(rid)) => {
                        t.already_purchased += 1;
                        conflicts.push((*u, rid.clone()));
                    }
                    (410, _) => t.sold_out += 1,
                    _ => t.unexpected += 1,
                }
            }
            Some(Step::Hostile(h)) => {
                t.hostile += 1;
                let code_ok = h.code().is_none_or(|c| r.error_code.as_deref() == Some(c));
                if !h.allowed().contains(&r.status) || !code_ok {
                    t.hostile_misanswered.push(format!(
                        "{} answered {} {}",
                        h.name(),
                        r.status,
                        r.error_code.as_deref().unwrap_or("")
                    ));
                }
            }
            None => t.unexpected += 1,
        }
    }
    for (u, rid) in conflicts {
        if t.reserved.get(&u).is_some_and(|mine| *mine != rid) {
            t.mismatched_409 += 1;
        }
    }
    lat.sort_unstable();
    let pick = |q: f64| -> u32 {
        if lat.is_empty() {
            return 0;
        }
        let i = ((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i]
    };
    t.latency_us = [pick(0.50), pick(0.90), pick(0.99), pick(1.0)];
    t
}

/// One invariant and whether it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// A stable name, e.g. `reserved_le_stock`.
    pub name: &'static str,
    /// Whether it held.
    pub ok: bool,
    /// The figures behind the verdict.
    pub detail: String,
}

impl Check {
    /// A verdict named `name`.
    pub fn new(name: &'static str, ok: bool, detail: String) -> Check {
        Check { name, ok, detail }
    }
}

fn check(name: &'static str, ok: bool, detail: String) -> Check {
    Check::new(name, ok, detail)
}

/// What the checks compare against.
pub struct Facts<'a> {
    /// `sales.total_stock`.
    pub total_stock: u64,
    /// Units reserved before this run.
    pub reserved_before: u64,
    /// User ids are `PREFIX-n`.
    pub user_prefix: &'a str,
    /// Whether the workers drained the queue before the timeout.
    pub drained: bool,
    /// Redis figures (gateway mode).
    pub redis: Option<&'a RedisState>,
    /// MySQL figures.
    pub mysql: Option<&'a MysqlState>,
}

/// Every invariant, in report order.
pub fn checks(t: &Tally, f: &Facts<'_>) -> Vec<Check> {
    let reserved = f.reserved_before + t.accepted;
    let mut out = vec![
        check(
            "purchases_answered",
            t.unexpected == 0,
            format!(
                "{} purchases: {} x 202, {} x 409, {} x 410, {} other or no answer",
                t.purchases, t.accepted, t.already_purchased, t.sold_out, t.unexpected
            ),
        ),
        check(
            "hostile_refused",
            t.hostile_misanswered.is_empty(),
            if t.hostile_misanswered.is_empty() {
                format!(
                    "{} hostile requests, each with its documented 4xx",
                    t.hostile
                )
            } else {
                t.hostile_misanswered.join("; ")
            },
        ),
        check(
            "one_reservation_per_user",
            t.users_with_two_202 == 0 && t.mismatched_409 == 0,
            format!(
                "{} users with two 202, {} 409 naming another reservation",
                t.users_with_two_202, t.mismatched_409
            ),
        ),
        check(
            "reserved_le_stock",
            reserved <= f.total_stock,
            format!("{reserved} reserved, stock {}", f.total_stock),
        ),
        check(
            "no_undersell",
            t.sold_out == 0 || reserved == f.total_stock,
            format!(
                "{} x 410 with {reserved} of {} units reserved",
                t.sold_out, f.total_stock
            ),
        ),
    ];
    if let Some(r) = f.redis {
        redis_checks(t, f, r, reserved, &mut out);
    }
    if let Some(m) = f.mysql {
        mysql_checks(t, f, m, reserved, &mut out);
    }
    out
}

/// The checks of Redis's figures `r` (gateway mode), given the units
/// `reserved` before and during the run, pushed to `out`.
fn redis_checks(t: &Tally, f: &Facts<'_>, r: &RedisState, reserved: u64, out: &mut Vec<Check>) {
    let buyers = r.buyers.len() as u64;
    out.push(check(
        "redis_stock",
        r.stock >= 0 && r.stock as u64 + buyers == f.total_stock,
        format!(
            "stock {} + {buyers} buyers = total {}",
            r.stock, f.total_stock
        ),
    ));
    let missing = t
        .reserved
        .iter()
        .filter(|(u, rid)| r.buyers.get(&format!("{}-{u}", f.user_prefix)) != Some(*rid))
        .count();
    out.push(check(
        "redis_flow_records",
        r.flow_records == buyers && buyers == reserved && missing == 0,
        format!(
            "{} flow records, {buyers} buyers, {reserved} reserved, {missing} 202s not in Redis",
            r.flow_records
        ),
    ));
    out.push(check(
        "queues_drained",
        f.drained && r.queued == 0 && r.processing == 0 && r.dead_letters == 0,
        format!(
            "queue {}, processing {}, dead letters {}",
            r.queued, r.processing, r.dead_letters
        ),
    ));
}

/// The checks of MySQL's figures `m`, given the units `reserved` before
/// and during the run, pushed to `out`.
fn mysql_checks(t: &Tally, f: &Facts<'_>, m: &MysqlState, reserved: u64, out: &mut Vec<Check>) {
    let orders = m.orders.len() as u64;
    let expected = f.redis.map_or(reserved, |r| r.flow_records);
    out.push(check(
        "orders_match_reservations",
        orders == expected && orders <= f.total_stock,
        format!(
            "{orders} orders, {expected} reservations, stock {}",
            f.total_stock
        ),
    ));
    let without = t
        .reserved
        .iter()
        .filter(|(u, rid)| m.orders.get(*rid) != Some(&format!("{}-{u}", f.user_prefix)))
        .count();
    out.push(check(
        "every_202_has_its_order",
        without == 0,
        format!(
            "{without} of {} accepted purchases without their order",
            t.accepted
        ),
    ));
    out.push(check(
        "no_user_with_two_orders",
        m.users_with_two_orders == 0,
        format!("{} users with two orders", m.users_with_two_orders),
    ));
    out.push(check(
        "ledger_rows_match_orders",
        m.ledger_order_rows == orders && m.ledger_delta_sum == -(orders as i64),
        format!(
            "{} ledger rows (sum of deltas {}), {orders} orders",
            m.ledger_order_rows, m.ledger_delta_sum
        ),
    ));
    out.push(check(
        "mysql_stock",
        m.available_stock >= 0 && m.available_stock as u64 + orders == f.total_stock,
        format!(
            "available {} + {orders} orders = total {}",
            m.available_stock, f.total_stock
        ),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::plan::Hostile;

    fn rec(step: usize, status: u16, rid: Option<&str>) -> Record {
        Record {
            step,
            status,
            latency_us: 100 * (step as u32 + 1),
            done_ms: step as u32,
            reservation_id: rid.map(str::to_string),
            error_code: None,
        }
    }

    #[test]
    fn tally_counts_and_catches_a_second_202() {
        let plan = [
            Step::Purchase(0),
            Step::Purchase(0),
            Step::Purchase(1),
            Step::Purchase(1),
            Step::Hostile(Hostile::Oversized),
        ];
        let records = [
            rec(0, 202, Some("a")),
            rec(1, 409, Some("a")),
            rec(2, 202, Some("b")),
            rec(3, 202, Some("c")),
            rec(4, 0, None),
        ];
        let t = tally(&plan, &records);
        assert_eq!((t.accepted, t.already_purchased, t.unexpected), (3, 1, 0));
        assert_eq!((t.users_with_two_202, t.mismatched_409), (1, 0));
        assert!(
            t.hostile_misanswered.is_empty(),
            "a cut connection is allowed"
        );
        assert_eq!(t.latency_us, [300, 500, 500, 500]);
        let facts = Facts {
            total_stock: 2,
            reserved_before: 0,
            user_prefix: "u",
            drained: true,
            redis: None,
            mysql: None,
        };
        let failed: Vec<&str> = checks(&t, &facts)
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.name)
            .collect();
        assert_eq!(failed, ["one_reservation_per_user", "reserved_le_stock"]);
    }
}
