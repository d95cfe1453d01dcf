//! Owns the `stock_mismatch` rule, on a sale's totals: `mysql_books` (total
//! − ledger deductions ≠ available), `redis_stock` (Redis stock + Redis
//! reservations ≠ total), `oversell` (orders > total, critical). Each is one
//! open finding whose subject names the broken equation.

use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::rules::order_without_ledger::books_json;
use crate::scan::SaleScan;
use serde_json::json;

/// The `stock_mismatch` observations of a sale's totals (after this run's
/// compensations, which `s.books` includes).
pub fn observe(s: &SaleScan) -> Vec<Observation> {
    let (sale_id, books, totals) = (s.sale_id, &s.books, &s.totals);
    let mut out = Vec::new();
    if !books.balanced() {
        out.push(obs(
            Kind::StockMismatch,
            sale_id,
            "mysql_books".into(),
            json!({"rule": "total_stock - ledger deductions = available_stock",
                   "books": books_json(books),
                   "difference": books.total_stock - books.ledger_deductions
                       - books.available_stock}),
        ));
    }
    let redis_sum = totals.stock.map(|s| s + totals.reservations);
    // `unsettled`: the buckets' totals never agreed with themselves during
    // the read (transfers moving units): judged by the next run.
    if !totals.unsettled && redis_sum != Some(books.total_stock) {
        out.push(obs(
            Kind::StockMismatch,
            sale_id,
            "redis_stock".into(),
            json!({"rule": "Redis stock + Redis reservations = total_stock",
                   "redis_stock": totals.stock, "redis_reservations": totals.reservations,
                   "total_stock": books.total_stock}),
        ));
    }
    if books.orders > books.total_stock {
        let mut o = obs(
            Kind::StockMismatch,
            sale_id,
            "oversell".into(),
            json!({"rule": "orders <= total_stock", "orders": books.orders,
                   "total_stock": books.total_stock}),
        );
        o.critical = true;
        out.push(o);
    }
    out
}
