//! Job counters for `/health` and `/metrics`: lock-free atomics, never behind the GPU lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::pipeline::PipelineError;

/// Upper bounds (seconds) of the job-duration histogram buckets.
pub const BUCKETS: [f64; 10] = [0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

#[derive(Debug, Default)]
pub struct JobStats {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// Jobs abandoned because their client went away.
    pub cancelled: AtomicU64,
    /// Sum of job durations (GPU held), in microseconds.
    pub busy_micros: AtomicU64,
    /// Jobs that took at most `BUCKETS[i]` seconds (not cumulative).
    pub buckets: [AtomicU64; BUCKETS.len()],
}

impl JobStats {
    pub fn record<T>(&self, outcome: &Result<T, PipelineError>, took: Duration) {
        match outcome {
            Ok(_) => self.succeeded.fetch_add(1, Ordering::Relaxed),
            Err(PipelineError::Cancelled) => self.cancelled.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        self.busy_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if let Some(i) = BUCKETS.iter().position(|&b| took.as_secs_f64() <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Jobs recorded, whatever their outcome.
    pub fn total(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.cancelled.load(Ordering::Relaxed)
    }

    /// Cumulative bucket counts, as Prometheus wants them.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(&le, n)| {
                total += n.load(Ordering::Relaxed);
                (le, total)
            })
            .collect()
    }
}
