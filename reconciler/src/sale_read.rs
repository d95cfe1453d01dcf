//! Owns reading one sale from MySQL for the commands and `run`: its row
//! ([`fetch_sale`]), what its archive needs ([`sale_state`],
//! [`is_archived`]), the units its orders hold ([`held_units`]), its
//! pauses ([`sale_now`]) and why it must not be loaded ([`load_refusal`]).

use crate::error::RunError;
use mysql::prelude::Queryable;
use seckill_common::archive::Tombstone;
use seckill_common::sale::Sale;

/// `id, sku, title, price_cents, total_stock, available_stock, starts ms, ends ms`.
type SaleRow = (u64, String, String, u64, u64, i64, i64, i64);

/// Reads sale `id` from MySQL; `None` when there is none.
pub fn fetch_sale(db: &mut mysql::Conn, id: u64) -> Result<Option<Sale>, RunError> {
    let row: Option<SaleRow> = db.exec_first(
        "SELECT id, sku, title, price_cents, total_stock, available_stock,
                CAST(UNIX_TIMESTAMP(starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS SIGNED)
         FROM sales WHERE id = ?",
        (id,),
    )?;
    Ok(row.map(
        |(id, sku, title, price_cents, total_stock, available_stock, s, e)| Sale {
            id,
            sku,
            title,
            price_cents,
            total_stock,
            available_stock,
            starts_at_ms: s.max(0) as u64,
            ends_at_ms: e.max(0) as u64,
        },
    ))
}

/// Orders of sale `id` that hold a unit (released ones do not).
pub fn held_units(db: &mut mysql::Conn, id: u64) -> Result<u64, RunError> {
    Ok(seckill_common::lifecycle::held_units(db, id)?)
}

/// What MySQL says of a sale for its archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleState {
    /// What the tombstone keeps (`archived_at_ms`: when, if archived, else 0).
    pub tombstone: Tombstone,
    /// Who archived it, if it is.
    pub archived_by: Option<String>,
    /// Orders still `pending_payment`.
    pub pending: u64,
}

/// Sale `id` as MySQL holds it; `None` when there is no such sale.
///
/// Errors: MySQL failures.
pub fn sale_state(db: &mut mysql::Conn, id: u64) -> Result<Option<SaleState>, RunError> {
    type Row = (i64, i64, u64, i64, Option<i64>, Option<String>, i64);
    let row: Option<Row> = db.exec_first(
        "SELECT CAST(UNIX_TIMESTAMP(starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(ends_at) * 1000 AS SIGNED), total_stock, available_stock,
                CAST(UNIX_TIMESTAMP(archived_at) * 1000 AS SIGNED), archived_by,
                (SELECT COUNT(*) FROM orders WHERE sale_id = s.id AND status = 'pending_payment')
         FROM sales s WHERE id = ?",
        (id,),
    )?;
    Ok(row.map(|(s, e, total, left, at, by, pending)| SaleState {
        tombstone: Tombstone {
            starts_at_ms: s.max(0) as u64,
            ends_at_ms: e.max(0) as u64,
            total_stock: total,
            stock_left: left.max(0) as u64,
            archived_at_ms: at.unwrap_or(0).max(0) as u64,
        },
        archived_by: by,
        pending: pending.max(0) as u64,
    }))
}

/// Whether sale `id` is archived (MySQL's `archived_at`).
///
/// Errors: MySQL failures.
pub fn is_archived(db: &mut mysql::Conn, id: u64) -> Result<bool, RunError> {
    let at: Option<Option<String>> = db.exec_first(
        "SELECT CAST(archived_at AS CHAR) FROM sales WHERE id = ?",
        (id,),
    )?;
    Ok(matches!(at, Some(Some(_))))
}

/// What MySQL holds of a sale for the operator's changes to it
/// (`sale pause/resume/end/extend/add-stock`) and for `sale load`.
#[derive(Debug, Clone)]
pub struct SaleNow {
    /// Its window's start (Unix ms).
    pub starts_at_ms: u64,
    /// Its window's end (Unix ms).
    pub ends_at_ms: u64,
    /// Its units.
    pub total_stock: u64,
    /// An operator's pause: the reason.
    pub paused_reason: Option<String>,
    /// An operator's pause: who.
    pub paused_by: Option<String>,
    /// Who archived it, if it is.
    pub archived_by: Option<String>,
    /// The data-loss pause (`sale_redis_state.paused_reason`).
    pub data_loss: Option<String>,
}

/// Sale `id` as [`SaleNow`]; `None` when MySQL holds no such sale.
///
/// Errors: MySQL failures.
pub fn sale_now(db: &mut mysql::Conn, id: u64) -> Result<Option<SaleNow>, RunError> {
    type Row = (
        i64,
        i64,
        u64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let row: Option<Row> = db.exec_first(
        "SELECT CAST(UNIX_TIMESTAMP(s.starts_at) * 1000 AS SIGNED),
                CAST(UNIX_TIMESTAMP(s.ends_at) * 1000 AS SIGNED), s.total_stock,
                s.paused_reason, s.paused_by, s.archived_by, r.paused_reason
         FROM sales s LEFT JOIN sale_redis_state r ON r.sale_id = s.id WHERE s.id = ?",
        (id,),
    )?;
    Ok(row.map(|(s, e, total, pr, pb, ab, dl)| SaleNow {
        starts_at_ms: s.max(0) as u64,
        ends_at_ms: e.max(0) as u64,
        total_stock: total,
        paused_reason: pr,
        paused_by: pb,
        archived_by: ab,
        data_loss: dl,
    }))
}

/// Why `sale load` must not load sale `id`: a paused sale (Redis lost data
/// of it: `sale repair` rebuilds it; an operator's pause: a load would
/// offer its units before the pause is written); `None` when it may.
///
/// Errors: MySQL failures.
pub fn load_refusal(db: &mut mysql::Conn, id: u64) -> Result<Option<String>, RunError> {
    Ok(match sale_now(db, id)? {
        Some(SaleNow {
            data_loss: Some(r), ..
        }) => Some(format!(
            "sale {id} is paused ({r}): `seckill-reconciler run`, then `sale repair {id} \
             --by NAME` rebuilds its Redis state"
        )),
        Some(SaleNow {
            paused_reason: Some(r),
            paused_by,
            ..
        }) => Some(format!(
            "sale {id} is paused by {} ({r}): `sale resume {id} --by NAME` first",
            paused_by.as_deref().unwrap_or("?")
        )),
        _ => None,
    })
}
