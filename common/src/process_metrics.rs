//! Owns the process figures a `/metrics` page carries (the names the
//! Prometheus client libraries use): resident and virtual memory, open
//! and allowed file descriptors, threads. Read from `/proc/self` at each
//! scrape, so nothing is counted on a request's path; a figure `/proc`
//! does not give (another system) is left out, not written as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// The process figures, read at each scrape (register it with
/// `Registry::register_collector`).
#[derive(Debug, Default)]
pub struct ProcessFigures;

/// One figure read from `/proc/self`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    /// `VmRSS` in bytes.
    pub resident_bytes: Option<u64>,
    /// `VmSize` in bytes.
    pub virtual_bytes: Option<u64>,
    /// `Threads`.
    pub threads: Option<u64>,
    /// Entries of `/proc/self/fd`.
    pub open_fds: Option<u64>,
    /// The soft limit of `Max open files` (`RLIMIT_NOFILE`).
    pub max_fds: Option<u64>,
}

/// The value of `field` (`VmRSS:`) of a `/proc/self/status` text, in its
/// unit (kB for memory).
fn status_field(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The soft limit of `Max open files` in a `/proc/self/limits` text.
fn max_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Reads the figures of this process.
pub fn read() -> Figures {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    Figures {
        resident_bytes: status_field(&status, "VmRSS:").map(|kb| kb * 1024),
        virtual_bytes: status_field(&status, "VmSize:").map(|kb| kb * 1024),
        threads: status_field(&status, "Threads:"),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64),
        max_fds: max_open_files(&limits),
    }
}

/// Name, HELP (with its full stop: a collector's text is written as given)
/// and value of each figure.
type Figure = (&'static str, &'static str, fn(&Figures) -> Option<u64>);

const FIGURES: [Figure; 5] = [
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        |f| f.resident_bytes,
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        |f| f.virtual_bytes,
    ),
    ("process_threads", "Threads of the process.", |f| f.threads),
    (
        "process_open_fds",
        "Open file descriptors (sockets included).",
        |f| f.open_fds,
    ),
    (
        "process_max_fds",
        "Largest number of file descriptors the process may open (RLIMIT_NOFILE).",
        |f| f.max_fds,
    ),
];

impl Collector for ProcessFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = read();
        for (name, help, value) in FIGURES {
            if let Some(v) = value(&figures) {
                let metric = ConstGauge::new(v as i64);
                let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                metric.encode(e)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_are_read_from_proc_texts() {
        let status = "Name:\tx\nVmSize:\t  123 kB\nVmRSS:\t   45 kB\nThreads:\t7\n";
        assert_eq!(status_field(status, "VmRSS:"), Some(45));
        assert_eq!(status_field(status, "VmSize:"), Some(123));
        assert_eq!(status_field(status, "Threads:"), Some(7));
        assert_eq!(status_field(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
    }

    #[test]
    fn this_process_has_threads_memory_and_descriptors() {
        let f = read();
        assert!(f.threads.is_some_and(|t| t >= 1), "{f:?}");
        assert!(f.resident_bytes.is_some_and(|b| b > 0), "{f:?}");
        assert!(f.open_fds.is_some_and(|n| n >= 3), "{f:?}");
    }
}
