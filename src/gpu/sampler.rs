//! The background sampler and the snapshot it publishes. Requests read the snapshot (a `watch`
//! borrow: no `.await`, no driver call, no GPU lock); staleness is judged when it is read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::decision::WatchState;
use super::error::SampleError;
use super::procfs::ProcFs;
use super::{
    Backend, BackendReport, Decision, DecisionInput, GpuInfo, GpuProcess, Judge, RawSample,
    ServicePids, Unmeasured,
};
use crate::config::{Config, WatchConfig};
use crate::supervisor::Supervisor;

mod describe;
mod view;
mod watched;
use super::hop::Hop;
use describe::{describe, reconcile, undescribed, Owners};
pub use view::{GpuHealth, StatusView};

/// One published sample with its verdict.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Option<Instant>,
    pub taken_wall: Option<SystemTime>,
    pub gpus: Vec<GpuInfo>,
    /// GPUs listed without memory figures.
    pub unmeasured: Vec<Unmeasured>,
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
            unmeasured: Vec::new(),
            processes: Vec::new(),
            watched: Vec::new(),
            error: None,
            decision: Decision::Unknown,
            reason: reason.into(),
        }
    }
}

pub struct GpuMonitor {
    snapshot: watch::Receiver<Arc<Snapshot>>,
    pub report: BackendReport,
    stale_after: Duration,
    device: u32,
    /// The running services' process groups, written by their actors.
    pub services: Arc<ServicePids>,
    /// Taken once on shutdown; std Mutex, never held across `.await`.
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

struct Sampler {
    backend: Backend,
    procfs: ProcFs,
    /// Runs the `/proc` reads of each sample, bounded.
    hop: Hop,
    watch: Vec<WatchConfig>,
    judge: Judge,
    supervisor: Arc<Supervisor>,
    services: Arc<ServicePids>,
    http: reqwest::Client,
    device: u32,
    /// `[gpu.status] hide_commands`: command lines are matched against the watch patterns,
    /// then dropped from the snapshot, so no reader (`/status`, a teardown's reason) has them.
    hide_commands: bool,
}

impl GpuMonitor {
    /// Picks the backend, logs why, and starts sampling.
    pub fn start(config: &Config, supervisor: Arc<Supervisor>) -> GpuMonitor {
        let st = &config.gpu.status;
        let (backend, report) = Backend::select(st);
        match &report.path {
            Some(path) => {
                tracing::info!(backend = report.active, %path, unavailable = %unavailable(&report), "GPU status backend")
            }
            // Chosen (`backend = "none"`, and every one-shot command) is no news.
            None if st.backend == crate::config::GpuBackendChoice::None => {
                tracing::debug!("GPU status backend: none, as configured")
            }
            None => {
                tracing::warn!(unavailable = %unavailable(&report), "no GPU status backend: /status will read unknown")
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
        let services = Arc::new(ServicePids::default());
        let task = (!matches!(backend, Backend::None)).then(|| {
            let proc_root = config.resolve(&st.proc_root);
            let sampler = Sampler {
                backend,
                hop: Hop::new(
                    format!("reading {}/", proc_root.display()),
                    "(a process stuck in the kernel?): GPU processes cannot be told apart",
                    Duration::from_secs_f64(st.timeout_s),
                ),
                procfs: ProcFs::new(proc_root),
                watch: config.gpu.watch.clone(),
                judge: Judge::new(
                    st.idle_utilization_pct,
                    st.idle_memory_mib,
                    Duration::from_secs_f64(st.quiet_period_s),
                ),
                supervisor,
                services: Arc::clone(&services),
                // Watched programs' health, on this machine: never through a proxy.
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(1))
                    .no_proxy()
                    .build()
                    .unwrap_or_default(),
                device,
                hide_commands: st.hide_commands,
            };
            tokio::spawn(sampler.run(tx, Duration::from_secs_f64(st.interval_s)))
        });
        GpuMonitor {
            snapshot: rx,
            report,
            stale_after: Duration::from_secs_f64(st.stale_after_s),
            device,
            services,
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
}

/// The backends that could not be used, each in a phrase, for a log line.
fn unavailable(report: &BackendReport) -> String {
    let why: Vec<String> = report.unavailable.iter().map(|u| u.summary()).collect();
    why.join("; ")
}

impl Sampler {
    async fn run(mut self, tx: watch::Sender<Arc<Snapshot>>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let raw = self.backend.sample().await;
            // A fault on one odd sample must not end sampling: /status would say "no sample
            // yet" for good. This sample reads unknown, the next is tried as usual.
            let built = std::panic::AssertUnwindSafe(self.build(raw))
                .catch_unwind()
                .await;
            let snapshot = built.unwrap_or_else(|_| {
                tracing::error!("the GPU sampler failed on a sample; sampling goes on");
                let mut failed = Snapshot::empty("the GPU sample could not be read");
                failed.error =
                    Some("the sampler failed on this sample (see the server log)".into());
                failed
            });
            if tx.send(Arc::new(snapshot)).is_err() {
                return;
            }
        }
    }

    async fn build(&mut self, raw: Result<RawSample, SampleError>) -> Snapshot {
        let now = Instant::now();
        let (raw, mut error) = match raw {
            Ok(raw) => (raw, None),
            Err(e) => (RawSample::default(), Some(e.to_string())),
        };
        // Another GPU without memory figures is only listed; the configured one cannot be
        // judged without them.
        if let Some(device) = raw.unmeasured.iter().find(|u| u.index == self.device) {
            error.get_or_insert(device.why.clone());
        }
        let worker_pids: HashMap<u32, String> = self
            .supervisor
            .statuses()
            .into_iter()
            .filter_map(|s| Some((s.pid?, s.name)))
            .collect();
        let service_pids = self.services.current();
        let owners = Owners {
            workers: &worker_pids,
            services: &service_pids,
        };
        // `/proc` reads can block (a process stuck in the kernel): off the runtime threads, in
        // one bounded hop per sample.
        let (procfs, watch, listed) = (
            self.procfs.clone(),
            self.watch.clone(),
            raw.processes.clone(),
        );
        let (workers, services) = (worker_pids.clone(), service_pids.clone());
        let read = self
            .hop
            .run(move || {
                let patterns: Vec<&str> = watch.iter().map(|w| w.pattern.as_str()).collect();
                let found = procfs.find(&patterns, std::process::id());
                let owners = Owners {
                    workers: &workers,
                    services: &services,
                };
                (describe(&procfs, &watch, &owners, &listed), found)
            })
            .await;
        let (mut processes, found) = match read {
            Ok(read) => read,
            // Which process is a loading service cannot be told without command lines: the
            // sample reads unknown, its processes are listed as the backend gives them.
            Err(e) => {
                error.get_or_insert(e.to_string());
                (
                    undescribed(&owners, &raw.processes),
                    vec![Vec::new(); self.watch.len()],
                )
            }
        };
        if self.hide_commands {
            for p in &mut processes {
                p.command.clear();
                p.command_note = None;
            }
        }
        let watched = self.watched(&processes, found).await;
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
            unmeasured: raw.unmeasured,
            processes,
            watched,
            error,
            decision,
            reason,
        }
    }
}

#[cfg(test)]
mod tests;
