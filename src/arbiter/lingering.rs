//! Residents unloaded whose memory no sample has shown back yet, however they were unloaded (to
//! make room, idle, by hand): `room` counts such a one as loaded (its memory is in use) and as
//! unloaded (a job would load it again on top), so nothing is granted that memory before it is
//! free. Counted neither way, it read as memory the holders had taken, room for more.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::config::Mode;
use crate::gpu::Snapshot;
use crate::worker::{WorkerState, WorkerStatus};

use super::teardown::{self, Gone};
use super::Core;

/// What is known of the residents' processes. std Mutex around it: map reads and updates only,
/// never across `.await`, and no `/proc` read under it in `room` (the queue's lock is held there).
#[derive(Default)]
pub(super) struct Lingering {
    /// The process of each resident last seen up (loading, ready, busy).
    up: BTreeMap<String, u32>,
    /// Residents unloaded, and what must leave the GPU before their memory counts as free.
    gone: BTreeMap<String, Gone>,
}

/// What must leave the GPU once resident `name`'s process `pid` stopped (a sample after `after`).
fn gone(name: &str, pid: u32, after: Instant) -> Gone {
    Gone {
        what: format!("worker {name}"),
        pids: vec![pid],
        pgid: Some(pid),
        baseline_used_mib: None,
        listed_before: None,
        watch: None,
        after,
    }
}

impl Core {
    fn lock_lingering(&self) -> std::sync::MutexGuard<'_, Lingering> {
        self.lingering.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether an unloaded resident's memory may still be in use (cheap: no `/proc` read).
    pub(super) fn lingers(&self, status: &WorkerStatus) -> bool {
        let lingering = self.lock_lingering();
        status.state == WorkerState::Unloaded
            && (lingering.gone.contains_key(&status.name)
                || lingering.up.contains_key(&status.name))
    }

    /// Called as resident `name` (process `pid`) is unloaded to make room, from `before`:
    /// lingering from the start, before it reads unloaded.
    pub(super) fn unloading(&self, name: &str, pid: u32, before: Instant) {
        let mut lingering = self.lock_lingering();
        lingering.up.remove(name);
        lingering
            .gone
            .insert(name.to_string(), gone(name, pid, before));
    }

    /// Brings the record up to date with the workers and sample `snap`: the process of each
    /// resident up, each one unloaded since, and those a sample after their stop shows gone
    /// (or loading again under another process). Whether any memory came back.
    pub(super) fn track_unloads(&self, snap: &Snapshot) -> bool {
        let residents: Vec<WorkerStatus> = self
            .device_workers()
            .into_iter()
            .filter(|s| s.mode == Mode::Resident && !s.runs_on_cpu())
            .collect();
        let mut back = false;
        let mut lingering = self.lock_lingering();
        for status in &residents {
            let name = &status.name;
            match (status.state, status.pid) {
                (WorkerState::Starting | WorkerState::Ready | WorkerState::Busy, Some(pid)) => {
                    lingering.up.insert(name.clone(), pid);
                    // Up again as another process: what the old one left is not its own.
                    if lingering.gone.get(name).is_some_and(|g| g.pids != [pid]) {
                        lingering.gone.remove(name);
                    }
                }
                (WorkerState::Unloaded, _) => {
                    if let Some(pid) = lingering.up.remove(name) {
                        let stopped = gone(name, pid, status.state_since);
                        lingering.gone.entry(name.clone()).or_insert(stopped);
                    }
                }
                _ => {
                    // Down after a failure, or stopped: what it held is a crash's to tell.
                    lingering.up.remove(name);
                    lingering.gone.remove(name);
                }
            }
        }
        let checked: Vec<(String, Gone)> = lingering
            .gone
            .iter()
            .map(|(n, g)| (n.clone(), g.clone()))
            .collect();
        drop(lingering);
        // `/proc` reads (teardown::check) outside the lock.
        let tolerance = self.config.teardown_tolerance_mib;
        let seen: Vec<(String, Gone)> = checked
            .into_iter()
            .filter(|(_, g)| {
                snap.taken.is_some_and(|t| t > g.after)
                    && teardown::check(snap, self.device, g, tolerance).is_ok()
            })
            .collect();
        let mut lingering = self.lock_lingering();
        for (name, checked) in seen {
            // Not one recorded since the look (another unload of it).
            let same = |g: &Gone| g.pids == checked.pids && g.after == checked.after;
            if lingering.gone.get(&name).is_some_and(same) {
                tracing::debug!(worker = %name, "an unloaded resident's memory is back");
                lingering.gone.remove(&name);
                back = true;
            }
        }
        back
    }
}
