//! Owns the simulator's order-lifecycle phase (`--pay-share F`, the demo's
//! payments and expiries), after the crowd and its checks: a simulated payment service
//! pays a share of the winners through the gateway's signed
//! `POST /v1/payments` (the price times the reservation's units); the rest
//! let the sale's payment window pass, so their units go back on sale;
//! buyers of the crowd who were told sold out buy those units again (one
//! unit per click, in plan order) and pay for them. Then its own
//! invariants: every payment applied once, every unpaid order expired with
//! its units, every returned unit resold, and MySQL's books balance in
//! units.

use crate::load::drive::Record;
use crate::load::drive::Tokens;
use crate::load::http::{self, Connection};
use crate::load::invariants::Check;
use crate::load::plan::{self, Step};
use crate::load::state::{LifecycleCounts, StateError, Store};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// What the phase needs.
pub struct LifecycleSpec<'a> {
    /// The gateway.
    pub addr: std::net::SocketAddr,
    /// `Host` header value.
    pub host: &'a str,
    /// The sale.
    pub sale_id: u64,
    /// User ids are `PREFIX-n`.
    pub user_prefix: &'a str,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The crowd's tokens (purchases of the resale carry them).
    pub tokens: Option<&'a Tokens>,
    /// Share of the winners who pay, 0 to 1.
    pub pay_share: f64,
    /// `SECKILL_PAYMENT_SECRET`, shared with the gateway.
    pub secret: &'a [u8],
    /// The sale's price, cents (what each payment pays).
    pub price_cents: u64,
    /// The sale's payment window, ms.
    pub window_ms: u64,
    /// The sale's total stock.
    pub total_stock: u64,
    /// How long to wait for the workers at each step.
    pub wait: Duration,
    /// Purchases carry an `Idempotency-Key` (`--quantities`).
    pub keys: bool,
}

/// What the phase did and found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LifecycleOutcome {
    /// Winners of the crowd (202).
    pub winners: u64,
    /// Winners who paid.
    pub paid_first: u64,
    /// Units of the winners who let the window pass.
    pub expiring_units: u64,
    /// Buyers told sold out who bought a returned unit (one each).
    pub resold: u64,
    /// Answers to the payments other than 202.
    pub payments_refused: u64,
    /// MySQL at the end.
    pub end: LifecycleCounts,
    /// How long the phase took, s.
    pub elapsed_s: f64,
}

/// The crowd's winners (each reservation once, with its units, in the
/// order of their answers) and the users told sold out (each once).
fn winners_and_refused(steps: &[Step], records: &[Record]) -> (Vec<(String, u32)>, Vec<u32>) {
    let mut winners: Vec<(String, u32)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut told_sold_out: Vec<u32> = Vec::new();
    let mut refused: HashSet<u32> = HashSet::new();
    for r in records {
        let Some(Step::Purchase(b)) = steps.get(r.step).copied() else {
            continue;
        };
        match (r.status, &r.reservation_id) {
            (202, Some(rid)) if seen.insert(rid) => {
                winners.push((rid.clone(), u32::from(b.quantity.max(1))))
            }
            (410, _) if refused.insert(b.user) => told_sold_out.push(b.user),
            _ => {}
        }
    }
    (winners, told_sold_out)
}

/// Errors: MySQL cannot be read (a Redis read that fails is told on
/// stderr and read again).
pub fn run(
    spec: &LifecycleSpec<'_>,
    steps: &[Step],
    records: &[Record],
    store: &mut Store,
) -> Result<LifecycleOutcome, StateError> {
    let started = Instant::now();
    let (winners, told_sold_out) = winners_and_refused(steps, records);
    let payers = ((winners.len() as f64) * spec.pay_share).round() as usize;
    let mut con = Connection::new(spec.addr, spec.timeout);
    let mut refused = 0u64;
    for (rid, q) in &winners[..payers] {
        refused += u64::from(pay(spec, &mut con, rid, *q) != Some(202));
    }
    let paid_first = payers as u64;
    let expiring = (winners.len() - payers) as u64;
    let expiring_units: u64 = winners[payers..].iter().map(|w| u64::from(w.1)).sum();
    eprintln!(
        "load: {paid_first} of {} winners paid; {expiring} ({expiring_units} units) let the {} ms window pass",
        winners.len(),
        spec.window_ms
    );
    // Every unpaid order expired, its units back in Redis.
    wait_for(spec.wait + Duration::from_millis(spec.window_ms), || {
        let c = store.lifecycle_counts()?;
        Ok(c.pending == 0 && c.paid == paid_first && store.redis_stock()? >= expiring_units as i64)
    })?;
    // The gateway's sold-out memory sees returned stock within 1 s.
    std::thread::sleep(Duration::from_millis(1100));
    let resold = resell(spec, &mut con, &told_sold_out, expiring_units);
    eprintln!("load: {} returned units sold again", resold.len());
    // The resold orders exist before they are paid.
    let want_orders = paid_first + resold.len() as u64;
    wait_for(spec.wait, || {
        Ok(store.lifecycle_counts()?.pending == resold.len() as u64)
    })?;
    for rid in &resold {
        refused += u64::from(pay(spec, &mut con, rid, 1) != Some(202));
    }
    wait_for(spec.wait, || {
        Ok(store.lifecycle_counts()?.paid == want_orders)
    })?;
    Ok(LifecycleOutcome {
        winners: winners.len() as u64,
        paid_first,
        expiring_units,
        resold: resold.len() as u64,
        payments_refused: refused,
        end: store.lifecycle_counts()?,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Users of `told_sold_out` buy one returned unit each, in turn, until
/// `units` are sold; the reservation ids answered 202.
fn resell(
    spec: &LifecycleSpec<'_>,
    con: &mut Connection,
    told_sold_out: &[u32],
    units: u64,
) -> Vec<String> {
    let mut resold = Vec::new();
    // A key of their own: not one of the crowd's purchases.
    let key = spec.keys.then(|| plan::idempotency_key(u8::MAX));
    for &u in told_sold_out {
        if resold.len() as u64 == units {
            break;
        }
        let body = format!(r#"{{"user_id":"{}-{u}"}}"#, spec.user_prefix);
        let token = spec
            .tokens
            .and_then(|t| t.users.get(u as usize))
            .map(String::as_str);
        let req = http::post_json_keyed(
            spec.host,
            &format!("/v1/sales/{}/purchases", spec.sale_id),
            body.as_bytes(),
            token,
            key.as_deref(),
        );
        if let Ok(r) = con.send(&req) {
            if let (202, Some(rid)) = (r.status, http::json_str(&r.body, "reservation_id")) {
                resold.push(rid);
            }
        }
    }
    resold
}

/// Pays `rid` of `units` units (`payment_id` `pay-RID`, the sale's price
/// times the units), signed as the payment service signs; the answer's
/// status.
fn pay(spec: &LifecycleSpec<'_>, con: &mut Connection, rid: &str, units: u32) -> Option<u16> {
    let body = format!(
        r#"{{"reservation_id":"{rid}","payment_id":"pay-{rid}","amount_cents":{}}}"#,
        spec.price_cents * u64::from(units)
    );
    let t = seckill_common::now_ms() / 1000;
    let v1 = seckill_common::payment::sign(spec.secret, t, body.as_bytes());
    let req = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         {}: t={t},v1={v1}\r\nContent-Length: {}\r\n\r\n{body}",
        spec.host,
        seckill_common::payment::SIGNATURE_HEADER,
        body.len()
    );
    con.send(req.as_bytes()).ok().map(|r| r.status)
}

/// Polls `done` every 50 ms until it holds or `within` passes; a Redis
/// read that fails is told on stderr and counts as "not yet".
fn wait_for(
    within: Duration,
    mut done: impl FnMut() -> Result<bool, StateError>,
) -> Result<bool, StateError> {
    let start = Instant::now();
    loop {
        match done() {
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(StateError::Redis(e)) => {
                eprintln!(
                    "load: warning: reading the stock from Redis failed ({e}); reading again"
                );
            }
            Err(e) => return Err(e),
        }
        if start.elapsed() >= within {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The phase's invariants, in report order (`load_report::LIFECYCLE`).
pub fn checks(spec: &LifecycleSpec<'_>, o: &LifecycleOutcome) -> Vec<Check> {
    let e = &o.end;
    let expiring = o.winners - o.paid_first;
    let units = spec.keys;
    vec![
        Check::new(
            "payments_applied_once",
            o.payments_refused == 0 && e.paid == o.paid_first + o.resold && e.payments == e.paid,
            format!(
                "{} paid orders, {} payment rows, {} payments refused; {} + {} paid",
                e.paid, e.payments, o.payments_refused, o.paid_first, o.resold
            ),
        ),
        Check::new(
            "unpaid_orders_expired",
            e.expired == expiring
                && e.pending == 0
                && e.released == expiring
                && e.released_units == o.expiring_units,
            match units {
                false => format!(
                    "{} expired ({} released in the ledger), {} pending; {expiring} unpaid",
                    e.expired, e.released, e.pending
                ),
                true => format!(
                    "{} expired ({} released in the ledger: {} units), {} pending; \
                     {expiring} unpaid of {} units",
                    e.expired, e.released, e.released_units, e.pending, o.expiring_units
                ),
            },
        ),
        Check::new(
            "returned_units_resold",
            o.resold == o.expiring_units,
            format!(
                "{} of {} returned units sold again",
                o.resold, o.expiring_units
            ),
        ),
        Check::new(
            "lifecycle_books",
            e.available >= 0
                && e.available as u64 + e.paid_units + e.pending_units == spec.total_stock,
            match units {
                false => format!(
                    "available {} + paid {} + pending {} = total {}",
                    e.available, e.paid_units, e.pending_units, spec.total_stock
                ),
                true => format!(
                    "available {} + paid {} units + pending {} units = total {}",
                    e.available, e.paid_units, e.pending_units, spec.total_stock
                ),
            },
        ),
    ]
}
