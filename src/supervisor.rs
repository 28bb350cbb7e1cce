//! The set of configured workers: starts their actors, looks them up, stops them all.

use std::collections::BTreeMap;

use tokio::task::JoinHandle;

use crate::config::{Config, Mode};
use crate::worker::{WorkerHandle, WorkerStatus};

pub struct Supervisor {
    workers: BTreeMap<String, WorkerHandle>,
    /// Actor tasks, joined on shutdown. std Mutex: only taken briefly, never across `.await`.
    tasks: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Supervisor {
    /// Starts one actor per configured worker; `force_oneshot` runs every worker in oneshot mode
    /// (the sequential pattern of `gpuhost transcribe` without a server).
    pub fn start(config: &Config, force_oneshot: bool) -> Supervisor {
        let mut workers = BTreeMap::new();
        let mut tasks = Vec::new();
        for name in config.workers.keys() {
            let mut spec = config
                .worker_spec(name)
                .expect("the name comes from the config");
            if force_oneshot {
                spec.mode = Mode::Oneshot;
            }
            let (handle, task) = WorkerHandle::spawn(spec);
            workers.insert(name.clone(), handle);
            tasks.push(task);
        }
        Supervisor {
            workers,
            tasks: std::sync::Mutex::new(tasks),
        }
    }

    pub fn get(&self, name: &str) -> Option<&WorkerHandle> {
        self.workers.get(name)
    }

    pub fn statuses(&self) -> Vec<WorkerStatus> {
        self.workers.values().map(WorkerHandle::status).collect()
    }

    /// Stops every worker (in parallel) and waits for their actors to end.
    pub async fn stop_all(&self) {
        futures_util::future::join_all(self.workers.values().map(WorkerHandle::stop)).await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}
