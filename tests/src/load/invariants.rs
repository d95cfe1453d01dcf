//! Owns the flash sale's invariants: the tally of the gateway's answers and
//! the pure checks of answers against Redis and MySQL (never oversell, never
//! silently undersell, each buyer within the sale's limit, every
//! reservation an order, ledger = orders, stocks that add up), counted in
//! units: a reservation of N units takes N from the stock, its order holds
//! N and its ledger row says −N.
//!
//! Without `--quantities` (one unit per purchase, no `Idempotency-Key`) the
//! checks are the thirteen of [`crate::load_report::INVARIANTS`]; with it,
//! those of [`crate::load_report::UNIT_INVARIANTS`]: the same arithmetic in
//! units, each buyer at most L units, and every same-key retry answered
//! with its purchase's reservation id.

use super::drive::Record;
use super::plan::{self, Step};
use super::state::{Limits, MysqlState, RedisState};
use seckill_common::allowance::Held;
use std::collections::{BTreeMap, HashMap};

/// A reservation a 202 answered: whose, which purchase, how many units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// User number.
    pub user: u32,
    /// The purchase's number (`plan::Buy::key`).
    pub key: u8,
    /// Units.
    pub quantity: u32,
}

/// The answers, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Answers by HTTP status (0 = no answer).
    pub by_status: BTreeMap<u16, u64>,
    /// Purchases sent (first and second clicks, retries).
    pub purchases: u64,
    /// Hostile requests sent.
    pub hostile: u64,
    /// Purchases answered 202.
    pub accepted: u64,
    /// Purchases answered 409 naming a reservation (`already_purchased`).
    pub already_purchased: u64,
    /// Purchases answered 409 `limit_reached`.
    pub limit_reached: u64,
    /// Purchases answered 410 (sold out, or fewer units left than asked).
    pub sold_out: u64,
    /// Of those, the 410 `not_enough_stock` answers.
    pub not_enough_stock: u64,
    /// 410 `not_enough_stock` answers whose `units_left` is 0 or would
    /// have covered the purchase.
    pub not_enough_misanswered: u64,
    /// Purchases answered anything else, or not at all.
    pub unexpected: u64,
    /// Of those, the purchases answered 503 (what `--outage` allows).
    pub unavailable: u64,
    /// Users answered 503 at least once and never given a reservation id
    /// (no 202, no 409 naming one), in order: with `--outage`, each must
    /// hold nothing.
    pub unavailable_users: Vec<u32>,
    /// Hostile requests answered outside their documented statuses.
    pub hostile_misanswered: Vec<String>,
    /// Users who got more than one 202.
    pub users_with_two_202: u64,
    /// Purchases (user and key) answered 202 with two reservation ids.
    pub keys_with_two_ids: u64,
    /// 409 answers naming another reservation than the user's 202.
    pub mismatched_409: u64,
    /// Same-key retries sent.
    pub retries: u64,
    /// Same-key retries of a purchase answered 202 that were not answered
    /// with that reservation id (202 or, one unit per buyer, 409 naming it).
    pub retries_mismatched: u64,
    /// Of those, the ones answered 410: with one unit per buyer, what a
    /// repeated click hears once the sale is sold out (the sold-out answer
    /// comes before the buyer's mark); with L > 1, a wrong answer.
    pub retries_410: u64,
    /// user number -> reservation id of its 202 (the first, with L > 1).
    pub reserved: HashMap<u32, String>,
    /// Every reservation id answered 202, once each.
    pub reservations: HashMap<String, Reserved>,
    /// Units of [`Tally::reservations`].
    pub units_accepted: u64,
    /// Latency percentiles p50, p90, p99 and max, in µs.
    pub latency_us: [u32; 4],
    /// When the last 202 was read, in ms since the first request was sent.
    pub last_202_ms: Option<u32>,
}

impl Tally {
    /// Units per user over their distinct reservations.
    pub fn user_units(&self) -> HashMap<u32, u64> {
        let mut out: HashMap<u32, u64> = HashMap::new();
        for r in self.reservations.values() {
            *out.entry(r.user).or_default() += u64::from(r.quantity);
        }
        out
    }
}

/// What the tally keeps to check once every answer is counted.
#[derive(Default)]
struct Seen {
    /// (user, reservation id) of each 409 naming a reservation.
    conflicts: Vec<(u32, String)>,
    /// (user, key) -> the first reservation id a 202 gave it.
    ids: HashMap<(u32, u8), String>,
    /// (user, key) -> the reservation id a 202 gave the purchase itself
    /// (not a retry).
    origin: HashMap<(u32, u8), String>,
    /// Each retry's (user, key), status and reservation id.
    retries: Vec<((u32, u8), u16, Option<String>)>,
    /// Users answered 503 at least once.
    unavailable: std::collections::BTreeSet<u32>,
}

/// Counts one purchase's answer `r` into `t`, keeping in `seen` what is
/// checked once every 202 is known.
fn tally_purchase(t: &mut Tally, b: plan::Buy, r: &Record, seen: &mut Seen) {
    t.purchases += 1;
    let code = r.error_code.as_deref();
    if b.retry {
        t.retries += 1;
        let rid = r.reservation_id.clone();
        seen.retries.push(((b.user, b.key), r.status, rid));
    }
    match (r.status, &r.reservation_id) {
        (202, Some(rid)) => {
            t.accepted += 1;
            t.last_202_ms = t.last_202_ms.max(Some(r.done_ms));
            if !b.retry {
                if t.reserved.insert(b.user, rid.clone()).is_some() {
                    t.users_with_two_202 += 1;
                }
                seen.origin.insert((b.user, b.key), rid.clone());
            }
            match seen.ids.get(&(b.user, b.key)) {
                Some(prev) => t.keys_with_two_ids += u64::from(prev != rid),
                None => {
                    seen.ids.insert((b.user, b.key), rid.clone());
                }
            }
            let q = u32::from(b.quantity.max(1));
            if !t.reservations.contains_key(rid) {
                t.units_accepted += u64::from(q);
                let res = Reserved {
                    user: b.user,
                    key: b.key,
                    quantity: q,
                };
                t.reservations.insert(rid.clone(), res);
            }
        }
        (409, Some(rid)) => {
            t.already_purchased += 1;
            seen.conflicts.push((b.user, rid.clone()));
        }
        (409, None) if code == Some("limit_reached") => t.limit_reached += 1,
        (410, _) => {
            t.sold_out += 1;
            if code == Some("not_enough_stock") {
                t.not_enough_stock += 1;
                let left = r.units_left.unwrap_or(0);
                t.not_enough_misanswered += u64::from(left == 0 || left >= u64::from(b.quantity));
            }
        }
        (503, _) => {
            t.unexpected += 1;
            t.unavailable += 1;
            seen.unavailable.insert(b.user);
        }
        _ => t.unexpected += 1,
    }
}

/// Counts `records` against `plan`.
pub fn tally(plan: &[Step], records: &[Record]) -> Tally {
    let mut t = Tally::default();
    let mut seen = Seen::default();
    let mut lat: Vec<u32> = Vec::with_capacity(records.len());
    for r in records {
        *t.by_status.entry(r.status).or_default() += 1;
        lat.push(r.latency_us);
        match plan.get(r.step) {
            Some(Step::Purchase(b)) => tally_purchase(&mut t, *b, r, &mut seen),
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
    let named: std::collections::HashSet<u32> = seen.conflicts.iter().map(|c| c.0).collect();
    t.unavailable_users = seen
        .unavailable
        .iter()
        .copied()
        .filter(|u| !t.reserved.contains_key(u) && !named.contains(u))
        .collect();
    for (u, rid) in seen.conflicts {
        if t.reserved.get(&u).is_some_and(|mine| *mine != rid) {
            t.mismatched_409 += 1;
        }
    }
    for (key, status, rid) in seen.retries {
        if let Some(first) = seen.origin.get(&key) {
            let alike = matches!(status, 202 | 409) && rid.as_ref() == Some(first);
            t.retries_mismatched += u64::from(!alike);
            t.retries_410 += u64::from(status == 410);
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
    /// The sale.
    pub sale_id: u64,
    /// `sales.total_stock`.
    pub total_stock: u64,
    /// Units reserved before this run.
    pub reserved_before: u64,
    /// User ids are `PREFIX-n`.
    pub user_prefix: &'a str,
    /// The sale's L and Q.
    pub limits: Limits,
    /// The crowd bought a quantity mix with keys (`--quantities`): the
    /// checks of [`crate::load_report::UNIT_INVARIANTS`].
    pub units: bool,
    /// `--outage`: 503 answers allowed, and
    /// [`crate::load_report::OUTAGE`] checked.
    pub outage: bool,
    /// Whether the workers drained the queue before the timeout.
    pub drained: bool,
    /// Redis figures (gateway mode).
    pub redis: Option<&'a RedisState>,
    /// MySQL figures.
    pub mysql: Option<&'a MysqlState>,
}

impl Facts<'_> {
    fn user(&self, n: u32) -> String {
        format!("{}-{n}", self.user_prefix)
    }
}

/// Every invariant, in report order.
pub fn checks(t: &Tally, f: &Facts<'_>) -> Vec<Check> {
    let reserved = f.reserved_before + t.units_accepted;
    let allowed = if f.outage { t.unavailable } else { 0 };
    let mut answered = answers_detail(t, f.units);
    if f.outage {
        answered.push_str(&format!(" ({allowed} x 503 of them allowed: --outage)"));
    }
    let mut out = vec![check(
        "purchases_answered",
        t.unexpected == allowed,
        answered,
    )];
    if f.outage {
        out.push(outage_check(t, f));
    }
    out.extend([check(
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
    )]);
    if f.units {
        out.extend(key_checks(t, f));
    } else {
        out.push(check(
            "one_reservation_per_user",
            t.users_with_two_202 == 0 && t.mismatched_409 == 0,
            format!(
                "{} users with two 202, {} 409 naming another reservation",
                t.users_with_two_202, t.mismatched_409
            ),
        ));
    }
    out.push(check(
        "reserved_le_stock",
        reserved <= f.total_stock,
        format!("{reserved} reserved, stock {}", f.total_stock),
    ));
    out.push(check(
        "no_undersell",
        (t.sold_out == t.not_enough_stock || reserved == f.total_stock)
            && t.not_enough_misanswered == 0,
        match f.units {
            false => format!(
                "{} x 410 with {reserved} of {} units reserved",
                t.sold_out, f.total_stock
            ),
            true => format!(
                "{} x 410 sold out with {reserved} of {} units reserved; {} x 410 \
                 not_enough_stock, {} of them naming units that were 0 or enough",
                t.sold_out - t.not_enough_stock,
                f.total_stock,
                t.not_enough_stock,
                t.not_enough_misanswered
            ),
        },
    ));
    if f.units {
        out.push(limit_check(t, f));
    }
    if let Some(r) = f.redis {
        redis_checks(t, f, r, reserved, &mut out);
    }
    if let Some(m) = f.mysql {
        mysql_checks(t, f, m, reserved, &mut out);
    }
    out
}

/// `unavailable_reserved_nothing` (`--outage`): no user answered 503 and
/// never given a reservation id holds a buyer mark in Redis or an order in
/// MySQL (a 503 says nothing was reserved). Without the Redis and MySQL
/// figures (`--no-verify`) only the count is reported.
fn outage_check(t: &Tally, f: &Facts<'_>) -> Check {
    let ordered: std::collections::HashSet<&str> = f
        .mysql
        .map(|m| m.orders.values().map(|o| o.user_id.as_str()).collect())
        .unwrap_or_default();
    let holding: Vec<String> = t
        .unavailable_users
        .iter()
        .map(|&u| f.user(u))
        .filter(|u| {
            f.redis.is_some_and(|r| r.buyers.contains_key(u)) || ordered.contains(u.as_str())
        })
        .collect();
    let shown: Vec<&str> = holding.iter().take(5).map(String::as_str).collect();
    check(
        crate::load_report::OUTAGE,
        holding.is_empty(),
        format!(
            "{} x 503 to {} users never given a reservation, {} of them holding one \
             (a buyer mark or an order){}",
            t.unavailable,
            t.unavailable_users.len(),
            holding.len(),
            if shown.is_empty() {
                String::new()
            } else {
                format!(": {}", shown.join(", "))
            }
        ),
    )
}

/// `purchases_answered`'s detail: the answers by kind.
fn answers_detail(t: &Tally, units: bool) -> String {
    match units {
        false => format!(
            "{} purchases: {} x 202, {} x 409, {} x 410, {} other or no answer",
            t.purchases, t.accepted, t.already_purchased, t.sold_out, t.unexpected
        ),
        true => format!(
            "{} purchases ({} same-key retries): {} x 202 ({} reservations, {} units), \
             {} x 409 naming a reservation, {} x 409 limit_reached, {} x 410 ({} \
             not_enough_stock), {} other or no answer",
            t.purchases,
            t.retries,
            t.accepted,
            t.reservations.len(),
            t.units_accepted,
            t.already_purchased,
            t.limit_reached,
            t.sold_out,
            t.not_enough_stock,
            t.unexpected
        ),
    }
}

/// With keys: one reservation id per purchase (the one the key draws,
/// `ids::keyed_reservation_id`, when L > 1; with L = 1 the buyer's mark is
/// the key: one per user), and every same-key retry answered with it.
fn key_checks(t: &Tally, f: &Facts<'_>) -> Vec<Check> {
    let one = if f.limits.per_buyer > 1 {
        let wrong = t
            .reservations
            .iter()
            .filter(|(rid, r)| {
                let key = plan::idempotency_key(r.key);
                seckill_common::ids::keyed_reservation_id(f.sale_id, &f.user(r.user), &key) != **rid
            })
            .count();
        check(
            "one_reservation_per_key",
            t.keys_with_two_ids == 0 && wrong == 0,
            format!(
                "{} purchases answered 202 with two ids, {wrong} ids not the key's",
                t.keys_with_two_ids
            ),
        )
    } else {
        check(
            "one_reservation_per_key",
            t.users_with_two_202 == 0 && t.mismatched_409 == 0,
            format!(
                "one unit per buyer: {} users with two 202, {} 409 naming another reservation",
                t.users_with_two_202, t.mismatched_409
            ),
        )
    };
    let retries = if f.limits.per_buyer > 1 {
        check(
            "same_key_retries",
            t.retries_mismatched == 0,
            format!(
                "{} same-key retries, {} of a 202 not answered with its reservation id",
                t.retries, t.retries_mismatched
            ),
        )
    } else {
        let wrong = t.retries_mismatched - t.retries_410;
        check(
            "same_key_retries",
            wrong == 0,
            format!(
                "one unit per buyer: {} same-key retries, {wrong} of a 202 answered neither \
                 409 naming it nor 410 ({} x 410)",
                t.retries, t.retries_410
            ),
        )
    };
    vec![one, retries]
}

/// `buyers_within_limit`: no buyer got more than L units answered 202,
/// and (L > 1) no buyer's list in Redis holds more than L units.
fn limit_check(t: &Tally, f: &Facts<'_>) -> Check {
    let l = u64::from(f.limits.per_buyer);
    let units = t.user_units();
    let over_answers = units.values().filter(|&&u| u > l).count();
    let most = units.values().copied().max().unwrap_or(0);
    let (over_redis, bad_lists) = match (f.redis, f.limits.per_buyer > 1) {
        (Some(r), true) => r
            .buyers
            .values()
            .fold((0, 0), |(o, b), v| match Held::parse(v) {
                Ok(h) => (o + u64::from(h.units() > l), b),
                Err(_) => (o, b + 1),
            }),
        _ => (0, 0),
    };
    check(
        "buyers_within_limit",
        over_answers == 0 && over_redis == 0 && bad_lists == 0,
        format!(
            "limit {l} units per buyer: {over_answers} buyers answered more (most {most}), \
             {over_redis} Redis lists over it, {bad_lists} unreadable"
        ),
    )
}

/// Whether reservation `rid` of user `u` is in Redis's buyers hash: the
/// buyer's value (L = 1), or an entry of their list (L > 1).
fn in_buyers(r: &RedisState, f: &Facts<'_>, u: u32, rid: &str) -> bool {
    let Some(v) = r.buyers.get(&f.user(u)) else {
        return false;
    };
    if f.limits.per_buyer <= 1 {
        return v == rid;
    }
    Held::parse(v).is_ok_and(|h| h.0.iter().any(|e| e.reservation_id == rid))
}

/// The checks of Redis's figures `r` (gateway mode), given the units
/// `reserved` before and during the run, pushed to `out`.
fn redis_checks(t: &Tally, f: &Facts<'_>, r: &RedisState, reserved: u64, out: &mut Vec<Check>) {
    let buyers = r.buyers.len() as u64;
    let missing = t
        .reservations
        .iter()
        .filter(|(rid, res)| !in_buyers(r, f, res.user, rid))
        .count();
    if !f.units {
        out.push(check(
            "redis_stock",
            r.stock >= 0 && r.stock as u64 + buyers == f.total_stock,
            format!(
                "stock {} + {buyers} buyers = total {}",
                r.stock, f.total_stock
            ),
        ));
        out.push(check(
            "redis_flow_records",
            r.flow_records == buyers && buyers == reserved && missing == 0,
            format!(
                "{} flow records, {buyers} buyers, {reserved} reserved, {missing} 202s not in Redis",
                r.flow_records
            ),
        ));
    } else {
        let held = r.held_reservations(f.limits);
        out.push(check(
            "redis_stock",
            r.stock >= 0 && r.stock as u64 + r.flow_units == f.total_stock,
            format!(
                "stock {} + {} units in flow records = total {} ({})",
                r.stock,
                r.flow_units,
                f.total_stock,
                buckets(r.buckets)
            ),
        ));
        out.push(check(
            "redis_flow_records",
            r.flow_records == held && r.flow_units == reserved && missing == 0,
            format!(
                "{} flow records of {} units, {held} held by {buyers} buyers, {reserved} units \
                 reserved, {missing} 202s not in Redis",
                r.flow_records, r.flow_units
            ),
        ));
    }
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
    let units = m.ordered_units();
    let expected = f.redis.map_or(reserved, |r| r.flow_records);
    let expected_units = f.redis.map_or(reserved, |r| r.flow_units);
    out.push(check(
        "orders_match_reservations",
        orders == expected && units == expected_units && units <= f.total_stock,
        match f.units {
            false => format!(
                "{orders} orders, {expected} reservations, stock {}",
                f.total_stock
            ),
            true => format!(
                "{orders} orders of {units} units, {expected} reservations of \
                 {expected_units} units, stock {}",
                f.total_stock
            ),
        },
    ));
    let without = t
        .reservations
        .iter()
        .filter(|(rid, r)| {
            m.orders
                .get(*rid)
                .is_none_or(|o| o.user_id != f.user(r.user) || o.quantity != r.quantity)
        })
        .count();
    out.push(check(
        "every_202_has_its_order",
        without == 0,
        format!(
            "{without} of {} accepted purchases without their order",
            t.reservations.len()
        ),
    ));
    if f.units {
        out.push(check(
            "no_user_over_limit",
            m.users_over_limit == 0,
            format!(
                "{} users whose orders hold more than {} units",
                m.users_over_limit, f.limits.per_buyer
            ),
        ));
    } else {
        out.push(check(
            "no_user_with_two_orders",
            m.users_with_two_orders == 0,
            format!("{} users with two orders", m.users_with_two_orders),
        ));
    }
    out.push(check(
        "ledger_rows_match_orders",
        m.ledger_order_rows == orders && m.ledger_delta_sum == -(units as i64),
        match f.units {
            false => format!(
                "{} ledger rows (sum of deltas {}), {orders} orders",
                m.ledger_order_rows, m.ledger_delta_sum
            ),
            true => format!(
                "{} ledger rows (sum of deltas {}), {orders} orders of {units} units",
                m.ledger_order_rows, m.ledger_delta_sum
            ),
        },
    ));
    out.push(check(
        "mysql_stock",
        m.available_stock >= 0 && m.available_stock as u64 + units == f.total_stock,
        match f.units {
            false => format!(
                "available {} + {units} orders = total {}",
                m.available_stock, f.total_stock
            ),
            true => format!(
                "available {} + {units} units ordered = total {}",
                m.available_stock, f.total_stock
            ),
        },
    ));
}

/// `1 bucket`, `4 buckets`.
fn buckets(n: impl Into<u64>) -> String {
    match n.into() {
        1 => "1 bucket".to_string(),
        n => format!("{n} buckets"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::plan::{Buy, Hostile};
    use crate::load::state::OrderRow;

    fn rec(step: usize, status: u16, rid: Option<&str>) -> Record {
        Record {
            step,
            status,
            latency_us: 100 * (step as u32 + 1),
            done_ms: step as u32,
            reservation_id: rid.map(str::to_string),
            error_code: None,
            units_left: None,
        }
    }

    fn refused(step: usize, status: u16, code: &str, left: Option<u64>) -> Record {
        Record {
            error_code: Some(code.to_string()),
            units_left: left,
            ..rec(step, status, None)
        }
    }

    fn failed(checks: &[Check]) -> Vec<&'static str> {
        checks.iter().filter(|c| !c.ok).map(|c| c.name).collect()
    }

    fn facts<'a>(total: u64, limits: Limits, units: bool) -> Facts<'a> {
        Facts {
            sale_id: 7,
            total_stock: total,
            reserved_before: 0,
            user_prefix: "u",
            limits,
            units,
            outage: false,
            drained: true,
            redis: None,
            mysql: None,
        }
    }

    /// `--outage`: 503 answers pass `purchases_answered` and are checked
    /// against the books; a buyer answered only 503 who holds a buyer mark
    /// fails `unavailable_reserved_nothing`.
    #[test]
    fn an_outage_allows_503_answers_that_reserved_nothing() {
        let second = |u| Buy {
            key: 1,
            ..Buy::first(u)
        };
        let plan = [
            Step::Purchase(Buy::first(0)),
            Step::Purchase(second(0)),
            Step::Purchase(Buy::first(1)),
            Step::Purchase(Buy::first(2)),
        ];
        let records = [
            refused(0, 503, "unavailable", None),
            rec(1, 202, Some("a")),
            refused(2, 503, "sale_paused", None),
            rec(3, 202, Some("b")),
        ];
        let t = tally(&plan, &records);
        assert_eq!((t.accepted, t.unavailable, t.unexpected), (2, 2, 2));
        assert_eq!(t.unavailable_users, vec![1]);
        let plain = checks(&t, &facts(10, Limits::default(), false));
        assert_eq!(failed(&plain), vec!["purchases_answered"]);
        let mut f = facts(10, Limits::default(), false);
        f.outage = true;
        let held = checks(&t, &f);
        assert!(failed(&held).is_empty(), "{held:?}");
        assert_eq!(held[1].name, crate::load_report::OUTAGE);
        let redis = RedisState {
            buyers: [("u-1".to_string(), "x".to_string())].into(),
            ..RedisState::default()
        };
        f.redis = Some(&redis);
        let c = outage_check(&t, &f);
        assert!(!c.ok, "{c:?}");
        assert!(c.detail.contains("1 of them holding one"), "{}", c.detail);
    }

    #[test]
    fn tally_counts_and_catches_a_second_202() {
        let second = |u| Buy {
            key: 1,
            ..Buy::first(u)
        };
        let plan = [
            Step::Purchase(Buy::first(0)),
            Step::Purchase(second(0)),
            Step::Purchase(Buy::first(1)),
            Step::Purchase(second(1)),
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
        assert_eq!(t.units_accepted, 3);
        assert!(
            t.hostile_misanswered.is_empty(),
            "a cut connection is allowed"
        );
        assert_eq!(t.latency_us, [300, 500, 500, 500]);
        let checks = checks(&t, &facts(2, Limits::default(), false));
        assert_eq!(
            failed(&checks),
            ["one_reservation_per_user", "reserved_le_stock"]
        );
    }

    /// A sale of 5 units, L = 4, Q = 3: user 0 buys 3 (and retries: the
    /// same id), then 2 more with a new key (409 limit_reached); user 1
    /// buys 2 and retries; user 2 asks 3 of the 2 left... every answer as
    /// the contract has it, then the units in Redis and MySQL.
    fn unit_run(retry_of_1: Record) -> (Tally, RedisState, MysqlState) {
        let l4 = |user, key, quantity, retry| {
            Step::Purchase(Buy {
                user,
                key,
                quantity,
                retry,
            })
        };
        let plan = [
            l4(0, 0, 3, false),
            l4(0, 0, 3, true),
            l4(0, 1, 2, false),
            l4(1, 0, 2, false),
            l4(1, 0, 2, true),
            l4(2, 0, 3, false),
            l4(3, 0, 1, false),
        ];
        let id = |u: &str| seckill_common::ids::keyed_reservation_id(7, u, "k0");
        let (a, b) = (id("u-0"), id("u-1"));
        let records = [
            rec(0, 202, Some(&a)),
            rec(1, 202, Some(&a)),
            refused(2, 409, "limit_reached", None),
            rec(3, 202, Some(&b)),
            Record {
                step: 4,
                ..retry_of_1
            },
            refused(5, 410, "not_enough_stock", Some(2)),
            refused(6, 410, "sold_out", None),
        ];
        let t = tally(&plan, &records);
        let mut r = RedisState {
            flow_records: 2,
            flow_units: 5,
            buckets: 1,
            ..RedisState::default()
        };
        r.buyers.insert("u-0".into(), format!("{a}:3"));
        r.buyers.insert("u-1".into(), format!("{b}:2"));
        let mut m = MysqlState {
            ledger_order_rows: 2,
            ledger_delta_sum: -5,
            ..MysqlState::default()
        };
        for (rid, user, quantity) in [(a, "u-0", 3), (b, "u-1", 2)] {
            let user_id = user.to_string();
            m.orders.insert(rid, OrderRow { user_id, quantity });
        }
        (t, r, m)
    }

    #[test]
    fn units_add_up_and_every_retry_is_answered_with_its_id() {
        let l4 = Limits::from_meta(Some("4"), Some("3"));
        let (t, r, m) = unit_run(rec(
            0,
            202,
            Some(&seckill_common::ids::keyed_reservation_id(7, "u-1", "k0")),
        ));
        assert_eq!(
            (t.accepted, t.units_accepted, t.reservations.len()),
            (4, 5, 2)
        );
        assert_eq!((t.limit_reached, t.sold_out, t.not_enough_stock), (1, 2, 1));
        assert_eq!((t.retries, t.retries_mismatched, t.unexpected), (2, 0, 0));
        let mut f = facts(5, l4, true);
        f.redis = Some(&r);
        f.mysql = Some(&m);
        let all = checks(&t, &f);
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        assert_eq!(names, crate::load_report::UNIT_INVARIANTS);
        assert_eq!(failed(&all), Vec::<&str>::new(), "{all:#?}");
        let stock = all.iter().find(|c| c.name == "redis_stock");
        assert_eq!(
            stock.map(|c| c.detail.as_str()),
            Some("stock 0 + 5 units in flow records = total 5 (1 bucket)")
        );
    }

    #[test]
    fn a_retry_answered_otherwise_a_list_over_the_limit_and_lost_units_fail() {
        let l4 = Limits::from_meta(Some("4"), Some("3"));
        let (t, mut r, mut m) = unit_run(refused(0, 410, "sold_out", None));
        assert_eq!(t.retries_mismatched, 1);
        // A buyer holding 5 units in Redis; MySQL one unit short.
        let a = seckill_common::ids::keyed_reservation_id(7, "u-0", "k0");
        let c = seckill_common::ids::keyed_reservation_id(7, "u-0", "k9");
        r.buyers.insert("u-0".into(), format!("{a}:3,{c}:2"));
        m.ledger_delta_sum = -4;
        m.available_stock = 1;
        let mut f = facts(5, l4, true);
        f.redis = Some(&r);
        f.mysql = Some(&m);
        assert_eq!(
            failed(&checks(&t, &f)),
            [
                "same_key_retries",
                "buyers_within_limit",
                "redis_flow_records",
                "ledger_rows_match_orders",
                "mysql_stock"
            ]
        );
    }

    #[test]
    fn a_not_enough_stock_answer_must_name_too_few_units() {
        let plan = [Step::Purchase(Buy {
            quantity: 2,
            ..Buy::first(0)
        })];
        for (left, wrong) in [(Some(1), 0), (Some(2), 1), (Some(0), 1), (None, 1)] {
            let t = tally(&plan, &[refused(0, 410, "not_enough_stock", left)]);
            assert_eq!(t.not_enough_misanswered, wrong, "{left:?}");
        }
    }
}
