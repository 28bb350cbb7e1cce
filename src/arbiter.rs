//! The arbiter: the single owner of every grant of the GPU. Speech jobs, service starts and leases
//! are all requests to one queue (`queue.rs`); a grant that needs memory makes room the same way
//! (idle residents unloaded, teardown verified); an exclusive holder's memory must verifiably come
//! back (`teardown.rs`) before the next holder is granted; and a background loop expires leases,
//! stops idle services, stops an idle service the queue is waiting on, and reloads residents.

pub mod footprints;
pub mod history;
pub mod leases;
mod lingering;
mod loading;
pub mod queue;
mod residents;
mod room;
pub mod services;
pub mod sharing;
pub mod teardown;
pub mod watched;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ArbiterConfig, Config, Mode, WatchConfig};
use crate::gpu::{GpuMonitor, Snapshot};
use crate::supervisor::Supervisor;
use crate::worker::WorkerState;
use footprints::Footprints;
use leases::Leases;
use queue::GpuQueue;
use services::Services;

/// What every part of the arbiter shares.
pub struct Core {
    pub config: ArbiterConfig,
    pub queue: Arc<GpuQueue>,
    pub supervisor: Arc<Supervisor>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    observed: bool,
    pub device: u32,
    /// Residents the arbiter unloaded to make room; reloaded when the GPU is free again.
    /// std Mutex: a few instructions, never across `.await`.
    unloaded: Mutex<BTreeSet<String>>,
    /// Residents unloaded whose memory no sample has shown back yet (see `lingering`).
    /// std Mutex: map reads and updates, never across `.await`.
    lingering: Mutex<lingering::Lingering>,
    pub http: reqwest::Client,
    /// Configured and measured VRAM of every worker and service.
    pub footprints: Arc<Footprints>,
    /// `[[gpu.watch]]` programs: held for while they load, asked to free their memory when
    /// they have a `release`.
    watches: Vec<WatchConfig>,
    /// Where service actors say which process group is theirs (for `/status`).
    pub service_pids: Arc<crate::gpu::ServicePids>,
    /// Teardowns that blocked the queue so far: each block's key.
    teardowns: std::sync::atomic::AtomicU64,
    /// What the samples told of each watched program (see `hold_while_loading`).
    /// std Mutex: a few instructions, never across `.await`.
    loading: Mutex<BTreeMap<String, loading::Seen>>,
}

pub struct Arbiter {
    /// One per arbitrated GPU.
    pub cores: Vec<Arc<Core>>,
    /// Index of `[gpu] device`'s core in `cores`.
    main: usize,
    pub leases: Leases,
    pub services: Services,
    /// The background loop; taken once on shutdown. std Mutex, never held across `.await`.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Core {
    /// Why this device must read busy whatever the sample shows: a grant (a service, a lease,
    /// a speech job on this GPU: a one-shot worker granted the GPU has not touched it yet, and
    /// a script that starts vLLM on `idle` would start it beside the worker), memory a holder
    /// left behind (a watched program that loads reads `loading` as sampled). A job on the CPU
    /// takes no part of the GPU and leaves it idle.
    pub fn busy_reason(&self) -> Option<String> {
        self.reason(|h| !h.on_cpu)
    }

    /// Why nothing may load on this device now: what [`Core::busy_reason`] says less the
    /// speech jobs (they share the GPU with jobs, and a resident loads beside them).
    pub fn held_reason(&self) -> Option<String> {
        self.reason(|h| h.kind != queue::HolderKind::Job)
    }

    fn reason(&self, counts: impl Fn(&queue::HolderView) -> bool) -> Option<String> {
        if let Some(why) = self.queue.blocked_on_memory() {
            return Some(why);
        }
        let mut held: Vec<String> = Vec::new();
        for holder in self.queue.holders().into_iter().filter(|h| counts(h)) {
            // Several jobs at once: "speech job" once.
            if !held.contains(&holder.label) {
                held.push(holder.label);
            }
        }
        (!held.is_empty()).then(|| format!("the GPU is granted to {}", held.join(", ")))
    }

    /// The worker statuses of the residents on this core's device.
    fn device_workers(&self) -> Vec<crate::worker::WorkerStatus> {
        let mut all = self.supervisor.statuses();
        all.retain(|s| s.device == self.device);
        all
    }

    /// The latest sample.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshots.borrow())
    }

    /// Free memory of the device in the latest sample (`None` without a GPU backend).
    pub fn free_mib(&self) -> Option<u64> {
        self.snapshot()
            .gpus
            .iter()
            .find(|g| g.index == self.device)
            .map(|g| g.memory_free_mib)
    }

    /// Used memory of the device in the latest sample.
    pub fn used_mib(&self) -> Option<u64> {
        self.snapshot()
            .gpus
            .iter()
            .find(|g| g.index == self.device)
            .map(|g| g.memory_used_mib)
    }

    /// With `share = "vram"`: the processes on the device, as last sampled, for a holder that
    /// starts now (see [`teardown::Gone::listed_before`]); `None` when holders never share.
    pub fn listed_before(&self) -> Option<Vec<u32>> {
        let snap = self.queue.shares_vram().then(|| self.snapshot())?;
        let on_device = snap.processes.iter().filter(|p| p.gpu_index == self.device);
        Some(on_device.map(|p| p.pid).collect())
    }

    /// The device's whole memory, as last sampled.
    pub fn total_mib(&self) -> Option<u64> {
        self.room().map(|r| r.total_mib).filter(|&t| t > 0)
    }

    /// The device's memory and the residents' footprints, for `share = "vram"`.
    fn room(&self) -> Option<sharing::Room> {
        let snap = self.snapshot();
        let gpu = snap.gpus.iter().find(|g| g.index == self.device)?;
        let (mut loaded, mut unloaded) = (0u64, 0u64);
        for status in self.device_workers() {
            // A resident that said it runs on the CPU takes none of the GPU's memory, whatever
            // its configured `vram_mib` (set for when it runs a CUDA engine).
            if status.mode != Mode::Resident || status.runs_on_cpu() {
                continue;
            }
            let mib = self
                .footprints
                .need(&worker_key(&status.name), status.vram_mib)
                .unwrap_or(0);
            // Stopped processes of it whose memory may still be in use.
            loaded = loaded.saturating_add(mib.saturating_mul(self.lingering(&status)));
            match status.state {
                WorkerState::Unloaded => unloaded += mib,
                _ => loaded += mib,
            }
        }
        Some(sharing::Room {
            total_mib: gpu.memory_total_mib,
            free_mib: gpu.memory_free_mib,
            residents_mib: loaded,
            unloaded_residents_mib: unloaded,
        })
    }
}

impl Arbiter {
    /// Starts the arbiter over `queues` (one per arbitrated device; `main` is `[gpu] device`'s,
    /// where speech jobs queue).
    pub fn start(
        config: &Config,
        queues: &[Arc<GpuQueue>],
        main: &Arc<GpuQueue>,
        supervisor: Arc<Supervisor>,
        gpu: &GpuMonitor,
    ) -> Arc<Arbiter> {
        let footprints = Arc::new(Footprints::load(Some(
            config.state_dir().join("footprints.json"),
        )));
        // Release calls and health polls go to programs on this machine: never through a proxy
        // from the environment (`HTTP_PROXY` answered them for a service that was down).
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .unwrap_or_default();
        let watches: Vec<WatchConfig> = config.gpu.watch.clone();
        let cores: Vec<Arc<Core>> = queues
            .iter()
            .map(|queue| {
                let core = Arc::new(Core {
                    config: config.arbiter.clone(),
                    queue: Arc::clone(queue),
                    supervisor: Arc::clone(&supervisor),
                    snapshots: gpu.subscribe(),
                    observed: gpu.observed(),
                    device: queue.device,
                    unloaded: Mutex::new(BTreeSet::new()),
                    lingering: Mutex::default(),
                    http: http.clone(),
                    footprints: Arc::clone(&footprints),
                    watches: watches.clone(),
                    service_pids: Arc::clone(&gpu.services),
                    teardowns: Default::default(),
                    loading: Default::default(),
                });
                core.queue.set_room(sharing::RoomSource(Box::new({
                    let core = Arc::downgrade(&core);
                    move || core.upgrade().and_then(|c| c.room())
                })));
                core
            })
            .collect();
        let main = cores
            .iter()
            .position(|c| Arc::ptr_eq(&c.queue, main))
            .expect("the main queue is one of the queues");
        let services = Services::start(config, &cores, &cores[main]);
        let arbiter = Arc::new(Arbiter {
            leases: Leases::new(cores.clone(), main),
            services,
            cores,
            main,
            task: Mutex::new(None),
        });
        let task = tokio::spawn(Arc::clone(&arbiter).run());
        *arbiter.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        arbiter
    }

    /// The core of `[gpu] device`.
    pub fn core(&self) -> &Arc<Core> {
        &self.cores[self.main]
    }

    /// The core of `device`, when it is arbitrated.
    pub fn core_for(&self, device: u32) -> Option<&Arc<Core>> {
        self.cores.iter().find(|c| c.device == device)
    }

    /// Why `/status` must say busy whatever the sample shows: an exclusive grant, or a block.
    pub fn busy_reason(&self) -> Option<String> {
        self.core().busy_reason()
    }

    /// Stops the services and the loop (leases end with the process).
    pub async fn stop(&self) {
        for core in &self.cores {
            core.queue.close();
        }
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
        self.services.stop_all().await;
    }

    async fn run(self: Arc<Self>) {
        let mut changes: Vec<watch::Receiver<u64>> =
            self.cores.iter().map(|c| c.queue.changes()).collect();
        let mut snapshots = self.core().snapshots.clone();
        loop {
            tokio::select! {
                _ = futures_util::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed()))) => {}
                Ok(()) = snapshots.changed() => {
                    let snap = Arc::clone(&snapshots.borrow_and_update());
                    self.core().queue.history.sample(&snap, |device| {
                        self.core_for(device).map_or(0, |c| c.queue.waiting())
                    });
                    for core in &self.cores {
                        core.hold_while_loading(&snap);
                        core.track_unloads(&snap);
                        core.queue.redispatch();
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            self.leases.expire();
            self.services.stop_idle();
            for core in &self.cores {
                core.expire_loading();
                if let Some(head) = core.queue.head() {
                    if core.queue.head_waits_for_room() && !core.unload_for_head() {
                        self.services.yield_to(core.device, &head.label);
                    }
                }
                if core.track_unloads(&core.snapshot()) {
                    core.queue.redispatch();
                }
                core.observe_workers();
                core.reload_if_free();
                core.unload_idle_residents();
            }
        }
    }
}

/// The footprint file's key for a worker.
pub fn worker_key(name: &str) -> String {
    format!("worker {name}")
}
