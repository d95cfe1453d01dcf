//! Owns what the load simulator records over time for the HTML report
//! (`tests/src/report_html.rs`): a sampler thread that reads the sale's
//! figures ([`Progress`]: stock left, reserved, queued, processing in
//! Redis; ordered, paid in MySQL) every [`SAMPLE_EVERY`] from just before
//! the crowd to the end of the run (drain and order lifecycle included),
//! with one last sample once stopped, and the crowd's answers bucketed by
//! when they were read ([`BUCKET_MS`]): counts by status and latency
//! percentiles per bucket. Written into the JSON report as `timeline`.

use super::drive::Record;
use super::state::{Progress, Store};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Pause between two samples: ten a second resolve a crowd that sells out
/// in under a second, for a few Redis reads and one `COUNT` per sample
/// (next to the crowd's tens of thousands of requests a second).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Width of one bucket of answers, in ms.
pub const BUCKET_MS: u32 = 100;

/// One sample: when (Unix ms, this machine's clock) and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// When it was read, Unix ms.
    pub at_ms: u64,
    /// What was read.
    pub figures: Progress,
}

/// The sampler thread; [`Sampler::stop`] ends it and returns its samples.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(Vec<Sample>, u64)>,
}

impl Sampler {
    /// Takes a first sample through `store` (its own connections: the
    /// run's store stays free), then goes on sampling in a thread. A sample
    /// that fails (a timeout) is skipped and counted; the report says how
    /// many.
    pub fn start(mut store: Store) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let mut samples = Vec::new();
        let mut failed = 0u64;
        // Stamped when the read starts (Redis is read first).
        let mut sample = move |samples: &mut Vec<Sample>, failed: &mut u64| {
            let at_ms = seckill_common::now_ms();
            match store.progress() {
                Ok(figures) => samples.push(Sample { at_ms, figures }),
                Err(_) => *failed += 1,
            }
        };
        // The first on the caller's thread: the sale before the crowd.
        sample(&mut samples, &mut failed);
        let handle = std::thread::spawn(move || {
            loop {
                std::thread::park_timeout(SAMPLE_EVERY);
                // Read the flag first: the sample after it is the last one,
                // taken once everything the run did is done.
                let last = flag.load(Ordering::SeqCst);
                sample(&mut samples, &mut failed);
                if last {
                    return (samples, failed);
                }
            }
        });
        Sampler { stop, handle }
    }

    /// Stops the thread after one last sample; returns the samples in time
    /// order and how many failed.
    pub fn stop(self) -> (Vec<Sample>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.thread().unpark();
        self.handle.join().unwrap_or_default()
    }
}

/// The crowd's answers per bucket of [`BUCKET_MS`] (bucket `i` holds the
/// answers read from `i × BUCKET_MS` ms after the first request was sent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Buckets {
    /// Answers per bucket by HTTP status (0: no answer); every vector has
    /// one entry per bucket.
    pub answers: BTreeMap<u16, Vec<u64>>,
    /// Latency percentiles per bucket in ms: p50, p99 and max (0 for a
    /// bucket without answers).
    pub latency_ms: [Vec<f64>; 3],
}

/// Buckets `records` by `done_ms`.
pub fn buckets(records: &[Record]) -> Buckets {
    let n = records
        .iter()
        .map(|r| (r.done_ms / BUCKET_MS) as usize + 1)
        .max()
        .unwrap_or(0);
    let mut answers: BTreeMap<u16, Vec<u64>> = BTreeMap::new();
    let mut latencies: Vec<Vec<u32>> = vec![Vec::new(); n];
    for r in records {
        let i = (r.done_ms / BUCKET_MS) as usize;
        answers.entry(r.status).or_insert_with(|| vec![0; n])[i] += 1;
        latencies[i].push(r.latency_us);
    }
    let mut latency_ms: [Vec<f64>; 3] = Default::default();
    for mut l in latencies {
        l.sort_unstable();
        let at = |q: f64| -> f64 {
            if l.is_empty() {
                return 0.0;
            }
            let i = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len()) - 1;
            l[i] as f64 / 1000.0
        };
        for (k, q) in [0.5, 0.99, 1.0].into_iter().enumerate() {
            latency_ms[k].push(at(q));
        }
    }
    Buckets {
        answers,
        latency_ms,
    }
}

/// The report's `timeline` object: `started_at_ms` (Unix ms of the first
/// request), `bucket_ms`, `answers` (status → counts per bucket, `0` named
/// `no_answer`), `latency_ms` (`p50`, `p99`, `max` per bucket), and
/// `samples` (`t_ms` since the first request, negative before it, then one
/// array per figure, `null` where not read), `samples_failed`.
pub fn to_json(started_at_ms: u64, b: &Buckets, samples: &[Sample], failed: u64) -> Value {
    let answers = super::report::by_status(&b.answers);
    let col = |f: fn(&Progress) -> Value| -> Vec<Value> {
        samples.iter().map(|s| f(&s.figures)).collect()
    };
    json!({
        "started_at_ms": started_at_ms,
        "bucket_ms": BUCKET_MS,
        "answers": answers,
        "latency_ms": {
            "p50": b.latency_ms[0], "p99": b.latency_ms[1], "max": b.latency_ms[2],
        },
        "samples": {
            "t_ms": samples.iter().map(|s| s.at_ms as i64 - started_at_ms as i64).collect::<Vec<_>>(),
            "stock_left": col(|p| json!(p.stock_left)),
            "reserved": col(|p| json!(p.reserved)),
            "ordered": col(|p| json!(p.ordered)),
            "paid": col(|p| json!(p.paid)),
            "queued": col(|p| json!(p.queued)),
            "processing": col(|p| json!(p.processing)),
        },
        "samples_failed": failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(status: u16, latency_us: u32, done_ms: u32) -> Record {
        Record {
            step: 0,
            status,
            latency_us,
            done_ms,
            reservation_id: None,
            error_code: None,
            units_left: None,
        }
    }

    #[test]
    fn answers_are_counted_per_bucket_with_their_percentiles() {
        let b = buckets(&[
            rec(202, 1000, 5),
            rec(202, 3000, 99),
            rec(410, 2000, 50),
            rec(410, 9000, 250),
        ]);
        assert_eq!(b.answers[&202], vec![2, 0, 0]);
        assert_eq!(b.answers[&410], vec![1, 0, 1]);
        assert_eq!(b.latency_ms[0], vec![2.0, 0.0, 9.0]);
        assert_eq!(b.latency_ms[2], vec![3.0, 0.0, 9.0]);
        assert_eq!(buckets(&[]), Buckets::default());
    }
}
