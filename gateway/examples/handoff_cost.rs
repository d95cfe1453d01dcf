//! Measures what the group commit's hand-off costs on this machine with
//! no Redis behind it: connection threads each queue a job on the real
//! channel and wait on the real [`Slot`]; one thread takes the waiting
//! jobs in batches (`group_commit::next_batch`, as the Redis threads do) and fills each
//! slot at once. Prints hand-offs per second, the average batch, and CPU
//! per hand-off (every thread's time on a CPU, from
//! `/proc/self/task/*/schedstat`, in µs): the part of a purchase's CPU
//! beyond a health check that is neither instructions nor Redis (the two
//! wake-ups, the futex calls, the scheduler). Asserts nothing (a benchmark,
//! not a test). Run it on a release build:
//! `cargo run --release -p seckill-gateway --example handoff_cost`
//! (figures in docs/PERFORMANCE.md, "The hand-off").

use seckill_gateway::redis::group_commit::{
    next_batch, Job, ReplyTo, Slot, MAX_BATCH, QUEUE_CAPACITY,
};
use seckill_gateway::redis::link::Unavailable;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Nanoseconds every thread of this process has run on a CPU.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `conns` waiting threads for `run`: (hand-offs, batches, CPU ns).
fn handoffs(conns: usize, run: Duration) -> (u64, u64, u64) {
    let (tx, rx) = crossbeam_channel::bounded::<Job>(QUEUE_CAPACITY);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let server = {
        let batches = batches.clone();
        std::thread::spawn(move || {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while next_batch(&rx, &mut batch) {
                batches.fetch_add(1, Ordering::Relaxed);
                for j in batch.drain(..) {
                    if j.reply_to.mark_sent() {
                        j.reply_to.fill(&j.user_id, Err(Unavailable));
                    }
                }
            }
        })
    };
    let clients: Vec<_> = (0..conns)
        .map(|i| {
            let (tx, stop, done) = (tx.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let slot = Arc::new(Slot::default());
                    let job = Job {
                        sale_id: 1,
                        bucket: 0,
                        user_id: format!("u{i}"),
                        reservation_id: seckill_common::ids::new_reservation_id(),
                        reply_to: ReplyTo::Waiter(slot.clone()),
                    };
                    if tx.send(job).is_err() {
                        return;
                    }
                    let _ = slot.wait(Duration::from_secs(5), Duration::from_secs(5));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    drop(tx);
    std::thread::sleep(Duration::from_millis(200));
    let (n0, b0, c0) = (
        done.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
        cpu_ns(),
    );
    std::thread::sleep(run);
    let (n1, b1, c1) = (
        done.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
        cpu_ns(),
    );
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.join();
    }
    let _ = server.join();
    (n1 - n0, b1 - b0, c1.saturating_sub(c0))
}

fn main() {
    let run = Duration::from_secs(2);
    println!("group-commit hand-off, no Redis, {run:?} each");
    for conns in [1, 16, 64] {
        let (n, batches, cpu) = handoffs(conns, run);
        println!(
            "  {conns:>3} waiting threads: {:>9.0} hand-offs/s, {:>5.1} per batch, {:>5.2} us CPU per hand-off",
            n as f64 / run.as_secs_f64(),
            n as f64 / batches.max(1) as f64,
            cpu as f64 / 1e3 / n.max(1) as f64
        );
    }
}
