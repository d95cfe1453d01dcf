//! Owns a process's figures of its own Redis and MySQL connections, by
//! store: open now, in use now (gateway), and reconnects. Each place that
//! keeps a connection holds a [`Slot`]; a connection it opens is wrapped in
//! a [`Held`], counted open until it is dropped; an open by a slot that
//! had opened one before is a reconnect. The figures are the process's
//! (like `process_open_fds`), kept in atomics here so that no constructor
//! has to carry them; a binary names those of the stores it uses in its
//! registry with [`register`] (`seckill_gateway_connections{store}`, ...),
//! read at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The store a connection reaches (the `store` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// `SECKILL_REDIS_URL`.
    Redis = 0,
    /// `SECKILL_MYSQL_URL`.
    Mysql = 1,
}

impl Store {
    /// The `store` label.
    pub fn label(self) -> &'static str {
        match self {
            Store::Redis => "redis",
            Store::Mysql => "mysql",
        }
    }
}

/// Connections open now, by store ([`Store`] order).
static OPEN: [AtomicI64; 2] = [AtomicI64::new(0), AtomicI64::new(0)];
/// Connections in use now, by store.
static IN_USE: [AtomicI64; 2] = [AtomicI64::new(0), AtomicI64::new(0)];
/// Reconnects so far, by store.
static RECONNECTS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Which figures a binary exports: the gateway counts the connections in
/// use at the moment of the scrape (its Redis links), the worker only
/// open connections and reconnects (each of its connections belongs to
/// one thread, busy or blocked on it nearly all the time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Export {
    /// `PREFIX_connections{store}` and `PREFIX_reconnects_total{store}`.
    OpenAndReconnects,
    /// Those and `PREFIX_connections_in_use{store}`.
    WithInUse,
}

/// The figures of `stores` under a prefix, read at each scrape.
#[derive(Debug)]
struct Figures {
    open: String,
    in_use: Option<String>,
    reconnects: String,
    stores: Vec<Store>,
}

/// Names the figures of `stores` in `r` under `prefix` (`seckill_worker`):
/// `PREFIX_connections{store}`, `PREFIX_reconnects_total{store}` and, with
/// [`Export::WithInUse`], `PREFIX_connections_in_use{store}`; a series per
/// store from the start, at 0. They carry `r`'s labels.
pub fn register(r: &mut Registry, prefix: &str, stores: &[Store], export: Export) {
    r.register_collector(Box::new(Figures {
        open: format!("{prefix}_connections"),
        in_use: (export == Export::WithInUse).then(|| format!("{prefix}_connections_in_use")),
        reconnects: format!("{prefix}_reconnects"),
        stores: stores.to_vec(),
    }));
}

impl Figures {
    /// Writes one gauge family, a series per store.
    fn gauges(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        of: &[AtomicI64; 2],
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for s in &self.stores {
            let v = of[*s as usize].load(Ordering::Relaxed);
            ConstGauge::new(v).encode(family.encode_family(&[("store", s.label())])?)?;
        }
        Ok(())
    }
}

impl Collector for Figures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.gauges(
            &mut encoder,
            &self.open,
            "Connections this process holds open now, by store.",
            &OPEN,
        )?;
        if let Some(name) = &self.in_use {
            self.gauges(
                &mut encoder,
                name,
                "Connections held by a request or a pipeline now, by store.",
                &IN_USE,
            )?;
        }
        let mut family = encoder.encode_descriptor(
            &self.reconnects,
            "Connections opened again after one was lost or dropped, by store.",
            None,
            MetricType::Counter,
        )?;
        for s in &self.stores {
            let v = RECONNECTS[*s as usize].load(Ordering::Relaxed);
            ConstCounter::new(v).encode(family.encode_family(&[("store", s.label())])?)?;
        }
        Ok(())
    }
}

/// Connections of `store` open now in this process.
pub fn open(store: Store) -> i64 {
    OPEN[store as usize].load(Ordering::Relaxed)
}

/// Reconnects to `store` counted so far in this process.
pub fn reconnects(store: Store) -> u64 {
    RECONNECTS[store as usize].load(Ordering::Relaxed)
}

/// Connections of `store` in use now in this process.
pub fn in_use(store: Store) -> i64 {
    IN_USE[store as usize].load(Ordering::Relaxed)
}

/// One place that keeps a connection of a store (a thread's Redis link, a
/// consumer's MySQL session): knows whether it has opened one before.
#[derive(Debug)]
pub struct Slot {
    store: Store,
    opened: bool,
}

impl Slot {
    /// A slot that has opened nothing yet.
    pub const fn new(store: Store) -> Slot {
        Slot {
            store,
            opened: false,
        }
    }

    /// Counts `conn`, just opened, as open until the returned [`Held`] is
    /// dropped; a reconnect when this slot opened one before.
    pub fn hold<T>(&mut self, conn: T) -> Held<T> {
        let i = self.store as usize;
        if self.opened {
            RECONNECTS[i].fetch_add(1, Ordering::Relaxed);
        }
        self.opened = true;
        OPEN[i].fetch_add(1, Ordering::Relaxed);
        Held {
            conn,
            store: self.store,
        }
    }
}

/// A connection counted open while it lives (dereferences to it).
#[derive(Debug)]
pub struct Held<T> {
    conn: T,
    store: Store,
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.conn
    }
}

impl<T> DerefMut for Held<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.conn
    }
}

impl<T> Drop for Held<T> {
    fn drop(&mut self) {
        OPEN[self.store as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection of a store counted in use while it lives
/// ([`using`]): one atomic add when made, one when dropped.
#[derive(Debug)]
pub struct InUse(Store);

/// Counts one connection of `store` in use until the guard is dropped.
pub fn using(store: Store) -> InUse {
    IN_USE[store as usize].fetch_add(1, Ordering::Relaxed);
    InUse(store)
}

impl Drop for InUse {
    fn drop(&mut self) {
        IN_USE[self.0 as usize].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures are the process's: other tests of this crate may move
    /// them, so this one uses the MySQL store's, which nothing else here
    /// counts, and reads differences.
    #[test]
    fn a_slot_counts_its_reopens_and_a_held_connection_until_dropped() {
        let (open0, again0, using0) = (
            open(Store::Mysql),
            reconnects(Store::Mysql),
            in_use(Store::Mysql),
        );
        let mut slot = Slot::new(Store::Mysql);
        let first = slot.hold(7u8);
        assert_eq!((*first, open(Store::Mysql) - open0), (7, 1));
        assert_eq!(reconnects(Store::Mysql) - again0, 0);
        drop(first);
        let second = slot.hold(8u8);
        let busy = using(Store::Mysql);
        assert_eq!(open(Store::Mysql) - open0, 1);
        assert_eq!(reconnects(Store::Mysql) - again0, 1);
        assert_eq!(in_use(Store::Mysql) - using0, 1);
        drop((second, busy));
        assert_eq!(open(Store::Mysql) - open0, 0);
        assert_eq!(in_use(Store::Mysql) - using0, 0);
        let mut r = Registry::default();
        register(
            &mut r,
            "seckill_test",
            &[Store::Redis, Store::Mysql],
            Export::WithInUse,
        );
        let page = crate::metrics::render(&r).unwrap_or_default();
        for series in [
            "seckill_test_connections{store=\"redis\"}",
            "seckill_test_connections_in_use{store=\"mysql\"}",
            "seckill_test_reconnects_total{store=\"mysql\"}",
        ] {
            assert!(page.contains(series), "{series} in {page}");
        }
    }
}
