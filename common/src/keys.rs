//! Owns the Redis key schema: the one place that spells every key name.
//!
//! Every key that one purchase touches carries the hash tag `{sale:ID}`, so
//! all of them live in one Redis Cluster slot and the reservation stays one
//! atomic script there too. Per-sale keys:
//!
//! | key | type | content |
//! |---|---|---|
//! | `seckill:{sale:ID}:meta` | hash | `total_stock`, `starts_at_ms`, `ends_at_ms` (Unix ms, UTC); `releases` (units released back, see `reservation::sequence`), `checkpoint`, `check_stamp` and `check_stamp_local` (the workers' watch: its count, and its last passing check's stamp, replicated and on this server only, `data_loss.rs`), `paused` (why purchases are refused: Redis lost data), `operator_paused` (why purchases are refused: an operator's `sale pause`), `repaired_by` (the last `sale repair`'s action mark) |
//! | `seckill:{sale:ID}:stock` | string | units left to reserve, never below 0 |
//! | `seckill:{sale:ID}:buyers` | hash | user id -> reservation id (one purchase per user) |
//! | `seckill:{sale:ID}:flow` | hash | reservation id -> order message JSON: the flow record |
//! | `seckill:{sale:ID}:status` | hash | reservation id -> `queued` / `confirmed` / `pending_payment` / `paid` / `on_hold` (dead-lettered, an operator decides) / `failed` (released) / `expired` / `cancelled` (the worker writes `confirmed` or `pending_payment` only over `queued` or nothing, so a later lifecycle status stands) |
//! | `seckill:{sale:ID}:pay_by` | hash | reservation id -> payment deadline, Unix ms (written with `pending_payment`, for the status route) |
//! | `seckill:{sale:ID}:released` | hash | reservation id -> the flow record of an order whose unit went back on sale (expired or cancelled): the evidence, and what makes the release's Redis step happen once |
//! | `seckill:{sale:ID}:queue` | list | order messages; `LPUSH` in, `BLMOVE RIGHT LEFT` out |
//! | `seckill:{sale:ID}:processing:WORKER` | list | messages a worker has taken and not yet finished |
//! | `seckill:{sale:ID}:dlq` | list | dead-letter entries (JSON: message, reason, attempts) |
//! | `seckill:{sale:ID}:attempts` | hash | reservation id -> failed applications so far |
//! | `seckill:{sale:ID}:dlq:archive` | list | settled dead-letter entries (JSON: the entry and the operator action that settled it) |
//! | `seckill:{sale:ID}:stock_added` | hash | action key -> units an operator's `sale add-stock` put into this bucket (`sale_admin.rs`): written in the same script as the units, it makes an interrupted add-stock add them once |
//! | `seckill:{sale:ID}:reordered` | hash | reservation id -> mark of the last operator reorder (`ACTION_ID@TIME`), the evidence an interrupted `resolve --reorder` took effect |
//!
//! | `seckill:{sale:ID}:transfers:out` | hash | transfer id -> JSON `{"to", "units", "at_ms"}`: units this bucket gave to another (`buckets.rs`); kept for the reconciler |
//! | `seckill:{sale:ID}:transfers:open` | hash | the same records, until the destination has taken them in (a half-done transfer while present) |
//! | `seckill:{sale:ID}:transfers:in` | hash | transfer id -> JSON `{"from", "units", "at_ms"}`: units this bucket took from another |
//!
//! Buckets (a sale created with `--shards K`, `buckets.rs`): bucket 0 is the
//! sale's own tag `{sale:ID}` above (so a one-bucket sale, the default, is
//! exactly this table), bucket `B` ≥ 1 has the same keys under its own tag
//! `{sale:ID:bB}` (`seckill:{sale:7:b2}:stock`), so that on a cluster the
//! buckets land on different masters. Bucket 0's meta also holds `buckets`
//! (K, absent for 1); every bucket's meta holds the window and its own
//! `total_stock` (its share, moved with its transfers).
//!
//! Global keys: `seckill:sales` (set of sale ids loaded into Redis, for
//! discovery), `seckill:workers` (set of worker ids that ever consumed) and
//! `seckill:worker:WORKER:heartbeat` (string with a TTL).

/// A reservation's status in the sale's `status` hash, as the purchase
/// status route shows it. The Lua scripts write the same words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurchaseStatus {
    /// Reserved in Redis, its order message on its way (`queued`).
    Queued,
    /// The worker has committed its order to MySQL, final at creation (a
    /// sale without a payment window: `confirmed`).
    Confirmed,
    /// The worker has committed its order to MySQL, waiting for its
    /// payment until the deadline in the sale's `pay_by` hash
    /// (`pending_payment`).
    PendingPayment,
    /// The payment service paid it in time (`paid`).
    Paid,
    /// It will never be an order: released by an operator's rollback or a
    /// repair (`failed`). Final.
    Failed,
    /// The worker gave up on it (a dead letter naming the reservation),
    /// and its unit is still held: an operator decides, and it becomes
    /// `queued` then `confirmed` (`resolve --reorder`) or `failed`
    /// (`--rollback`) (`on_hold`). Not final.
    OnHold,
    /// Its order's payment deadline passed; the unit is back on sale (`expired`).
    Expired,
    /// Its buyer cancelled the unpaid order; the unit is back on sale (`cancelled`).
    Cancelled,
}

impl PurchaseStatus {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            PurchaseStatus::Queued => "queued",
            PurchaseStatus::Confirmed => "confirmed",
            PurchaseStatus::PendingPayment => "pending_payment",
            PurchaseStatus::Paid => "paid",
            PurchaseStatus::Failed => "failed",
            PurchaseStatus::OnHold => "on_hold",
            PurchaseStatus::Expired => "expired",
            PurchaseStatus::Cancelled => "cancelled",
        }
    }
}

/// The set of every sale id loaded into Redis (`SSCAN` it; never `KEYS`).
pub const SALES: &str = "seckill:sales";

/// The set of worker ids that have registered (to find stale processing lists).
pub const WORKERS: &str = "seckill:workers";

/// The reconciler's run lock (`SET NX PX`), so two runs never overlap.
pub const RECONCILE_LOCK: &str = "seckill:reconcile:lock";

/// The gauge lease (`SET NX PX`, holding a worker id): the one worker that
/// exports the gauges of the shared lists (queues, processing lists, dead
/// letters), so a sum over workers counts each list once.
pub const GAUGE_LEASE: &str = "seckill:gauges:reporter";

/// A worker's heartbeat key; it expires when the worker stops refreshing it.
pub fn worker_heartbeat(worker_id: &str) -> String {
    format!("seckill:worker:{worker_id}:heartbeat")
}

/// The keys of one bucket of one sale (bucket 0, the sale's own tag, for
/// a sale of one bucket). Cheap to build; holds only the two numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaleKeys {
    /// The sale id, as in MySQL's `sales.id`.
    pub sale_id: u64,
    /// The bucket, 0 to K − 1 (see the module doc).
    pub bucket: u32,
}

impl SaleKeys {
    /// The keys of sale `sale_id` (its bucket 0: all of a one-bucket sale).
    pub fn new(sale_id: u64) -> Self {
        SaleKeys { sale_id, bucket: 0 }
    }

    /// The keys of bucket `bucket` of sale `sale_id`.
    pub fn bucket(sale_id: u64, bucket: u32) -> Self {
        SaleKeys { sale_id, bucket }
    }

    /// The hash tag of these keys, braces included: `{sale:ID}` for bucket
    /// 0, `{sale:ID:bB}` for bucket B.
    pub fn tag(&self) -> String {
        match self.bucket {
            0 => format!("{{sale:{}}}", self.sale_id),
            b => format!("{{sale:{}:b{b}}}", self.sale_id),
        }
    }

    fn key(&self, suffix: &str) -> String {
        format!("seckill:{}:{suffix}", self.tag())
    }

    /// Hash of `total_stock`, `starts_at_ms`, `ends_at_ms`.
    pub fn meta(&self) -> String {
        self.key("meta")
    }
    /// Units left to reserve.
    pub fn stock(&self) -> String {
        self.key("stock")
    }
    /// Hash user id -> reservation id.
    pub fn buyers(&self) -> String {
        self.key("buyers")
    }
    /// Hash reservation id -> order message JSON (the flow records).
    pub fn flow(&self) -> String {
        self.key("flow")
    }
    /// Hash reservation id -> purchase status.
    pub fn status(&self) -> String {
        self.key("status")
    }
    /// Hash user id -> the reservation id whose buyer mark a release
    /// removed (a rollback, or an expiry or cancellation in a sale that lets
    /// a released buyer buy again; `release.rs`). The status route reads
    /// it when the buyer holds no mark, so a buyer who was answered 202
    /// reads the status of that purchase (`failed`, `expired`, `cancelled`)
    /// until the sale is archived or they buy again.
    pub fn released_buyers(&self) -> String {
        self.key("buyers:released")
    }
    /// Hash reservation id -> payment deadline (Unix ms) of an order
    /// created `pending_payment`.
    pub fn pay_by(&self) -> String {
        self.key("pay_by")
    }
    /// Hash reservation id -> flow record of a released order (see the
    /// lifecycle mode of `release.rs`).
    pub fn released(&self) -> String {
        self.key("released")
    }
    /// The sale's reliable queue of order messages.
    pub fn queue(&self) -> String {
        self.key("queue")
    }
    /// The six keys of the reservation scripts (`reservation.rs`,
    /// `reserve_units.rs`), in their `KEYS` order: meta, stock, buyers,
    /// flow, status, queue.
    pub fn reservation_keys(&self) -> [String; 6] {
        [
            self.meta(),
            self.stock(),
            self.buyers(),
            self.flow(),
            self.status(),
            self.queue(),
        ]
    }
    /// The processing list of worker `worker_id` for this sale.
    pub fn processing(&self, worker_id: &str) -> String {
        self.key(&format!("processing:{worker_id}"))
    }
    /// The sale's dead-letter list.
    pub fn dead_letter(&self) -> String {
        self.key("dlq")
    }
    /// Hash reservation id -> failed applications so far.
    pub fn attempts(&self) -> String {
        self.key("attempts")
    }
    /// The sale's archive of settled dead-letter entries: each one moved out
    /// of [`SaleKeys::dead_letter`] by the operator action (rollback,
    /// reorder) that settled its reservation, wrapped with that action, so
    /// the reconciler stops reporting it but nothing is lost.
    pub fn dead_letter_archive(&self) -> String {
        self.key("dlq:archive")
    }
    /// Hash reservation id -> the mark (`ACTION_ID@TIME`) of the operator
    /// reorder that last queued it again: written by the reorder script in
    /// the same atomic step, it tells an interrupted `resolve --reorder`
    /// whether its effect happened.
    pub fn reorder_marks(&self) -> String {
        self.key("reordered")
    }
    /// Hash action key -> units an operator's `sale add-stock` added to
    /// this bucket (`sale_admin.rs`), written with the units.
    pub fn stock_added(&self) -> String {
        self.key("stock_added")
    }
    /// Hash transfer id -> record of units this bucket gave away.
    pub fn transfers_out(&self) -> String {
        self.key("transfers:out")
    }
    /// Hash transfer id -> record of a transfer out whose destination has
    /// not confirmed taking it in yet.
    pub fn transfers_open(&self) -> String {
        self.key("transfers:open")
    }
    /// Hash transfer id -> record of units this bucket took from another.
    pub fn transfers_in(&self) -> String {
        self.key("transfers:in")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_purchase_key_shares_one_hash_tag() {
        let k = SaleKeys::new(42);
        for key in [
            k.meta(),
            k.stock(),
            k.buyers(),
            k.flow(),
            k.status(),
            k.queue(),
            k.processing("w1"),
            k.dead_letter(),
            k.attempts(),
            k.dead_letter_archive(),
            k.reorder_marks(),
            k.released(),
            k.pay_by(),
            k.released_buyers(),
        ] {
            assert!(key.starts_with("seckill:{sale:42}:"), "{key}");
        }
        assert_eq!(k.stock(), "seckill:{sale:42}:stock");
        assert_eq!(k.processing("w1"), "seckill:{sale:42}:processing:w1");
        assert_eq!(k, SaleKeys::bucket(42, 0));
    }

    #[test]
    fn a_bucket_has_its_own_hash_tag() {
        let b = SaleKeys::bucket(42, 2);
        assert_eq!(b.stock(), "seckill:{sale:42:b2}:stock");
        assert_eq!(b.transfers_in(), "seckill:{sale:42:b2}:transfers:in");
        assert_eq!(b.processing("w1"), "seckill:{sale:42:b2}:processing:w1");
    }
}
