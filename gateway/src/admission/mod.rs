//! Owns what a request must pass before anything is looked up for it:
//! who it is from ([`identity`], with [`verifier`] for tokens,
//! [`signature`] for their signatures and [`credentials`] for the words
//! they share), the per-buyer and
//! per-address shares ([`limits`]) and the bound on purchases waiting for
//! Redis ([`shed`]). Nothing here talks to Redis or knows HTTP.

pub mod credentials;
pub mod identity;
pub mod limits;
pub mod shed;
pub mod signature;
pub mod verifier;

pub use credentials::Credentials;

use crate::metrics::Metrics;
use identity::Identity;
use limits::{Limits, Verdict};
use shed::Shed;
use std::net::IpAddr;
use std::sync::Arc;

/// The admission parts every request passes.
pub struct Admission {
    /// Who a request is from (`SECKILL_AUTH`).
    pub identity: Identity,
    /// The per-buyer and per-address rate limits.
    pub limits: Limits,
    /// The bound on purchases waiting for Redis.
    pub shed: Shed,
    /// Counts the requests refused here.
    pub metrics: Arc<Metrics>,
}

impl Admission {
    /// Charges one purchase attempt of `user_id` on `sale_id`; false (and
    /// counted) beyond the buyer's share.
    pub fn charge_buyer(&self, sale_id: u64, user_id: &str) -> bool {
        let v = self.limits.charge_buyer(sale_id, user_id);
        if v != Verdict::Allowed {
            self.metrics.limited_buyer.inc();
        }
        self.allowed(v)
    }

    /// Charges one request of the client address `addr`; false (and
    /// counted) beyond the address's share.
    pub fn charge_address(&self, addr: IpAddr) -> bool {
        let v = self.limits.charge_address(addr);
        if v != Verdict::Allowed {
            self.metrics.limited_address.inc();
        }
        self.allowed(v)
    }

    /// True for `Allowed`; counts a full table.
    fn allowed(&self, v: Verdict) -> bool {
        if v == Verdict::TableFull {
            self.metrics.limit_table_full.inc();
        }
        v == Verdict::Allowed
    }
}

#[cfg(test)]
pub(crate) mod tests;
