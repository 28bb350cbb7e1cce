//! GPU sections of the config: `[gpu]`, `[gpu.status]` and `[[gpu.watch]]`.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// How many pipeline jobs may hold one GPU at once (each GPU's queue on its own).
    pub max_concurrent_jobs: usize,
    /// Index of the GPU reported as `gpu` in `/status`, and the one workers and services without
    /// a `device` of their own run on (a speech job queues on its stages' GPUs).
    pub device: usize,
    /// Every GPU the arbiter keeps a queue for (besides `device` and any a worker or service
    /// names); leases may ask for one of them or `"any"`.
    pub devices: Vec<u32>,
    pub status: GpuStatusConfig,
    /// Services whose command lines are watched to tell `loading` from `busy`.
    pub watch: Vec<WatchConfig>,
    /// `exclusive` (default): a service or lease holds the GPU alone. `vram`: holders whose
    /// footprints fit together in `memory_total − headroom_mib` share it.
    pub share: crate::arbiter::sharing::ShareMode,
    /// Memory kept free when packing holders (`share = "vram"`).
    pub headroom_mib: u64,
    /// With `share = "vram"`: a later request that fits may go ahead of a head that does not.
    pub allow_backfill: bool,
}

/// Which way GPU status is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuBackendChoice {
    /// NVML, then nvidia-smi, then none.
    Auto,
    Nvml,
    NvidiaSmi,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuStatusConfig {
    pub backend: GpuBackendChoice,
    /// `libnvidia-ml.so.1` to load; empty means `GPUHOST_NVML_LIBRARY`, then the usual places
    /// (WSL's `/usr/lib/wsl/lib/` too).
    pub nvml_library: String,
    /// `nvidia-smi` to run; empty means `NVIDIA_SMI_PATH`, then PATH, then the usual places.
    pub nvidia_smi: String,
    pub interval_s: f64,
    /// A snapshot older than this reads as `unknown`.
    pub stale_after_s: f64,
    /// A `nvidia-smi` call running longer than this is killed and the sample fails.
    pub timeout_s: f64,
    /// Where `/proc` is (tests use a fake one).
    pub proc_root: PathBuf,
    /// Leave command lines out of `/status` even for token holders.
    pub hide_commands: bool,
    /// Idle needs utilization at most this…
    pub idle_utilization_pct: u32,
    /// …and memory use at most this (MiB; the display and driver take some)…
    pub idle_memory_mib: u64,
    /// …continuously for this long.
    pub quiet_period_s: f64,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    pub name: String,
    /// Substring matched against full command lines.
    pub pattern: String,
    /// Answers 2xx once the service serves; matched but not healthy means `loading`.
    #[serde(default)]
    pub health_url: Option<String>,
    /// How the arbiter asks this server (which gpuhost did not start) to free its memory when a
    /// grant needs room; followed by the same teardown check as gpuhost's own holders.
    #[serde(default)]
    pub release: Option<WatchRelease>,
    /// While it loads (running, its `health_url` not answering yet), nothing is granted on its
    /// GPU: its memory is not what it will be (a vLLM at 200 MiB while it loads looked idle, and
    /// a second model started beside it ran out of memory). After this long loading, grants go
    /// on by memory alone; 0 never holds them.
    #[serde(default = "default_load_timeout_s")]
    pub load_timeout_s: f64,
}

fn default_load_timeout_s() -> f64 {
    600.0
}

/// A "free your memory" call for a server gpuhost did not start.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum WatchRelease {
    /// Ollama at `url`: `GET /api/ps` lists the loaded models, then each is unloaded with
    /// `keep_alive: 0`.
    Ollama { url: String },
    /// One HTTP call, e.g. llama-swap's `GET /unload` or ComfyUI's `POST /free`.
    Http {
        url: String,
        #[serde(default = "default_release_method")]
        method: String,
        /// Sent as JSON when set.
        #[serde(default)]
        body: Option<String>,
    },
}

fn default_release_method() -> String {
    "POST".into()
}

impl WatchConfig {
    /// As a `[[services]]` entry is checked: a name, a pattern, URLs that are URLs and an HTTP
    /// method (a typo became POST without a word, an unparsable URL a warning at the first
    /// release).
    pub(super) fn validate(&self) -> Result<(), String> {
        let at = format!("[[gpu.watch]] `{}`", self.name);
        if !super::validate::plain_name(&self.name) {
            return Err(format!(
                "{at}: name must be 1 to 64 letters, digits, - or _"
            ));
        }
        if self.pattern.is_empty() {
            return Err(format!("{at} has an empty pattern"));
        }
        if let Some(url) = &self.health_url {
            super::service::http_url(&at, "health_url", url)?;
        }
        if !(self.load_timeout_s.is_finite() && self.load_timeout_s >= 0.0) {
            return Err(format!(
                "{at}: load_timeout_s must be a number of seconds, 0 or more"
            ));
        }
        match &self.release {
            Some(WatchRelease::Ollama { url }) => super::service::http_url(&at, "release.url", url),
            Some(WatchRelease::Http { url, method, .. }) => {
                super::service::http_url(&at, "release.url", url)?;
                match reqwest::Method::from_bytes(method.as_bytes()) {
                    Ok(_) => Ok(()),
                    Err(_) => Err(format!(
                        "{at}: release.method {method:?} is not an HTTP method (POST, GET, …)"
                    )),
                }
            }
            None => Ok(()),
        }
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            max_concurrent_jobs: 1,
            device: 0,
            devices: Vec::new(),
            status: GpuStatusConfig::default(),
            watch: Vec::new(),
            share: crate::arbiter::sharing::ShareMode::Exclusive,
            headroom_mib: 1024,
            allow_backfill: false,
        }
    }
}

impl Default for GpuStatusConfig {
    fn default() -> Self {
        GpuStatusConfig {
            backend: GpuBackendChoice::Auto,
            nvml_library: String::new(),
            nvidia_smi: String::new(),
            interval_s: 1.0,
            stale_after_s: 5.0,
            timeout_s: 2.0,
            proc_root: PathBuf::from("/proc"),
            hide_commands: false,
            idle_utilization_pct: 5,
            idle_memory_mib: 1024,
            quiet_period_s: 10.0,
        }
    }
}
