//! Owns the `redis_data_loss` rule: each run compares every sale's Redis
//! marks with MySQL's (`seckill_common::data_loss::watch_sale`, the same
//! check the workers make every 200 ms, so a loss is caught even with no
//! worker running; only for sales whose window has not been closed for a
//! minute, as the workers), and a paused sale is one critical finding (subject
//! `sale`) with the evidence, until `sale repair` resumes it. The
//! per-record rules are not applied to a paused sale: its Redis state is
//! known to be wrong, and the repair rebuilds it; the sale's other findings
//! are left as they are.

use crate::error::RunError;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use mysql::prelude::Queryable;
use seckill_common::data_loss::{self, SaleState};
use seckill_common::redis_target::Con;
use serde_json::json;

/// The subject of the one finding per paused sale.
pub const SUBJECT: &str = "sale";

/// The finding for sale `sale_id` when it is (or has just been) paused;
/// `None` when Redis is consistent with MySQL.
///
/// Errors: Redis or MySQL failures.
pub fn observe(
    redis: &mut Con,
    mysql: &mut mysql::Conn,
    sale_id: u64,
) -> Result<Option<Observation>, RunError> {
    // A sale closed for a minute cannot sell again, and its Redis keys may
    // be cleaned up on purpose: only a pause already decided is reported.
    let open: Option<i64> = mysql.exec_first(
        "SELECT ends_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE FROM sales WHERE id = ?",
        (sale_id,),
    )?;
    if open != Some(1) && data_loss::mysql_state(mysql, sale_id)?.paused.is_none() {
        return Ok(None);
    }
    let state = data_loss::watch_sale(redis, mysql, sale_id).map_err(|e| match e {
        data_loss::WatchError::Redis(e) => RunError::Redis(e),
        data_loss::WatchError::Mysql(e) => RunError::Mysql(e),
        other => RunError::Refused(other.to_string()),
    })?;
    let marks = data_loss::mysql_state(mysql, sale_id)?;
    let evidence = match state {
        SaleState::Consistent { .. } | SaleState::Absent => return Ok(None),
        SaleState::LossDetected {
            redis_seq,
            seq_high,
        } => json!({
            "rule": "Redis never falls behind the marks MySQL has seen",
            "detected_by": "reconciler",
            "redis_seq": redis_seq,
            "seq_high": seq_high,
            "checkpoint_high": marks.checkpoint_high,
            "fix": format!("seckill-reconciler sale repair {sale_id} --by NAME"),
        }),
        SaleState::Paused { reason } => json!({
            "rule": "Redis never falls behind the marks MySQL has seen",
            "paused": reason.as_str(),
            "seq_high": marks.seq_high,
            "checkpoint_high": marks.checkpoint_high,
            "fix": format!("seckill-reconciler sale repair {sale_id} --by NAME"),
        }),
    };
    let mut found = obs(Kind::RedisDataLoss, sale_id, SUBJECT.to_string(), evidence);
    found.critical = true;
    Ok(Some(found))
}
