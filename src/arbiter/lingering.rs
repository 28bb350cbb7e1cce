//! Residents unloaded whose memory no sample has shown back yet, however they were unloaded (to
//! make room, idle, by hand): `room` counts such a process's footprint as loaded (its memory is
//! in use), also once the resident runs again as another process, and an unloaded resident as
//! unloaded too (a job would load it again on top), so nothing is granted that memory before it
//! is free. Counted neither way, it read as memory the holders had taken, room for more.

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
    /// Stopped processes of residents (by name and pid: one may load again and be unloaded
    /// again before the first is gone), and what must leave the GPU before their memory counts
    /// as free.
    gone: BTreeMap<(String, u32), Gone>,
}

/// What must leave the GPU once resident `name`'s process `pid` stopped (a sample after `after`).
pub(super) fn gone(name: &str, pid: u32, after: Instant) -> Gone {
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

    /// How many footprints of resident `status` to count as in use besides its running process
    /// (if any): its stopped processes no sample has shown gone yet, and, unloaded, the last one
    /// seen up if not recorded as stopped yet. Cheap: no `/proc` read.
    pub(super) fn lingering(&self, status: &WorkerStatus) -> u64 {
        let lingering = self.lock_lingering();
        let name = &status.name;
        let running = status.pid.filter(|_| status.state != WorkerState::Unloaded);
        let stopped = lingering
            .gone
            .keys()
            .filter(|(n, p)| n == name && Some(*p) != running)
            .count() as u64;
        let unrecorded = status.state == WorkerState::Unloaded
            && lingering
                .up
                .get(name)
                .is_some_and(|&p| !lingering.gone.contains_key(&(name.clone(), p)));
        stopped + u64::from(unrecorded)
    }

    /// Called as resident `name` (process `pid`) is unloaded to make room, from `before`:
    /// lingering from the start, before it reads unloaded.
    pub(super) fn unloading(&self, name: &str, pid: u32, before: Instant) {
        let mut lingering = self.lock_lingering();
        lingering.up.remove(name);
        let stopped = gone(name, pid, before);
        lingering
            .gone
            .entry((name.to_string(), pid))
            .or_insert(stopped);
    }

    /// Brings the record up to date with the workers and sample `snap`: the process of each
    /// resident up, each one unloaded since, and the stopped ones a sample after their stop
    /// shows gone. Whether any memory came back.
    pub(super) fn track_unloads(&self, snap: &Snapshot) -> bool {
        let residents: Vec<WorkerStatus> = self
            .device_workers()
            .into_iter()
            .filter(|s| s.mode == Mode::Resident && !s.runs_on_cpu())
            .collect();
        let mut lingering = self.lock_lingering();
        for status in &residents {
            let name = &status.name;
            match (status.state, status.pid) {
                (WorkerState::Starting | WorkerState::Ready | WorkerState::Busy, Some(pid)) => {
                    lingering.up.insert(name.clone(), pid);
                }
                (WorkerState::Unloaded, _) => {
                    if let Some(pid) = lingering.up.remove(name) {
                        let stopped = gone(name, pid, status.state_since);
                        lingering.gone.entry((name.clone(), pid)).or_insert(stopped);
                    }
                }
                // Down after a failure (a crash is no unload), or not started yet.
                _ => {
                    lingering.up.remove(name);
                }
            }
        }
        let checked: Vec<((String, u32), Gone)> = lingering
            .gone
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        drop(lingering);
        if checked.is_empty() {
            return false;
        }
        // A sample whose only fault is another GPU (the configured one unmeasured) still tells
        // this one's processes: a resident on GPU 1 lingered for as long as GPU 0 read [N/A].
        let own;
        let snap = if snap.error.is_some() && snap.gpus.iter().any(|g| g.index == self.device) {
            own = Snapshot {
                error: None,
                ..snap.clone()
            };
            &own
        } else {
            snap
        };
        // `/proc` reads (teardown::check) outside the lock.
        let tolerance = self.config.teardown_tolerance_mib;
        let seen: Vec<((String, u32), Gone)> = checked
            .into_iter()
            .filter(|(_, g)| {
                snap.taken.is_some_and(|t| t > g.after)
                    && teardown::check(snap, self.device, g, tolerance).is_ok()
            })
            .collect();
        let mut back = false;
        let mut lingering = self.lock_lingering();
        for (key, checked) in seen {
            // Not one recorded since the look.
            if lingering
                .gone
                .get(&key)
                .is_some_and(|g| g.after == checked.after)
            {
                tracing::debug!(worker = %key.0, pid = key.1, "an unloaded resident's memory is back");
                lingering.gone.remove(&key);
                back = true;
            }
        }
        back
    }
}
