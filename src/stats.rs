//! Job counters for `/health` and `/metrics`: lock-free atomics, never behind the GPU lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::pipeline::PipelineError;

#[derive(Debug, Default)]
pub struct JobStats {
    pub succeeded: AtomicU64,
    pub failed: AtomicU64,
    /// Sum of job durations (GPU held), in microseconds.
    pub busy_micros: AtomicU64,
}

impl JobStats {
    pub fn record<T>(&self, outcome: &Result<T, PipelineError>, took: Duration) {
        match outcome {
            Ok(_) => self.succeeded.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        self.busy_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }
}
