//! GPU status: what is on the GPU, who uses it, and whether it is free. A background sampler
//! keeps a snapshot fresh; requests only read the snapshot, never the driver.

mod backend;
mod decision;
pub mod error;
mod hop;
mod nvml;
mod owners;
pub mod procfs;
mod sampler;
pub mod smi;

use serde::Serialize;

pub(crate) use backend::Backend;
pub use backend::BackendReport;
pub use decision::{Decision, DecisionInput, Judge};
pub use owners::ServicePids;
pub use sampler::{GpuHealth, GpuMonitor, Snapshot, StatusView};

/// One GPU as sampled.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Percent, 0–100.
    pub utilization: u32,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub memory_free_mib: u64,
    /// Degrees Celsius.
    pub temperature: u32,
    /// Watts.
    pub power_draw: f64,
}

/// A process on a GPU as the backend reports it, before `/proc` is read.
#[derive(Debug, Clone, PartialEq)]
pub struct RawProcess {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_mib: Option<u64>,
    pub gpu_index: u32,
}

/// One raw sample of every GPU and its processes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawSample {
    pub gpus: Vec<GpuInfo>,
    pub processes: Vec<RawProcess>,
    /// GPUs listed without memory figures (a display card, a unified-memory board): known, so
    /// their processes are placed on them, but with nothing to judge them by. Only the
    /// configured device's own missing figures make the sample fail.
    pub unmeasured: Vec<Unmeasured>,
}

/// A GPU the backend lists but cannot give the memory of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unmeasured {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Why its memory is not known.
    pub why: String,
}

/// A process on the GPU with everything `/status` says about it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub name: String,
    /// 0 when the driver does not say (WSL).
    pub used_memory_mib: u64,
    /// Full command line; from an ancestor when the process's own is empty (see `command_pid`).
    pub command: String,
    /// Where `command` was read from when it was not this pid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_pid: Option<u32>,
    /// How the command was found when it is not simply this pid's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_note: Option<String>,
    pub gpu_index: u32,
    /// The gpuhost worker this process belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The gpuhost service (`[[services]]`) this process belongs to: its own process or a
    /// child it started (vLLM's engine core).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The `[[gpu.watch]]` service it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch: Option<String>,
}
