//! Making room on one GPU: a grant that needs memory unloads idle residents, then asks watched
//! servers (Ollama …) to release theirs, each followed by the teardown check; and the block that
//! keeps anything else from being granted while a holder's memory does not come back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Mode, WatchConfig};
use crate::protocol::GrantEvent;
use crate::worker::WorkerState;

use super::queue::Block;
use super::teardown::{self, Gone};
use super::{history, watched, Core};

impl Core {
    /// Waits for `gone` (see `teardown::verify`) with the configured deadline and tolerance,
    /// or until the queue closes: at shutdown nothing is granted after it, and waiting (up to
    /// `teardown_timeout_s`) for memory that may never come back only kept gpuhost past its
    /// service manager's stop timeout. What left the holder's group, the orphan guard and the
    /// sweep before exit take.
    pub async fn verify_teardown(&self, gone: &Gone) -> Result<(), String> {
        let verified = teardown::verify(
            self.snapshots.clone(),
            self.observed,
            self.device,
            gone,
            self.config.teardown_tolerance_mib,
            Duration::from_secs_f64(self.config.teardown_timeout_s),
        );
        let mut changes = self.queue.changes();
        let closed = async {
            while !self.queue.is_closed() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            verified = verified => verified,
            () = closed => Ok(()),
        }
    }

    /// Whether the latest sample already shows `gone` done: a sample taken after `gone.after`
    /// (which a lease sets to when its program ended, as it is told, else to its grant: its
    /// end is not gpuhost's doing, and a program mostly ends before its lease does).
    pub fn seen_gone(&self, gone: &Gone) -> bool {
        let snapshot = self.snapshot();
        !self.observed
            || (snapshot.taken.is_some_and(|t| t > gone.after)
                && teardown::check(
                    &snapshot,
                    self.device,
                    gone,
                    self.config.teardown_tolerance_mib,
                )
                .is_ok())
    }

    /// After a teardown that never completed: block the queue (nothing is granted; `/status`
    /// says busy with the reason) until a later sample shows the memory back, which the
    /// receiver hears (with when).
    pub fn block_until_freed(
        self: &Arc<Self>,
        gone: Gone,
        reason: String,
    ) -> tokio::sync::oneshot::Receiver<Instant> {
        let (freed, heard) = tokio::sync::oneshot::channel();
        tracing::error!(%reason, "GPU blocked: teardown not verified");
        let n = self
            .teardowns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let block = Block::Teardown(n);
        self.queue.block(block.clone(), reason);
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
                    core.queue.unblock(&block);
                    let _ = freed.send(Instant::now());
                    return;
                }
            }
        });
        heard
    }

    /// Makes room for a grant that needs `need_mib` (everything when unknown): idle resident
    /// workers are unloaded (not those that said they run on the CPU), each teardown verified,
    /// until enough is free. Called by an exclusive
    /// holder, so no job runs meanwhile.
    pub async fn make_room(
        &self,
        need_mib: Option<u64>,
        notify: &(dyn Fn(GrantEvent) + Send + Sync),
    ) -> Result<(), String> {
        if self.queue.gpu_holders() > 1 {
            // Granted beside others (`share = "vram"`): the queue found it fits as things are,
            // and nobody is unloaded under a holder's feet.
            return Ok(());
        }
        // A GPU whose sample failed cannot tell what is free, nor when an unloaded worker's
        // memory is back: unloading for it only fails later, with the residents gone. (A
        // sample whose process reads alone failed still has the memory figures.)
        let snapshot = self.snapshot();
        let unmeasured = snapshot.taken.is_some() || snapshot.error.is_some();
        if self.observed && unmeasured && self.free_mib().is_none() {
            return Err(format!(
                "the GPU's status is unknown ({}): gpuhost cannot tell what memory is free, so \
                 nothing was unloaded; /status says more",
                snapshot.error.as_deref().unwrap_or("no sample of this GPU")
            ));
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
            // One that said it runs on the CPU frees nothing here: unloaded, it only cost its
            // next job the load.
            if !resident_up || status.runs_on_cpu() {
                continue;
            }
            self.unload_resident(&status.name, notify).await?;
        }
        let releasable: Vec<&WatchConfig> = self
            .watches
            .iter()
            .filter(|w| w.release.is_some())
            .collect();
        for watch in &releasable {
            if enough(self) {
                return Ok(());
            }
            self.release_watch(watch, notify).await?;
        }
        match (need_mib, self.free_mib()) {
            (Some(need), Some(free)) if free < need => Err(format!(
                "{need} MiB are needed but only {free} MiB are free after unloading every idle worker on the GPU{}; {}",
                if releasable.is_empty() { "" } else { " and releasing every watched server" },
                self.memory_holders()
            )),
            _ => Ok(()),
        }
    }

    /// Unloads resident `name` to make room (it comes back when the GPU is free) and waits
    /// until its memory is back.
    pub(super) async fn unload_resident(
        &self,
        name: &str,
        notify: &(dyn Fn(GrantEvent) + Send + Sync),
    ) -> Result<(), String> {
        let Some(handle) = self.supervisor.get(name) else {
            return Ok(());
        };
        notify(GrantEvent::MakingRoom {
            action: "unload".into(),
            target: format!("worker {name}"),
        });
        let before = Instant::now();
        let event = self.queue.history.begin_event(
            self.device,
            history::GrantKind::Unload,
            &format!("worker {name}"),
        );
        // Its memory counts as in use from now until a sample shows it back (`lingering`).
        let known = handle.status().pid;
        if let Some(pid) = known {
            self.unloading(name, pid, before);
        }
        let pid = handle.unload().await;
        self.lock_unloaded().insert(name.to_string());
        let verified = match pid {
            Some(pid) => {
                if known != Some(pid) {
                    self.unloading(name, pid, before);
                }
                self.verify_teardown(&super::lingering::gone(name, pid, before))
                    .await
            }
            None => Ok(()),
        };
        self.queue.history.end_event(event);
        verified
    }

    /// Asks a watched server holding memory on the device to free it, then verifies it did.
    pub(super) async fn release_watch(
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
                tracing::info!(watch = %watch.name, released = %what.join(", "), "asked a watched server to free its memory");
                let gone = Gone {
                    what: format!("watched {}", watch.name),
                    pids: Vec::new(),
                    pgid: None,
                    baseline_used_mib: None,
                    listed_before: None,
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

    pub(super) fn memory_holders(&self) -> String {
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
}
