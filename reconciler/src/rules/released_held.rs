//! Owns the `released_in_mysql_held_in_redis` rule and its automatic fix:
//! an order MySQL released (expired or cancelled) whose flow record Redis
//! still holds, so its unit is not back on sale there (a crash between the
//! release's two steps that no sweep completed yet). Fixed by doing the
//! Redis step (`seckill_common::lifecycle::redis_step`, idempotent by
//! reservation id), logged, finding `auto_fixed`.

use crate::error::RunError;
use crate::review::findings::{Kind, Observation};
use crate::rules::obs;
use crate::scan::SaleScan;
use seckill_common::lifecycle::redis_step;
use seckill_common::redis_target::Con;
use seckill_common::release::OrderRelease;
use serde_json::json;

/// One observation per released order still held in Redis, each fixed.
///
/// Errors: Redis or MySQL failures of a fix (the ones before stand).
pub fn observe(
    mysql: &mut mysql::Conn,
    redis: &mut Con,
    s: &SaleScan,
) -> Result<Vec<Observation>, RunError> {
    let mut out = Vec::with_capacity(s.released_held.len());
    for o in &s.released_held {
        let status = o.kind.status();
        let fixed = match redis_step(mysql, redis, o, &mut || {})? {
            OrderRelease::Released { stock_after } => {
                log::info!(
                    "sale {}: released order {} ({status}) was still held in Redis: \
                     units put back on sale, stock now {stock_after}",
                    o.sale_id,
                    o.reservation_id
                );
                Some(format!(
                    "did the release's Redis step: stock + the order's units (now {stock_after}), \
                     flow record moved to released, status {status}"
                ))
            }
            // Done meanwhile (a sweep): nothing to report.
            OrderRelease::Already | OrderRelease::NotFound => continue,
        };
        let mut ob = obs(
            Kind::ReleasedInMysqlHeldInRedis,
            s.sale_id,
            o.reservation_id.clone(),
            json!({"mysql_status": status.as_str(), "redis_flow_record": true}),
        );
        ob.reservation_id = Some(o.reservation_id.clone());
        ob.order_id = Some(o.id);
        ob.fixed = fixed;
        out.push(ob);
    }
    Ok(out)
}
