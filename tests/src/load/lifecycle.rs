//! Owns the simulator's order-lifecycle phase (`--pay-share F`, the demo's
//! payments and expiries), after the crowd and its checks: a simulated payment service
//! pays a share of the winners through the gateway's signed
//! `POST /v1/payments`; the rest let the sale's payment window pass, so
//! their units go back on sale; buyers of the crowd who were told sold out
//! buy those units again (one click each, in plan order) and pay for them.
//! Then its own invariants: every payment applied once, every unpaid order
//! expired, every returned unit resold, and MySQL's books balance.

use crate::load::drive::Record;
use crate::load::drive::Tokens;
use crate::load::http::{self, Connection};
use crate::load::invariants::Check;
use crate::load::plan::Step;
use crate::load::state::{LifecycleCounts, StateError, Store};
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
}

/// What the phase did and found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LifecycleOutcome {
    /// Winners of the crowd (202).
    pub winners: u64,
    /// Winners who paid.
    pub paid_first: u64,
    /// Buyers told sold out who bought a returned unit.
    pub resold: u64,
    /// Answers to the payments other than 202.
    pub payments_refused: u64,
    /// MySQL at the end.
    pub end: LifecycleCounts,
    /// How long the phase took, s.
    pub elapsed_s: f64,
}

/// Errors: Redis or MySQL cannot be read.
pub fn run(
    spec: &LifecycleSpec<'_>,
    steps: &[Step],
    records: &[Record],
    store: &mut Store,
) -> Result<LifecycleOutcome, StateError> {
    let started = Instant::now();
    let mut winners: Vec<String> = Vec::new();
    let mut told_sold_out: Vec<u32> = Vec::new();
    for r in records {
        let Some(Step::Purchase(u)) = steps.get(r.step).copied() else {
            continue;
        };
        match (r.status, &r.reservation_id) {
            (202, Some(rid)) => winners.push(rid.clone()),
            (410, _) if !told_sold_out.contains(&u) => told_sold_out.push(u),
            _ => {}
        }
    }
    let payers = ((winners.len() as f64) * spec.pay_share).round() as usize;
    let mut con = Connection::new(spec.addr, spec.timeout);
    let mut refused = 0u64;
    for rid in &winners[..payers] {
        refused += u64::from(pay(spec, &mut con, rid) != Some(202));
    }
    let paid_first = payers as u64;
    let expiring = (winners.len() - payers) as u64;
    eprintln!(
        "load: {paid_first} of {} winners paid; {expiring} let the {} ms window pass",
        winners.len(),
        spec.window_ms
    );
    // Every unpaid order expired, its unit back in Redis.
    wait_for(spec.wait + Duration::from_millis(spec.window_ms), || {
        let c = store.lifecycle_counts()?;
        Ok(c.pending == 0 && c.paid == paid_first && store.redis_stock()? >= expiring as i64)
    })?;
    // The gateway's sold-out memory sees returned stock within 1 s.
    std::thread::sleep(Duration::from_millis(1100));
    let mut resold = Vec::new();
    for &u in &told_sold_out {
        if resold.len() as u64 == expiring {
            break;
        }
        let body = format!(r#"{{"user_id":"{}-{u}"}}"#, spec.user_prefix);
        let token = spec
            .tokens
            .and_then(|t| t.users.get(u as usize))
            .map(String::as_str);
        let req = http::post_json(
            spec.host,
            &format!("/v1/sales/{}/purchases", spec.sale_id),
            body.as_bytes(),
            token,
        );
        if let Ok(r) = con.send(&req) {
            if let (202, Some(rid)) = (r.status, http::json_str(&r.body, "reservation_id")) {
                resold.push(rid);
            }
        }
    }
    eprintln!("load: {} returned units sold again", resold.len());
    // The resold orders exist before they are paid.
    let want_orders = paid_first + resold.len() as u64;
    wait_for(spec.wait, || {
        Ok(store.lifecycle_counts()?.pending == resold.len() as u64)
    })?;
    for rid in &resold {
        refused += u64::from(pay(spec, &mut con, rid) != Some(202));
    }
    wait_for(spec.wait, || {
        Ok(store.lifecycle_counts()?.paid == want_orders)
    })?;
    Ok(LifecycleOutcome {
        winners: winners.len() as u64,
        paid_first,
        resold: resold.len() as u64,
        payments_refused: refused,
        end: store.lifecycle_counts()?,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// Pays `rid` (`payment_id` `pay-RID`, the sale's price), signed as the
/// payment service signs; the answer's status.
fn pay(spec: &LifecycleSpec<'_>, con: &mut Connection, rid: &str) -> Option<u16> {
    let body = format!(
        r#"{{"reservation_id":"{rid}","payment_id":"pay-{rid}","amount_cents":{}}}"#,
        spec.price_cents
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

/// Polls `done` every 50 ms until it holds or `within` passes.
fn wait_for(
    within: Duration,
    mut done: impl FnMut() -> Result<bool, StateError>,
) -> Result<bool, StateError> {
    let start = Instant::now();
    loop {
        if done()? {
            return Ok(true);
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
            e.expired == expiring && e.pending == 0 && e.released == expiring,
            format!(
                "{} expired ({} released in the ledger), {} pending; {expiring} unpaid",
                e.expired, e.released, e.pending
            ),
        ),
        Check::new(
            "returned_units_resold",
            o.resold == expiring,
            format!("{} of {expiring} returned units sold again", o.resold),
        ),
        Check::new(
            "lifecycle_books",
            e.available >= 0 && e.available as u64 + e.paid + e.pending == spec.total_stock,
            format!(
                "available {} + paid {} + pending {} = total {}",
                e.available, e.paid, e.pending, spec.total_stock
            ),
        ),
    ]
}
