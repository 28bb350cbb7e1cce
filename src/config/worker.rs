//! Worker sections of the config: `[workers.<name>]`, the run mode, the resolved `WorkerSpec`, and
//! `[setup]` (how their venvs are built).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Started at serve time and kept loaded between jobs.
    Resident,
    /// Spawned for one job and exits after it, freeing all its memory.
    Oneshot,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Full argv. Default: `<workers_dir>/<name>/.venv/bin/python -m <module>`.
    pub command: Vec<String>,
    /// Python module for the default command. Default: `gpuhost_<name>`.
    pub module: Option<String>,
    /// Working directory. Default: `<workers_dir>/<name>` when it exists, else the base dir.
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub mode: Mode,
    /// VRAM the worker holds while loaded: its footprint until one is measured.
    pub vram_mib: u64,
    /// The GPU it runs on (nvidia-smi index; default `[gpu] device`). When set, gpuhost sets
    /// `CUDA_VISIBLE_DEVICES` for it; room is made for others on that device by unloading it.
    pub device: Option<u32>,
    pub load_timeout_s: f64,
    /// Longest one task may run before the worker is killed and restarted (`job_timeout_s`, the
    /// name before tasks had their own word, still reads).
    #[serde(alias = "job_timeout_s")]
    pub task_timeout_s: f64,
    /// Time between SIGTERM and SIGKILL when stopping the worker.
    pub stop_grace_s: f64,
    /// How long a worker that supports cancelling gets to abandon a job whose client went away
    /// before it is killed and restarted.
    pub cancel_grace_s: f64,
    /// Engine name handed to the worker (`GPUHOST_ENGINE`); the worker picks its default when unset.
    pub engine: Option<String>,
    /// Free-form options: given to the worker at start as JSON (`GPUHOST_OPTIONS`) and merged
    /// into every job as top-level fields (the job's own fields win).
    pub options: serde_json::Map<String, serde_json::Value>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            command: Vec::new(),
            module: None,
            cwd: None,
            env: BTreeMap::new(),
            mode: Mode::Resident,
            vram_mib: 0,
            device: None,
            load_timeout_s: 600.0,
            task_timeout_s: 3600.0,
            stop_grace_s: 5.0,
            cancel_grace_s: 10.0,
            engine: None,
            options: serde_json::Map::new(),
        }
    }
}

impl WorkerConfig {
    /// What the section alone can get wrong.
    pub(super) fn validate(&self) -> Result<(), String> {
        super::validate::launchable(&self.command, &self.env).map_err(|e| {
            format!("{e}; leave `command` out for the packaged worker, or name the program")
        })?;
        if let Some(module) = self.module.as_ref().filter(|m| m.contains('\0')) {
            return Err(format!("module {module:?} holds a NUL byte"));
        }
        Ok(())
    }
}

/// A worker's resolved launch description.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    pub name: String,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub mode: Mode,
    pub vram_mib: u64,
    pub load_timeout: Duration,
    pub task_timeout: Duration,
    pub stop_grace: Duration,
    pub cancel_grace: Duration,
    pub options: serde_json::Map<String, serde_json::Value>,
    /// A job that finds this resident unloaded: reload it, or run oneshot (`[arbiter] fallback`).
    pub unloaded_fallback: super::service::Fallback,
    /// The GPU it runs on.
    pub device: u32,
}

/// How `gpuhost setup` builds worker venvs.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SetupConfig {
    /// Interpreter that creates the venvs (when `uv` is not on PATH).
    pub python: String,
    /// The worker SDK package, installed into every worker venv. `None`: the `protocol/sdk`
    /// beside the `workers_dir` folder, as in the checkout ([`Config::sdk_dir`]).
    ///
    /// [`Config::sdk_dir`]: super::Config::sdk_dir
    pub sdk_dir: Option<PathBuf>,
    /// Longest a single install step may take.
    pub timeout_s: f64,
}

impl Default for SetupConfig {
    fn default() -> Self {
        SetupConfig {
            python: "python3".into(),
            sdk_dir: None,
            timeout_s: 1800.0,
        }
    }
}
