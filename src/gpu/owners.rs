//! Which process group each running gpuhost service is: the sampler names a GPU process's
//! service by it (its own pid or an ancestor's), as it names a worker's from the supervisor.

use std::collections::HashMap;
use std::sync::Mutex;

/// Shared by the GPU sampler (reads once a sample) and the service actors (write at spawn and
/// after teardown).
#[derive(Debug, Default)]
pub struct ServicePids {
    /// std Mutex: an insert, a remove or a clone of a few entries, never held across `.await`.
    by_pid: Mutex<HashMap<u32, String>>,
}

impl ServicePids {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, String>> {
        self.by_pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Service `name` runs as process (group leader) `pid`.
    pub fn started(&self, pid: u32, name: &str) {
        self.lock().insert(pid, name.to_string());
    }

    /// Its process group is gone (torn down, or given up on).
    pub fn ended(&self, pid: u32) {
        self.lock().remove(&pid);
    }

    /// Every running service's pid and name.
    pub fn current(&self) -> HashMap<u32, String> {
        self.lock().clone()
    }
}
