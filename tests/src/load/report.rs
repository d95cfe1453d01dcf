//! Owns the load simulator's report: the figures of one run and the
//! invariants, as human text or as JSON (`--json`).

use super::invariants::{Check, Tally};
use super::state::{Limits, MysqlState, RedisState};
use serde_json::{json, Value};
use std::fmt::Write;

/// `counts` by HTTP status as a JSON object keyed by the status (`0`, no
/// answer, as `no_answer`): the shape of the report's `answers` and
/// `timeline.answers`.
pub fn by_status<T: Clone + Into<Value>>(
    counts: &std::collections::BTreeMap<u16, T>,
) -> serde_json::Map<String, Value> {
    counts
        .iter()
        .map(|(s, n)| {
            let key = match s {
                0 => "no_answer".to_string(),
                s => s.to_string(),
            };
            (key, n.clone().into())
        })
        .collect()
}

/// The health-check burst after the run (`--healthz-burst`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    /// `GET /healthz` sent.
    pub requests: u64,
    /// Of those, answered 200.
    pub ok: u64,
    /// From the first sent to the last answer, s.
    pub elapsed_s: f64,
}

impl Burst {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed_s.max(1e-6)
    }
}

/// Everything one run found out.
pub struct Report<'a> {
    /// The sale.
    pub sale_id: u64,
    /// Distinct users.
    pub users: u32,
    /// Second clicks planned (a second purchase, with `--quantities` a
    /// new key).
    pub second_clicks: u32,
    /// Same-key retries planned (`--retry-same-key`).
    pub retries: u32,
    /// The sale's limits, with `--quantities` (the report then counts
    /// units).
    pub limits: Option<crate::load::state::Limits>,
    /// Redis reads of the checks that failed and were read again.
    pub redis_read_failures: u64,
    /// Connections.
    pub connections: u32,
    /// The plan's seed.
    pub seed: u64,
    /// `sales.total_stock` (0 when not verified).
    pub total_stock: u64,
    /// The answers, counted.
    pub tally: &'a Tally,
    /// Load phase length in seconds.
    pub elapsed_s: f64,
    /// First few transport errors.
    pub errors: &'a [String],
    /// TCP connections opened.
    pub connects: u64,
    /// The simulator's own CPU while sending, in µs (`drive::Outcome`).
    pub cpu_us: u64,
    /// Redis figures.
    pub redis: Option<&'a RedisState>,
    /// MySQL figures.
    pub mysql: Option<&'a MysqlState>,
    /// From the last answer until the queue was drained, in ms.
    pub drain_ms: Option<u64>,
    /// From the sale's opening to the first request sent, in ms.
    pub open_to_first_request_ms: Option<i64>,
    /// From the sale's opening to the last 202 answer read, in ms.
    pub open_to_last_202_ms: Option<i64>,
    /// From the sale's opening to the last order's `created_at`, in ms.
    pub open_to_last_order_ms: Option<i64>,
    /// The invariants (empty with `--no-verify`).
    pub checks: &'a [Check],
    /// The order-lifecycle phase (`--pay-share`), when it ran.
    pub lifecycle: Option<&'a crate::load::lifecycle::LifecycleOutcome>,
    /// The figures over time (`timeline::to_json`), when verified.
    pub timeline: Option<Value>,
    /// The health-check burst, when asked for.
    pub healthz: Option<Burst>,
}

impl Report<'_> {
    /// Whether every invariant held.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    fn requests(&self) -> u64 {
        self.tally.by_status.values().sum()
    }

    fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed_s.max(1e-6)
    }

    /// The simulator's CPU per request while sending, in µs.
    fn cpu_per_request_us(&self) -> f64 {
        self.cpu_us as f64 / self.requests().max(1) as f64
    }

    /// The report as JSON (one object; figures in ms and counts).
    pub fn to_json(&self) -> Value {
        let t = self.tally;
        let ms = |us: u32| us as f64 / 1000.0;
        let statuses = by_status(&t.by_status);
        let mut v = json!({
            "ok": self.ok(),
            "sale_id": self.sale_id,
            "total_stock": self.total_stock,
            "users": self.users,
            "second_clicks": self.second_clicks,
            "hostile": t.hostile,
            "connections": self.connections,
            "seed": self.seed,
            "requests": self.requests(),
            "elapsed_s": self.elapsed_s,
            "requests_per_s": self.rate(),
            "load_cpu_us_per_request": self.cpu_per_request_us(),
            "load_cpu_ms": self.cpu_us as f64 / 1000.0,
            "latency_ms": {"p50": ms(t.latency_us[0]), "p90": ms(t.latency_us[1]),
                           "p99": ms(t.latency_us[2]), "max": ms(t.latency_us[3])},
            "answers": statuses,
            "accepted": t.accepted,
            "already_purchased": t.already_purchased,
            "sold_out": t.sold_out,
            "unexpected": t.unexpected,
            "connects": self.connects,
            "errors": self.errors,
            "redis": self.redis.map(|r| json!({
                "stock": r.stock, "buyers": r.buyers.len(), "flow_records": r.flow_records,
                "flow_units": r.flow_units, "buckets": r.buckets,
                "queued": r.queued, "processing": r.processing, "dead_letters": r.dead_letters,
            })),
            "mysql": self.mysql.map(|m| json!({
                "orders": m.orders.len(), "ordered_units": m.ordered_units(),
                "ledger_order_rows": m.ledger_order_rows,
                "available_stock": m.available_stock,
                "users_with_two_orders": m.users_with_two_orders,
                "users_over_limit": m.users_over_limit,
            })),
            "units": self.limits.map(|l| json!({
                "max_per_buyer": l.per_buyer, "max_per_purchase": l.per_purchase,
                "reservations": t.reservations.len(), "units_accepted": t.units_accepted,
                "retries": t.retries, "retries_mismatched": t.retries_mismatched,
                "retries_410": t.retries_410,
                "limit_reached": t.limit_reached, "not_enough_stock": t.not_enough_stock,
            })),
            "redis_read_failures": self.redis_read_failures,
            // Names of their own: scripts read the run's figures by the
            // first match of a name in the compact report.
            "healthz": self.healthz.map(|h| json!({
                "sent": h.requests, "answered_200": h.ok, "seconds": h.elapsed_s,
                "rate_per_s": h.rate(),
                "crowd_share": self.rate() / h.rate().max(1e-6),
            })),
            "drain_ms": self.drain_ms,
            "open_to_first_request_ms": self.open_to_first_request_ms,
            "open_to_last_202_ms": self.open_to_last_202_ms,
            "open_to_last_order_ms": self.open_to_last_order_ms,
            "lifecycle": self.lifecycle.map(|l| json!({
                "winners": l.winners, "paid_first": l.paid_first, "resold": l.resold,
                "payments_refused": l.payments_refused, "paid": l.end.paid,
                "expired": l.end.expired, "pending": l.end.pending,
                "available_stock": l.end.available, "elapsed_s": l.elapsed_s,
            })),
            "invariants": self.checks.iter().map(|c| json!({
                "name": c.name, "ok": c.ok, "detail": c.detail,
            })).collect::<Vec<_>>(),
            "timeline": self.timeline,
        });
        // Apart: the one `json!` above is at the macro's recursion limit.
        v["unavailable"] = json!(t.unavailable);
        v
    }

    /// The text's `crowd` line: who bought, and how they repeated.
    fn crowd_line(&self) -> String {
        let again = if self.limits.is_some() {
            format!(
                "{} buying again with a new key, {} retrying with the same key",
                self.second_clicks, self.retries
            )
        } else {
            format!("{} clicking twice", self.second_clicks)
        };
        format!(
            "  crowd       {} users ({again}), {} hostile requests, {} connections, seed {}",
            self.users, self.tally.hostile, self.connections, self.seed
        )
    }

    /// The report as text for a person.
    pub fn to_text(&self) -> String {
        let t = self.tally;
        let ms = |us: u32| us as f64 / 1000.0;
        let mut s = String::new();
        let _ = writeln!(s, "seckill-load report: sale {}", self.sale_id);
        let _ = writeln!(s, "{}", self.crowd_line());
        let _ = writeln!(
            s,
            "  requests    {} in {:.2} s = {:.0} req/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.requests(),
            self.elapsed_s,
            self.rate(),
            ms(t.latency_us[0]),
            ms(t.latency_us[1]),
            ms(t.latency_us[2]),
            ms(t.latency_us[3])
        );
        if let Some(h) = self.healthz {
            let _ = writeln!(
                s,
                "  healthz     {} GET /healthz ({} answered 200) in {:.2} s = {:.0} req/s; \
                 the crowd's {:.0} req/s is {:.0} % of it",
                h.requests,
                h.ok,
                h.elapsed_s,
                h.rate(),
                self.rate(),
                100.0 * self.rate() / h.rate().max(1e-6)
            );
        }
        let answers: Vec<String> = t
            .by_status
            .iter()
            .map(|(st, n)| {
                if *st == 0 {
                    format!("no answer: {n}")
                } else {
                    format!("{st}: {n}")
                }
            })
            .collect();
        let _ = writeln!(s, "  answers     {}", answers.join("  "));
        if let Some(l) = self.limits {
            let _ = writeln!(
                s,
                "  units       {} reservations of {} units (limit {} per buyer, {} per purchase); \
                 {} same-key retries ({} planned), {} answered otherwise; 409 limit_reached {}, \
                 410 not_enough_stock {}",
                t.reservations.len(),
                t.units_accepted,
                l.per_buyer,
                l.per_purchase,
                t.retries,
                self.retries,
                t.retries_mismatched,
                t.limit_reached,
                t.not_enough_stock
            );
        }
        let _ = writeln!(
            s,
            "  load CPU    {:.0} ms while sending = {:.1} us per request (the simulator's own)",
            self.cpu_us as f64 / 1000.0,
            self.cpu_per_request_us()
        );
        self.write_state(&mut s);
        let mut timing = Vec::new();
        if let Some(d) = self.drain_ms {
            timing.push(format!("queue drained {d} ms after the last answer"));
        }
        if let Some(d) = self.open_to_last_202_ms {
            timing.push(format!("sale open -> last 202 {d} ms"));
        }
        if let Some(d) = self.open_to_last_order_ms {
            timing.push(format!("sale open -> last order committed {d} ms"));
        }
        if !timing.is_empty() {
            let _ = writeln!(s, "  timing      {}", timing.join("; "));
        }
        for e in self.errors {
            let _ = writeln!(s, "  error       {e}");
        }
        if self.redis_read_failures > 0 {
            let _ = writeln!(
                s,
                "  warning     {} Redis reads failed and were read again",
                self.redis_read_failures
            );
        }
        self.write_verdict(&mut s);
        s
    }

    /// The text's lines of what Redis, MySQL and the order lifecycle hold
    /// after the run (those that were read).
    fn write_state(&self, s: &mut String) {
        if let Some(r) = self.redis {
            let _ = writeln!(
                s,
                "  redis       stock {}, {} buyers, {} flow records, queue {}, processing {}, dead letters {}",
                r.stock,
                r.buyers.len(),
                r.flow_records,
                r.queued,
                r.processing,
                r.dead_letters
            );
        }
        if let Some(m) = self.mysql {
            let _ = writeln!(
                s,
                "  mysql       {} orders, {} ledger rows, available_stock {} of {}, {}",
                m.orders.len(),
                m.ledger_order_rows,
                m.available_stock,
                self.total_stock,
                buyers_checked(m, self.limits)
            );
        }
        if let Some(l) = self.lifecycle {
            let _ = writeln!(
                s,
                "  lifecycle   {} of {} winners paid, {} orders expired and went back on sale, {} units resold and paid: {} orders paid, {} pending, available_stock {} ({:.1} s)",
                l.paid_first,
                l.winners,
                l.end.expired,
                l.resold,
                l.end.paid,
                l.end.pending,
                l.end.available,
                l.elapsed_s
            );
        }
    }

    /// The text's invariants, each marked ok or FAIL, and the verdict.
    fn write_verdict(&self, s: &mut String) {
        if !self.checks.is_empty() {
            let _ = writeln!(s, "  invariants");
            for c in self.checks {
                let mark = if c.ok { "ok  " } else { "FAIL" };
                let _ = writeln!(s, "    {mark} {}: {}", c.name, c.detail);
            }
        }
        let verdict = if self.checks.is_empty() {
            "not verified (--no-verify)"
        } else if self.ok() {
            "every invariant holds"
        } else {
            "INVARIANT VIOLATED"
        };
        let _ = writeln!(s, "  verdict     {verdict}");
    }
}

/// What the MySQL line says of the buyers, as the run's invariant checks
/// it: with the sale's `limits` (units) the buyers whose orders hold more
/// than its `max_per_buyer` units (several orders each are allowed), else
/// the buyers holding two orders of a one-per-buyer sale.
fn buyers_checked(m: &MysqlState, limits: Option<Limits>) -> String {
    match limits {
        Some(l) => format!(
            "{} users over the limit of {} units",
            m.users_over_limit, l.per_buyer
        ),
        None => format!("{} users with two orders", m.users_with_two_orders),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mysql_line_checks_the_limit_of_a_sale_of_several_units_per_buyer() {
        let m = MysqlState {
            users_with_two_orders: 3,
            users_over_limit: 0,
            ..MysqlState::default()
        };
        let l4 = Limits::from_meta(Some("4"), Some("3"));
        assert_eq!(
            buyers_checked(&m, Some(l4)),
            "0 users over the limit of 4 units"
        );
        assert_eq!(buyers_checked(&m, None), "3 users with two orders");
    }
}
