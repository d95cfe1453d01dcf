//! Owns an order's lifecycle states (`orders.status`) and the ledger reason
//! of a released unit: the one place that spells them.
//!
//! ```text
//! sale without payment window:  confirmed                      (final at creation)
//! sale with a payment window:   pending_payment ──pay──▶ paid
//!                                       │──deadline──▶ expired   (unit released)
//!                                       └──buyer────▶ cancelled (unit released)
//! ```
//!
//! Every transition out of `pending_payment` is one guarded `UPDATE ...
//! WHERE status = 'pending_payment'` (see `lifecycle.rs`), so an order takes
//! exactly one of them, ever.

use std::fmt;
use std::str::FromStr;

/// The state of an order, stored by name in `orders.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Final at creation: the sale has no payment window (`confirmed`, the
    /// behaviour before the lifecycle existed).
    Confirmed,
    /// Waiting for the payment until `orders.pay_by` (`pending_payment`).
    PendingPayment,
    /// The payment service paid it in time (`paid`). Final.
    Paid,
    /// The deadline passed unpaid; its unit went back on sale (`expired`). Final.
    Expired,
    /// The buyer gave it up; its unit went back on sale (`cancelled`). Final.
    Cancelled,
}

/// Every state, in the order of the diagram above.
pub const ALL: [OrderStatus; 5] = [
    OrderStatus::Confirmed,
    OrderStatus::PendingPayment,
    OrderStatus::Paid,
    OrderStatus::Expired,
    OrderStatus::Cancelled,
];

/// The states whose unit was released (back on sale), as an SQL list for
/// `status IN (...)`.
pub const RELEASED_SQL: &str = "('expired', 'cancelled')";

/// Every state but the released ones holds a unit: SQL reads those as
/// `status NOT IN RELEASED_SQL` (so rows written before the lifecycle, with
/// the column's old default `created`, count as holding).
/// The stock ledger's reason of a released order (delta + its quantity), next to `order`
/// (−1, the worker) and `compensation` (−1, the reconciler).
pub const LEDGER_RELEASE: &str = "release";

impl OrderStatus {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::PendingPayment => "pending_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Expired => "expired",
            OrderStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the order's unit went back on sale (expired or cancelled).
    pub fn is_released(self) -> bool {
        matches!(self, OrderStatus::Expired | OrderStatus::Cancelled)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not an [`OrderStatus`]; holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown order status {:?}", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

impl FromStr for OrderStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL.into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_string()))
    }
}

/// How an order left `pending_payment` without being paid: the two ways its
/// unit goes back on sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Release {
    /// The deadline passed (the expiry sweep).
    Expire,
    /// The buyer cancelled.
    Cancel,
}

impl Release {
    /// The state the order ends in.
    pub fn status(self) -> OrderStatus {
        match self {
            Release::Expire => OrderStatus::Expired,
            Release::Cancel => OrderStatus::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_its_word() {
        for s in ALL {
            assert_eq!(s.as_str().parse::<OrderStatus>(), Ok(s));
        }
        assert_eq!(
            "created".parse::<OrderStatus>(),
            Err(UnknownStatus("created".into()))
        );
        let released: Vec<_> = ALL.into_iter().filter(|s| s.is_released()).collect();
        assert_eq!(released, [OrderStatus::Expired, OrderStatus::Cancelled]);
        for s in ALL {
            let word = format!("'{}'", s.as_str());
            assert_eq!(RELEASED_SQL.contains(&word), s.is_released(), "{s}");
        }
    }
}
