//! The arbiter: the single owner of every grant of the GPU. Speech jobs, service starts and leases
//! are all requests to one queue (`queue.rs`); a grant that needs memory makes room the same way
//! (idle residents unloaded, teardown verified); an exclusive holder's memory must verifiably come
//! back (`teardown.rs`) before the next holder is granted; and a background loop expires leases,
//! stops idle services, stops an idle service the queue is waiting on, and reloads residents.

pub mod footprints;
pub mod history;
pub mod leases;
pub mod queue;
pub mod services;
pub mod sharing;
pub mod teardown;
pub mod watched;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ArbiterConfig, Config, Mode, Reload, WatchConfig};
use crate::gpu::{GpuMonitor, Snapshot};
use crate::protocol::GrantEvent;
use crate::supervisor::Supervisor;
use crate::worker::WorkerState;
use footprints::Footprints;
use leases::Leases;
use queue::{GpuQueue, HolderKind};
use services::Services;
use teardown::Gone;

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
    pub http: reqwest::Client,
    /// Configured and measured VRAM of every worker and service.
    pub footprints: Arc<Footprints>,
    /// `[[gpu.watch]]` servers that can be asked to free their memory.
    watches: Vec<WatchConfig>,
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
    /// Why this device must read busy whatever the sample shows: an exclusive grant, a block.
    pub fn busy_reason(&self) -> Option<String> {
        if let Some(why) = self.queue.blocked() {
            return Some(why);
        }
        let held: Vec<String> = self
            .queue
            .holders()
            .into_iter()
            .filter(|h| h.kind != HolderKind::Job)
            .map(|h| h.label)
            .collect();
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

    /// The device's memory and the residents' footprints, for `share = "vram"`.
    fn room(&self) -> Option<sharing::Room> {
        let snap = self.snapshot();
        let gpu = snap.gpus.iter().find(|g| g.index == self.device)?;
        let (mut loaded, mut unloaded) = (0, 0);
        for status in self.device_workers() {
            if status.mode != Mode::Resident {
                continue;
            }
            let mib = self
                .footprints
                .need(&worker_key(&status.name), status.vram_mib)
                .unwrap_or(0);
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

    /// Waits for `gone` (see `teardown::verify`) with the configured deadline and tolerance.
    pub async fn verify_teardown(&self, gone: &Gone) -> Result<(), String> {
        teardown::verify(
            self.snapshots.clone(),
            self.observed,
            self.device,
            gone,
            self.config.teardown_tolerance_mib,
            Duration::from_secs_f64(self.config.teardown_timeout_s),
        )
        .await
    }

    /// After a teardown that never completed: block the queue (nothing is granted; `/status`
    /// says busy with the reason) until a later sample shows the memory back.
    pub fn block_until_freed(self: &Arc<Self>, gone: Gone, reason: String) {
        tracing::error!(%reason, "GPU blocked: teardown not verified");
        self.queue.block(reason);
        let core = Arc::clone(self);
        tokio::spawn(async move {
            let mut snapshots = core.snapshots.clone();
            loop {
                if snapshots.changed().await.is_err() {
                    return;
                }
                let snap = Arc::clone(&snapshots.borrow_and_update());
                if teardown::check(
                    &snap,
                    core.device,
                    &gone,
                    core.config.teardown_tolerance_mib,
                )
                .is_ok()
                {
                    tracing::info!(what = %gone.what, "memory came back; GPU unblocked");
                    core.queue.unblock();
                    return;
                }
            }
        });
    }

    /// Makes room for a grant that needs `need_mib` (everything when unknown): idle resident
    /// workers are unloaded, each teardown verified, until enough is free. Called by an exclusive
    /// holder, so no job runs meanwhile.
    pub async fn make_room(
        &self,
        need_mib: Option<u64>,
        notify: &(dyn Fn(GrantEvent) + Send + Sync),
    ) -> Result<(), String> {
        if self.queue.holders().len() > 1 {
            // Granted beside others (`share = "vram"`): the queue found it fits as things are,
            // and nobody is unloaded under a holder's feet.
            return Ok(());
        }
        let enough = |core: &Core| match (need_mib, core.free_mib()) {
            (Some(need), Some(free)) => free >= need,
            (_, None) => false,
            (None, Some(_)) => false,
        };
        for status in self.device_workers() {
            if enough(self) {
                return Ok(());
            }
            let resident_up = status.mode == Mode::Resident
                && matches!(
                    status.state,
                    WorkerState::Ready | WorkerState::Starting | WorkerState::Exited
                );
            if !resident_up {
                continue;
            }
            let Some(handle) = self.supervisor.get(&status.name) else {
                continue;
            };
            notify(GrantEvent::MakingRoom {
                action: "unload".into(),
                target: format!("worker {}", status.name),
            });
            let before = Instant::now();
            let event = self.queue.history.begin_event(
                self.device,
                history::GrantKind::Unload,
                &format!("worker {}", status.name),
            );
            let pid = handle.unload().await;
            self.lock_unloaded().insert(status.name.clone());
            if let Some(pid) = pid {
                let gone = Gone {
                    what: format!("worker {}", status.name),
                    pids: vec![pid],
                    pgid: Some(pid),
                    baseline_used_mib: None,
                    watch: None,
                    after: before,
                };
                let verified = self.verify_teardown(&gone).await;
                self.queue.history.end_event(event);
                verified?;
            } else {
                self.queue.history.end_event(event);
            }
        }
        for watch in &self.watches {
            if enough(self) {
                return Ok(());
            }
            self.release_watch(watch, notify).await?;
        }
        match (need_mib, self.free_mib()) {
            (Some(need), Some(free)) if free < need => Err(format!(
                "{need} MiB are needed but only {free} MiB are free after unloading every idle worker{}; {}",
                if self.watches.is_empty() { "" } else { " and releasing every watched server" },
                self.memory_holders()
            )),
            _ => Ok(()),
        }
    }

    /// Asks a watched server holding memory on the device to free it, then verifies it did.
    async fn release_watch(
        &self,
        watch: &WatchConfig,
        notify: &(dyn Fn(GrantEvent) + Send + Sync),
    ) -> Result<(), String> {
        let Some(how) = &watch.release else {
            return Ok(());
        };
        let holds = self.snapshot().processes.iter().any(|p| {
            p.gpu_index == self.device
                && p.used_memory_mib > 0
                && p.watch.as_deref() == Some(watch.name.as_str())
        });
        if !holds {
            return Ok(());
        }
        notify(GrantEvent::MakingRoom {
            action: "release".into(),
            target: format!("watched {}", watch.name),
        });
        let event = self.queue.history.begin_event(
            self.device,
            history::GrantKind::Unload,
            &format!("watched {}", watch.name),
        );
        let before = Instant::now();
        let released = watched::release(&self.http, how).await;
        let verified = match released {
            Ok(what) => {
                tracing::info!(watch = %watch.name, released = ?what, "asked a watched server to free its memory");
                let gone = Gone {
                    what: format!("watched {}", watch.name),
                    pids: Vec::new(),
                    pgid: None,
                    baseline_used_mib: None,
                    watch: Some(watch.name.clone()),
                    after: before,
                };
                self.verify_teardown(&gone).await
            }
            Err(e) => Err(format!("the release call to {} failed: {e}", watch.name)),
        };
        self.queue.history.end_event(event);
        verified
    }

    fn memory_holders(&self) -> String {
        let snap = self.snapshot();
        let holders: Vec<String> = snap
            .processes
            .iter()
            .filter(|p| p.gpu_index == self.device)
            .map(|p| format!("pid {} ({} MiB)", p.pid, p.used_memory_mib))
            .collect();
        if holders.is_empty() {
            "no process is listed on the GPU".into()
        } else {
            format!("held by {}", holders.join(", "))
        }
    }

    fn lock_unloaded(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.unloaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Residents unloaded by the arbiter come back once no exclusive holder has or wants the GPU.
    fn reload_if_free(&self) {
        if self.config.reload != Reload::Eager || self.queue.exclusive_held() {
            return;
        }
        if self.queue.head().is_some_and(|t| t.exclusive()) || self.queue.blocked().is_some() {
            return;
        }
        let names = std::mem::take(&mut *self.lock_unloaded());
        for name in names {
            if let Some(handle) = self.supervisor.get(&name) {
                tracing::info!(worker = %name, "reloading after the GPU was released");
                handle.load();
                let event = self.queue.history.begin_event(
                    self.device,
                    history::GrantKind::Reload,
                    &format!("worker {name}"),
                );
                let (queue, handle) = (Arc::clone(&self.queue), handle.clone());
                tokio::spawn(async move {
                    handle
                        .wait_for_state(|s| {
                            s.state != WorkerState::Starting && s.state != WorkerState::Unloaded
                        })
                        .await;
                    queue.history.end_event(event);
                });
            }
        }
    }

    /// Measures the loaded workers' memory (their peaks become their footprints).
    fn observe_workers(&self) {
        let snap = self.snapshot();
        if snap.taken.is_none() {
            return;
        }
        for status in self.device_workers() {
            if let (Some(pid), WorkerState::Ready | WorkerState::Busy) = (status.pid, status.state)
            {
                self.footprints
                    .observe(&worker_key(&status.name), pid, self.device, &snap);
            }
        }
    }

    /// Unloads residents idle longer than `idle_unload_after_s` (they reload at the next job).
    fn unload_idle_residents(&self) {
        if self.config.idle_unload_after_s <= 0.0 {
            return;
        }
        let limit = Duration::from_secs_f64(self.config.idle_unload_after_s);
        for status in self.device_workers() {
            if status.mode == Mode::Resident
                && status.state == WorkerState::Ready
                && status.state_since.elapsed() >= limit
            {
                if let Some(handle) = self.supervisor.get(&status.name).cloned() {
                    tracing::info!(worker = %status.name, "unloading a worker idle for idle_unload_after_s");
                    let event = self.queue.history.begin_event(
                        self.device,
                        history::GrantKind::Unload,
                        &format!("worker {}", status.name),
                    );
                    let queue = Arc::clone(&self.queue);
                    tokio::spawn(async move {
                        handle.unload().await;
                        queue.history.end_event(event);
                    });
                }
            }
        }
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
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        let watches: Vec<WatchConfig> = config
            .gpu
            .watch
            .iter()
            .filter(|w| w.release.is_some())
            .cloned()
            .collect();
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
                    http: http.clone(),
                    footprints: Arc::clone(&footprints),
                    watches: watches.clone(),
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
                        core.queue.redispatch();
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
            self.leases.expire();
            self.services.stop_idle();
            for core in &self.cores {
                if let Some(head) = core.queue.head() {
                    self.services.yield_to(core.device, &head.label);
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
