//! Job counters for `/health` and `/metrics`: atomics and a `prometheus-client` histogram, never
//! behind the GPU lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::histogram::Histogram;

use crate::pipeline::PipelineError;

/// Upper bounds (seconds) of the job-duration histogram buckets.
pub const BUCKETS: [f64; 10] = [0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0];

#[derive(Debug)]
pub struct JobStats {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// Jobs a worker refused for what they asked (too little speech to enrol, a language the
    /// model lacks): the client's to change, so not counted as failed.
    pub refused: AtomicU64,
    /// Jobs abandoned because their client went away.
    pub cancelled: AtomicU64,
    /// Sum of job durations (GPU held), in microseconds.
    pub busy_micros: AtomicU64,
    /// How long jobs held the GPU; a handle `/metrics` registers as it is (it shares the counts).
    pub durations: Histogram,
}

impl Default for JobStats {
    fn default() -> Self {
        JobStats {
            succeeded: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            busy_micros: AtomicU64::new(0),
            durations: Histogram::new(BUCKETS),
        }
    }
}

impl JobStats {
    pub fn record<T>(&self, outcome: &Result<T, PipelineError>, took: Duration) {
        match outcome {
            Ok(_) => self.succeeded.fetch_add(1, Ordering::Relaxed),
            Err(PipelineError::Cancelled) => self.cancelled.fetch_add(1, Ordering::Relaxed),
            Err(PipelineError::Stage { source, .. }) if source.is_refusal() => {
                self.refused.fetch_add(1, Ordering::Relaxed)
            }
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        self.busy_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.durations.observe(took.as_secs_f64());
    }

    /// Jobs recorded, whatever their outcome.
    pub fn total(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
            + self.failed.load(Ordering::Relaxed)
            + self.refused.load(Ordering::Relaxed)
            + self.cancelled.load(Ordering::Relaxed)
    }
}
