//! Picks the sampling backend (NVML, then nvidia-smi, then none) and remembers why the others
//! were not used, for `/status` and the startup log.

use std::time::Duration;

use serde::Serialize;

use super::error::{ProbeError, SampleError};
use super::hop::Hop;
use super::nvml::NvmlBackend;
use super::smi::{self, Smi};
use super::RawSample;
use crate::config::{GpuBackendChoice, GpuStatusConfig};

/// The most GPU processes a sample may list, over all GPUs. Each holds a CUDA context of a few
/// hundred MiB, so a real listing is far shorter; a longer one is garbage, and describing it
/// (a `/proc` walk per process) would take seconds of every sample.
pub(super) const MAX_PROCESSES: usize = 4096;

#[derive(Debug)]
pub(crate) enum Backend {
    Nvml {
        nvml: NvmlBackend,
        /// Runs the driver calls, bounded: a wedged one must not pile up blocking threads.
        calls: Hop,
    },
    Smi(Smi),
    None,
}

/// Which backend is active and why the others are not.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub active: &'static str,
    /// The library or executable in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub unavailable: Vec<Unavailable>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unavailable {
    pub backend: &'static str,
    #[serde(serialize_with = "as_text")]
    pub error: ProbeError,
}

fn as_text<S: serde::Serializer>(error: &ProbeError, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(error)
}

impl Unavailable {
    /// A few words for people; `error` keeps every path tried.
    pub fn summary(&self) -> String {
        match (&self.error, self.backend) {
            (ProbeError::NotFound { .. }, "nvml") => "NVML library not found".into(),
            (ProbeError::NotFound { .. }, "nvidia-smi") => "nvidia-smi not found".into(),
            (ProbeError::Disabled, _) => self.error.to_string(),
            (ProbeError::Configured(why), backend) => format!("{backend}: {why}"),
            (ProbeError::NotFound { tried } | ProbeError::Failed { tried }, backend) => {
                let first = tried.first().map(String::as_str).unwrap_or("").trim();
                format!("{backend}: {}", first.chars().take(120).collect::<String>())
            }
        }
    }
}

impl Backend {
    pub(crate) fn select(config: &GpuStatusConfig) -> (Backend, BackendReport) {
        let timeout = Duration::from_secs_f64(config.timeout_s);
        let mut unavailable = Vec::new();
        let want =
            |b: GpuBackendChoice| config.backend == GpuBackendChoice::Auto || config.backend == b;
        if want(GpuBackendChoice::Nvml) {
            match NvmlBackend::open(&config.nvml_library) {
                Ok(nvml) => {
                    let path = Some(nvml.library.clone());
                    let backend = Backend::Nvml {
                        nvml,
                        calls: Hop::new("an NVML call".into(), "(driver hung?)", timeout),
                    };
                    return (
                        backend,
                        BackendReport {
                            active: "nvml",
                            path,
                            unavailable,
                        },
                    );
                }
                Err(error) => unavailable.push(Unavailable {
                    backend: "nvml",
                    error,
                }),
            }
        }
        if want(GpuBackendChoice::NvidiaSmi) {
            match smi::locate(&config.nvidia_smi) {
                Ok(path) => {
                    let report = BackendReport {
                        active: "nvidia-smi",
                        path: Some(path.display().to_string()),
                        unavailable,
                    };
                    return (Backend::Smi(Smi { path, timeout }), report);
                }
                Err(error) => unavailable.push(Unavailable {
                    backend: "nvidia-smi",
                    error,
                }),
            }
        }
        if config.backend == GpuBackendChoice::None {
            unavailable.push(Unavailable {
                backend: "all",
                error: ProbeError::Disabled,
            });
        }
        (
            Backend::None,
            BackendReport {
                active: "none",
                path: None,
                unavailable,
            },
        )
    }

    pub(crate) async fn sample(&mut self) -> Result<RawSample, SampleError> {
        let sample = self.sample_unchecked().await?;
        if sample.processes.len() > MAX_PROCESSES {
            return Err(SampleError::TooManyProcesses(sample.processes.len()));
        }
        Ok(sample)
    }

    async fn sample_unchecked(&mut self) -> Result<RawSample, SampleError> {
        match self {
            Backend::Smi(smi) => smi.sample().await,
            Backend::Nvml { nvml, calls } => {
                let nvml = nvml.clone();
                calls
                    .run(move || nvml.sample_blocking())
                    .await
                    .map_err(|e| SampleError::Stalled(e.to_string()))?
            }
            Backend::None => Err(SampleError::NoBackend),
        }
    }
}
