//! The background sampler and the snapshot it publishes. Requests read the snapshot (a `watch`
//! borrow: no `.await`, no driver call, no GPU lock); staleness is judged when it is read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::decision::WatchState;
use super::error::SampleError;
use super::procfs::ProcFs;
use super::{
    Backend, BackendReport, Decision, DecisionInput, GpuInfo, GpuProcess, Judge, RawSample,
};
use crate::config::{Config, WatchConfig};
use crate::supervisor::Supervisor;
use crate::worker::{WorkerState, WorkerStatus};

/// One published sample with its verdict.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Option<Instant>,
    pub taken_wall: Option<SystemTime>,
    pub gpus: Vec<GpuInfo>,
    pub processes: Vec<GpuProcess>,
    pub watched: Vec<WatchState>,
    pub error: Option<String>,
    pub decision: Decision,
    pub reason: String,
}

impl Snapshot {
    pub fn empty(reason: &str) -> Snapshot {
        Snapshot {
            taken: None,
            taken_wall: None,
            gpus: Vec::new(),
            processes: Vec::new(),
            watched: Vec::new(),
            error: None,
            decision: Decision::Unknown,
            reason: reason.into(),
        }
    }
}

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
    pub error: Option<String>,
}

pub struct GpuMonitor {
    snapshot: watch::Receiver<Arc<Snapshot>>,
    pub report: BackendReport,
    stale_after: Duration,
    device: u32,
    hide_commands: bool,
    /// Taken once on shutdown; std Mutex, never held across `.await`.
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

struct Sampler {
    backend: Backend,
    procfs: ProcFs,
    watch: Vec<WatchConfig>,
    judge: Judge,
    supervisor: Arc<Supervisor>,
    http: reqwest::Client,
    device: u32,
}

impl GpuMonitor {
    /// Picks the backend, logs why, and starts sampling.
    pub fn start(config: &Config, supervisor: Arc<Supervisor>) -> GpuMonitor {
        let st = &config.gpu.status;
        let (backend, report) = Backend::select(st);
        match &report.path {
            Some(path) => {
                tracing::info!(backend = report.active, %path, unavailable = ?report.unavailable, "GPU status backend")
            }
            None => {
                tracing::warn!(unavailable = ?report.unavailable, "no GPU status backend: /status will read unknown")
            }
        }
        let initial = match &backend {
            Backend::None => {
                let why: Vec<String> = report.unavailable.iter().map(|u| u.summary()).collect();
                let mut s = Snapshot::empty(&format!(
                    "no NVIDIA GPU: {} (every path tried: backend.unavailable, or `gpuhost status -v`)",
                    why.join(", ")
                ));
                s.error = Some("no GPU backend".into());
                s
            }
            _ => Snapshot::empty("no sample yet"),
        };
        let (tx, rx) = watch::channel(Arc::new(initial));
        let device = config.gpu.device as u32;
        let task = (!matches!(backend, Backend::None)).then(|| {
            let sampler = Sampler {
                backend,
                procfs: ProcFs::new(config.resolve(&st.proc_root)),
                watch: config.gpu.watch.clone(),
                judge: Judge::new(
                    st.idle_utilization_pct,
                    st.idle_memory_mib,
                    Duration::from_secs_f64(st.quiet_period_s),
                ),
                supervisor,
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(1))
                    .build()
                    .unwrap_or_default(),
                device,
            };
            tokio::spawn(sampler.run(tx, Duration::from_secs_f64(st.interval_s)))
        });
        GpuMonitor {
            snapshot: rx,
            report,
            stale_after: Duration::from_secs_f64(st.stale_after_s),
            device,
            hide_commands: st.hide_commands,
            task: std::sync::Mutex::new(task),
        }
    }

    /// Every published snapshot, for those who wait on the GPU (teardown checks).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }

    /// Whether a backend samples at all (without one nothing can be verified on the GPU).
    pub fn observed(&self) -> bool {
        self.report.active != "none"
    }

    pub fn device(&self) -> u32 {
        self.device
    }

    pub fn stop(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }

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
        let (decision, _, error, _) = self.verdict(&snap);
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
        let mut processes = snap.processes.clone();
        if self.hide_commands {
            for p in &mut processes {
                p.command.clear();
                p.command_note = None;
            }
        }
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
            .sum();
        StatusView {
            free_mib: gpu.as_ref().map(|g| g.memory_free_mib),
            is_idle: fresh && !processes.iter().any(|p| p.gpu_index == self.device),
            gpu,
            processes,
            decision,
            reason,
            reclaimable_mib,
            gpus: snap.gpus.clone(),
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

impl Sampler {
    async fn run(mut self, tx: watch::Sender<Arc<Snapshot>>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let raw = self.backend.sample().await;
            let snapshot = self.build(raw).await;
            if tx.send(Arc::new(snapshot)).is_err() {
                return;
            }
        }
    }

    async fn build(&mut self, raw: Result<RawSample, SampleError>) -> Snapshot {
        let now = Instant::now();
        let (raw, error) = match raw {
            Ok(raw) => (raw, None),
            Err(e) => (RawSample::default(), Some(e.to_string())),
        };
        let worker_pids: HashMap<u32, String> = self
            .supervisor
            .statuses()
            .into_iter()
            .filter_map(|s| Some((s.pid?, s.name)))
            .collect();
        let processes: Vec<GpuProcess> = raw
            .processes
            .iter()
            .map(|p| {
                let cmd = self.procfs.command(p.pid);
                let worker = self
                    .procfs
                    .lineage(p.pid)
                    .iter()
                    .find_map(|pid| worker_pids.get(pid).cloned());
                let watch = self
                    .watch
                    .iter()
                    .find(|w| cmd.command.contains(&w.pattern))
                    .map(|w| w.name.clone());
                GpuProcess {
                    pid: p.pid,
                    name: p
                        .name
                        .clone()
                        .or_else(|| self.procfs.comm(p.pid))
                        .unwrap_or_default(),
                    used_memory_mib: p.used_memory_mib.unwrap_or(0),
                    command: cmd.command,
                    command_pid: cmd.from_pid,
                    command_note: cmd.note,
                    gpu_index: p.gpu_index,
                    worker,
                    watch,
                }
            })
            .collect();
        let watched = self.watched(&processes).await;
        let mut gpus = raw.gpus;
        reconcile(&mut gpus, &processes);
        let gpu = gpus.iter().find(|g| g.index == self.device);
        // The decision is about the reported device; other GPUs have their own holders.
        let on_device: Vec<GpuProcess> = processes
            .iter()
            .filter(|p| p.gpu_index == self.device)
            .cloned()
            .collect();
        let input = DecisionInput {
            gpu,
            processes: &on_device,
            watched: &watched,
            error: error.as_deref(),
        };
        let (decision, reason) = self.judge.decide(&input, now);
        Snapshot {
            taken: Some(now),
            taken_wall: Some(SystemTime::now()),
            gpus,
            processes,
            watched,
            error,
            decision,
            reason,
        }
    }

    /// Finds each watched service among all processes (a service may not have touched the GPU
    /// yet) and asks its health URL.
    async fn watched(&self, processes: &[GpuProcess]) -> Vec<WatchState> {
        let patterns: Vec<&str> = self.watch.iter().map(|w| w.pattern.as_str()).collect();
        let found = self.procfs.find(&patterns, std::process::id());
        let mut out = Vec::new();
        for (w, mut pids) in self.watch.iter().zip(found) {
            for p in processes
                .iter()
                .filter(|p| p.watch.as_deref() == Some(&w.name))
            {
                if !pids.contains(&p.pid) {
                    pids.push(p.pid);
                }
            }
            let healthy = match (&w.health_url, pids.is_empty()) {
                (Some(url), false) => Some(
                    self.http
                        .get(url)
                        .send()
                        .await
                        .map(|r| r.status().is_success())
                        .unwrap_or(false),
                ),
                _ => None,
            };
            out.push(WatchState {
                name: w.name.clone(),
                pids,
                healthy,
                health_url: w.health_url.clone(),
            });
        }
        out
    }
}
/// One sample is two readings (the process list, the device's memory), taken apart: a process
/// listed with memory the device total does not count yet must not make room look free. Used
/// memory is at least what the listed processes hold.
fn reconcile(gpus: &mut [GpuInfo], processes: &[GpuProcess]) {
    for g in gpus {
        let listed: u64 = processes
            .iter()
            .filter(|p| p.gpu_index == g.index)
            .map(|p| p.used_memory_mib)
            .sum();
        if listed > g.memory_used_mib {
            g.memory_used_mib = listed.min(g.memory_total_mib);
            g.memory_free_mib = g.memory_total_mib.saturating_sub(g.memory_used_mib);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_is_at_least_what_the_listed_processes_hold() {
        let gpu = |used| GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "fake".into(),
            utilization: 0,
            memory_used_mib: used,
            memory_total_mib: 32_607,
            memory_free_mib: 32_607 - used,
            temperature: 40,
            power_draw: 20.0,
        };
        let ollama = GpuProcess {
            pid: 7,
            used_memory_mib: 20_000,
            ..GpuProcess::default()
        };
        // A torn sample: the process is listed, the device total does not count it yet.
        let mut gpus = vec![gpu(512)];
        reconcile(&mut gpus, std::slice::from_ref(&ollama));
        assert_eq!(
            (gpus[0].memory_used_mib, gpus[0].memory_free_mib),
            (20_000, 12_607)
        );
        // A device total that already counts it (and more) is left alone.
        let mut gpus = vec![gpu(21_000)];
        reconcile(&mut gpus, std::slice::from_ref(&ollama));
        assert_eq!(gpus[0].memory_used_mib, 21_000);
        // Processes on another GPU do not count.
        let elsewhere = GpuProcess {
            gpu_index: 1,
            ..ollama
        };
        let mut gpus = vec![gpu(512)];
        reconcile(&mut gpus, &[elsewhere]);
        assert_eq!(gpus[0].memory_used_mib, 512);
    }
}
