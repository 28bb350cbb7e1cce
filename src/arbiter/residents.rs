//! Resident workers on one GPU: which were unloaded to make room, bringing them back when the GPU
//! is free, watching their measured footprints, and the keep-alive unload of idle ones.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Mode, Reload};
use crate::worker::WorkerState;

use super::queue::Freed;
use super::{history, worker_key, Core};

impl Core {
    pub(super) fn lock_unloaded(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.unloaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Residents unloaded by the arbiter come back once no exclusive holder has or wants the GPU:
    /// all of them with `reload = "eager"`, else those that were failing when they were
    /// unloaded (their restarts were paused for the holder; nothing else would resume them).
    pub(super) fn reload_if_free(&self) {
        if self.queue.exclusive_held() {
            return;
        }
        if self.queue.head().is_some_and(|t| t.exclusive()) || self.queue.blocked().is_some() {
            return;
        }
        let eager = self.config.reload == Reload::Eager;
        let failing = |name: &String| {
            self.supervisor
                .get(name)
                .is_some_and(|h| h.status().state == WorkerState::Exited)
        };
        let names: Vec<String> = {
            let mut unloaded = self.lock_unloaded();
            let names: Vec<String> = unloaded
                .iter()
                .filter(|n| eager || failing(n))
                .cloned()
                .collect();
            for name in &names {
                unloaded.remove(name);
            }
            names
        };
        for name in names {
            if let Some(handle) = self.supervisor.get(&name) {
                tracing::info!(worker = %name, "reloading after the GPU was released");
                let asked = std::time::Instant::now();
                handle.load();
                let event = self.queue.history.begin_event(
                    self.device,
                    history::GrantKind::Reload,
                    &format!("worker {name}"),
                );
                let (queue, handle) = (Arc::clone(&self.queue), handle.clone());
                tokio::spawn(async move {
                    handle
                        .wait_for_state(|s| match s.state {
                            WorkerState::Starting | WorkerState::Unloaded => false,
                            // Failing before it was asked: its answer is the next failure.
                            WorkerState::Exited => s.state_since >= asked,
                            _ => true,
                        })
                        .await;
                    queue.history.end_event(event);
                });
            }
        }
    }

    /// Measures the workers' memory while they load and while loaded (their peaks become their
    /// footprints: a model may take most while it loads).
    pub(super) fn observe_workers(&self) {
        let snap = self.snapshot();
        if snap.taken.is_none() {
            return;
        }
        for status in self.device_workers() {
            let up = matches!(
                status.state,
                WorkerState::Starting | WorkerState::Ready | WorkerState::Busy
            );
            if let (Some(pid), true) = (status.pid, up) {
                let owner = super::footprints::Owner::Worker {
                    pgid: pid,
                    name: &status.name,
                };
                self.footprints
                    .observe(&worker_key(&status.name), owner, self.device, &snap);
            }
        }
    }

    /// `share = "vram"`: when the first waiter for this GPU (a lease or a service) would be
    /// granted beside its holders were some idle residents unloaded, unloads them (the largest
    /// first, as few as do; in the background, each teardown checked) and says so: no service is
    /// stopped for that waiter, and a lease beside another does not wait for that one to end.
    /// Whether it is under way (then nothing else makes room for the waiter meanwhile; bounded
    /// by the teardown timeout).
    pub(super) fn unload_for_head(self: &Arc<Self>) -> bool {
        use std::sync::atomic::Ordering;
        if self.queue.unloading_for_head.load(Ordering::SeqCst) {
            return true;
        }
        let snap = self.snapshot();
        let used_by = |name: &str| -> u64 {
            snap.processes
                .iter()
                .filter(|p| p.gpu_index == self.device && p.worker.as_deref() == Some(name))
                .map(|p| p.used_memory_mib)
                .fold(0, u64::saturating_add)
        };
        let mut idle: Vec<(String, u64)> = self
            .device_workers()
            .into_iter()
            .filter(|s| {
                s.mode == Mode::Resident && s.state == WorkerState::Ready && !s.runs_on_cpu()
            })
            .map(|s| {
                let mib = self
                    .footprints
                    .need(&worker_key(&s.name), s.vram_mib)
                    .unwrap_or(0);
                (s.name, mib)
            })
            .filter(|(_, mib)| *mib > 0)
            .collect();
        idle.sort_by_key(|(_, mib)| std::cmp::Reverse(*mib));
        let mut freed = Freed::default();
        let mut chosen = Vec::new();
        for (name, mib) in idle {
            freed.footprint_mib = freed.footprint_mib.saturating_add(mib);
            freed.used_mib = freed.used_mib.saturating_add(used_by(&name));
            chosen.push(name);
            if self.queue.head_fits_if_freed(freed) {
                break;
            }
        }
        if chosen.is_empty() || !self.queue.head_fits_if_freed(freed) {
            return false;
        }
        self.queue.unloading_for_head.store(true, Ordering::SeqCst);
        // A worker a job reached first unloads after its task: the wait is bounded, and the
        // flag is cleared however the task ends.
        let limit = Duration::from_secs_f64(self.config.teardown_timeout_s + 10.0)
            * u32::try_from(chosen.len()).unwrap_or(u32::MAX);
        let core = Arc::clone(self);
        tokio::spawn(async move {
            let _clear = ClearOnDrop(&core.queue.unloading_for_head);
            let unload = async {
                for name in chosen {
                    tracing::info!(worker = %name, "unloading an idle resident: the first waiter fits beside the GPU's holders without it");
                    if let Err(why) = core.unload_resident(&name, &|_| {}).await {
                        tracing::warn!(worker = %name, %why, "making room for the first waiter");
                        break;
                    }
                }
            };
            if tokio::time::timeout(limit, unload).await.is_err() {
                tracing::warn!("residents unloaded for the first waiter took too long; given up");
            }
            core.queue.redispatch();
        });
        true
    }

    /// Unloads residents idle longer than `idle_unload_after_s` (they reload at the next job).
    pub(super) fn unload_idle_residents(&self) {
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

/// Clears its flag when dropped (a task's end, however it ends).
struct ClearOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}
