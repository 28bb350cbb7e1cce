//! What requests read from the monitor: `/status`'s view and `/health`'s part, judged from the
//! latest snapshot when they are read (staleness included), without waiting on anything.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::Serialize;

use super::super::decision::WatchState;
use super::super::{BackendReport, Decision, GpuInfo, GpuProcess, Unmeasured};
use super::{GpuMonitor, Snapshot};
use crate::worker::{WorkerState, WorkerStatus};

/// `GET /status`: the original fields (`gpu`, `processes`, `is_idle`) plus the rest.
#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    pub gpu: Option<GpuInfo>,
    pub processes: Vec<GpuProcess>,
    /// True only when the sample is fresh and no process uses the GPU (the original meaning).
    pub is_idle: bool,
    pub decision: Decision,
    pub reason: String,
    pub free_mib: Option<u64>,
    /// What gpuhost's own idle resident workers hold and would release if stopped.
    pub reclaimable_mib: u64,
    pub gpus: Vec<GpuInfo>,
    /// GPUs listed without memory figures (a display card, a unified-memory board): their
    /// processes are listed, the GPUs themselves cannot be judged.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus_unmeasured: Vec<Unmeasured>,
    pub watched: Vec<WatchState>,
    pub backend: BackendReport,
    pub sampled_at: Option<f64>,
    pub sample_age_s: Option<f64>,
    pub error: Option<String>,
}

/// The part of the GPU status `/health` shows.
#[derive(Debug, Clone, Serialize)]
pub struct GpuHealth {
    pub backend: &'static str,
    /// `ok`, `starting`, `failing` or `unavailable`.
    pub sampling: &'static str,
    pub decision: Decision,
    /// That the sample fails, not why (the why may hold paths and command lines).
    pub error: Option<String>,
}

impl GpuMonitor {
    /// The decision, reason and error of `snap` as of now: a stale snapshot reads `unknown`.
    fn verdict(&self, snap: &Snapshot) -> (Decision, String, Option<String>, bool) {
        let age = snap.taken.map(|t| t.elapsed()).unwrap_or_default();
        if snap.taken.is_some() && age > self.stale_after {
            let why = format!(
                "the last GPU sample is {:.1} s old (stale after {:.0} s)",
                age.as_secs_f64(),
                self.stale_after.as_secs_f64()
            );
            return (Decision::Unknown, why.clone(), Some(why), true);
        }
        (
            snap.decision,
            snap.reason.clone(),
            snap.error.clone(),
            false,
        )
    }

    /// Whether sampling works, for the open `/health`: no processes, no command lines.
    pub fn health(&self) -> GpuHealth {
        let snap = Arc::clone(&self.snapshot.borrow());
        let (decision, _, error, stale) = self.verdict(&snap);
        // A sample's error may quote nvidia-smi's stderr, its path or a process line: the open
        // endpoint says that sampling fails, `/status` (with the token) why.
        let error = error.map(|why| {
            if stale {
                why
            } else {
                "the GPU sample could not be read or trusted: /status says why".into()
            }
        });
        let sampling = match (&error, self.report.active) {
            (_, "none") => "unavailable",
            (Some(_), _) => "failing",
            (None, _) if snap.taken.is_none() => "starting",
            (None, _) => "ok",
        };
        GpuHealth {
            backend: self.report.active,
            sampling,
            decision,
            error,
        }
    }

    /// The snapshot as of now, with staleness applied.
    pub fn view(&self, workers: &[WorkerStatus]) -> StatusView {
        let snap = Arc::clone(&self.snapshot.borrow());
        let age = snap.taken.map(|t| t.elapsed());
        let (decision, reason, error, stale) = self.verdict(&snap);
        let gpu = if error.is_some() {
            None
        } else {
            snap.gpus.iter().find(|g| g.index == self.device).cloned()
        };
        let fresh = gpu.is_some() && !stale && snap.taken.is_some();
        // (Without command lines when `hide_commands` is set: the sampler left them out.)
        let processes = snap.processes.clone();
        let idle_workers: Vec<&str> = workers
            .iter()
            .filter(|w| w.state == WorkerState::Ready)
            .map(|w| w.name.as_str())
            .collect();
        let reclaimable_mib = processes
            .iter()
            .filter(|p| {
                p.worker
                    .as_deref()
                    .is_some_and(|w| idle_workers.contains(&w))
            })
            .map(|p| p.used_memory_mib)
            .fold(0, u64::saturating_add);
        StatusView {
            free_mib: gpu.as_ref().map(|g| g.memory_free_mib),
            is_idle: fresh && !processes.iter().any(|p| p.gpu_index == self.device),
            gpu,
            processes,
            decision,
            reason,
            reclaimable_mib,
            gpus: snap.gpus.clone(),
            gpus_unmeasured: snap.unmeasured.clone(),
            watched: snap.watched.clone(),
            backend: self.report.clone(),
            sampled_at: snap
                .taken_wall
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs_f64()),
            sample_age_s: age.map(|a| (a.as_secs_f64() * 1000.0).round() / 1000.0),
            error,
        }
    }
}
