//! Owns the worker's status write after its MySQL commit: a reservation's
//! status becomes `confirmed` (a sale without a payment window) or
//! `pending_payment` with its deadline in the sale's `pay_by` hash, but
//! only over `queued` or no status at all. A later lifecycle status
//! (`expired`, `cancelled`, `paid`), an `on_hold` or a `failed` stands: a reservation
//! applied past its deadline may be expired by the sweep before its batch
//! is settled, and a redelivered batch may be settled after its order was
//! paid.

use crate::keys::{PurchaseStatus, SaleKeys};

/// `KEYS`: the sale's status hash, its `pay_by` hash. `ARGV`: triples
/// reservation id, status word, deadline in Unix ms (`''` for none).
/// Replies how many statuses it wrote; an error reply, with nothing
/// written, when a key holds the wrong type (`lua.rs`).
pub const SET_CREATED_LUA: &str = concat!(
    crate::lua_expect_types!(),
    r#"
local bad = expect_types({KEYS[1], 'hash', KEYS[2], 'hash'})
if bad then return bad end
local n = 0
for i = 1, #ARGV, 3 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur or cur == 'queued' then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    if ARGV[i + 2] ~= '' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2]) end
    n = n + 1
  end
end
return n
"#
);

/// An order the worker committed: its reservation id and its deadline
/// (Unix ms; `None` for a sale without a payment window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Created<'a> {
    /// The reservation id.
    pub reservation_id: &'a str,
    /// `pay_by`, Unix ms, as MySQL has it.
    pub pay_by_ms: Option<u64>,
}

impl Created<'_> {
    /// The status this write gives it.
    pub fn status(&self) -> PurchaseStatus {
        match self.pay_by_ms {
            None => PurchaseStatus::Confirmed,
            Some(_) => PurchaseStatus::PendingPayment,
        }
    }
}

/// Adds the guarded status write of `created` (sale `sale_id`) to `p`
/// (one `EVAL`, so it can sit inside the settle's `MULTI`); nothing when
/// `created` is empty. Its reply is ignored.
pub fn add_created(p: &mut redis::Pipeline, sale_id: u64, created: &[Created<'_>]) {
    add_created_in(p, SaleKeys::new(sale_id), created)
}

/// [`add_created`] into bucket `k` of a sale split over buckets (where the
/// reservations' flow records and statuses are).
pub fn add_created_in(p: &mut redis::Pipeline, k: SaleKeys, created: &[Created<'_>]) {
    if created.is_empty() {
        return;
    }
    let cmd = p
        .cmd("EVAL")
        .arg(SET_CREATED_LUA)
        .arg(2)
        .arg(k.status())
        .arg(k.pay_by());
    for c in created {
        cmd.arg(c.reservation_id)
            .arg(c.status().as_str())
            .arg(c.pay_by_ms.map(|ms| ms.to_string()).unwrap_or_default());
    }
    cmd.ignore();
}
