//! Why a GPU backend could not be opened or sampled: one `thiserror` type for each step. They
//! become text only at the JSON boundary (`backend.unavailable`, `error` in `/status`).

/// Why a backend could not be opened (listed in `backend.unavailable`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProbeError {
    /// Nothing to load or run was found; every candidate tried, with why each failed.
    #[error("{}", .tried.join("; "))]
    NotFound { tried: Vec<String> },
    /// Found, but it would not start (driver/library mismatch, no permission …).
    #[error("{}", .tried.join("; "))]
    Failed { tried: Vec<String> },
    /// The path the config (or the environment) names is not there: said as is, since the
    /// fix is in the config, not in installing anything.
    #[error("{0}")]
    Configured(String),
    #[error("disabled by [gpu.status] backend = \"none\"")]
    Disabled,
}

/// Why one sample of the GPU failed (the `/status` `error`; the decision is then `unknown`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("NVML {what}: {message}")]
    Nvml { what: String, message: String },
    /// An NVML call that hangs, has hung since an earlier sample, or panicked.
    #[error("{0}")]
    Stalled(String),
    #[error("{path} could not run: {message}")]
    SmiRun { path: String, message: String },
    #[error("{path} failed ({exit}): {why}")]
    SmiFailed {
        path: String,
        exit: String,
        why: String,
    },
    #[error("unexpected nvidia-smi GPU line: {0:?}")]
    SmiLine(String),
    #[error(
        "nvidia-smi gives no memory figures ({0:?}): idle cannot be told from busy without them"
    )]
    SmiMemory(String),
    #[error("unexpected nvidia-smi process line: {0:?}")]
    SmiProcessLine(String),
    #[error("nvidia-smi lists process {pid} on GPU {uuid:?}, which is not among the GPUs it lists: which GPU that process holds is not known")]
    SmiProcessGpu { pid: u32, uuid: String },
    #[error("nvidia-smi listed no GPU")]
    NoGpu,
    #[error("{0} GPU processes listed, more than the {max} a GPU can run: the listing is not believed", max = super::backend::MAX_PROCESSES)]
    TooManyProcesses(usize),
    #[error("no GPU backend is available")]
    NoBackend,
}
