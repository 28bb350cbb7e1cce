//! The NVML backend (`nvml-wrapper`): the library is loaded at run time from a configurable path,
//! so gpuhost builds and runs on machines without a GPU and finds WSL's copy under systemd.

use std::sync::Arc;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::error::{ProbeError, SampleError};
use super::{GpuInfo, RawProcess, RawSample, Unmeasured};

fn nvml_error(what: &str, e: NvmlError) -> SampleError {
    SampleError::Nvml {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// Tried in order when the config names no library.
pub(super) const USUAL_PLACES: &[&str] = &[
    "libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
];

const MIB: u64 = 1024 * 1024;

#[derive(Clone)]
pub(crate) struct NvmlBackend {
    nvml: Arc<Nvml>,
    pub library: String,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend")
            .field("library", &self.library)
            .finish()
    }
}

impl NvmlBackend {
    /// Loads NVML from `configured`, else `GPUHOST_NVML_LIBRARY`, else the first usual place that works.
    pub(crate) fn open(configured: &str) -> Result<NvmlBackend, ProbeError> {
        let from_env = std::env::var("GPUHOST_NVML_LIBRARY").unwrap_or_default();
        let candidates = candidates(configured, &from_env);
        let mut tried = Vec::new();
        // Only "could not load the library" everywhere means NVML is not there at all.
        let mut all_missing = true;
        for library in candidates {
            match Nvml::builder()
                .lib_path(std::ffi::OsStr::new(library))
                .init()
            {
                Ok(nvml) => {
                    return Ok(NvmlBackend {
                        nvml: Arc::new(nvml),
                        library: library.to_string(),
                    })
                }
                Err(e) => {
                    all_missing &= matches!(e, NvmlError::LibloadingError(_));
                    tried.push(format!("{library}: {e}"));
                }
            }
        }
        Err(if all_missing {
            ProbeError::NotFound { tried }
        } else {
            ProbeError::Failed { tried }
        })
    }

    /// Samples every device. Blocking (driver calls): run it off the async threads.
    pub(crate) fn sample_blocking(&self) -> Result<RawSample, SampleError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_error("device count", e))?;
        let mut sample = RawSample::default();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| nvml_error(&format!("device {index}"), e))?;
            let (uuid, name) = (
                device.uuid().unwrap_or_default(),
                device.name().unwrap_or_default(),
            );
            match device.memory_info() {
                Ok(memory) => sample.gpus.push(GpuInfo {
                    index,
                    uuid,
                    name,
                    utilization: device.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                    memory_used_mib: memory.used / MIB,
                    memory_total_mib: memory.total / MIB,
                    memory_free_mib: memory.free / MIB,
                    temperature: device.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                    power_draw: device
                        .power_usage()
                        .map(|mw| f64::from(mw) / 1000.0)
                        .unwrap_or(0.0),
                }),
                // Known, so its processes are placed on it; judged by nothing.
                Err(e) => sample.unmeasured.push(Unmeasured {
                    index,
                    uuid,
                    name,
                    why: nvml_error(&format!("memory of GPU {index}"), e).to_string(),
                }),
            }
            let mut seen = std::collections::HashSet::new();
            // A process list that could not be read must not look like an idle GPU (a process
            // still loading, its memory small, read as nothing): the sample fails, as an
            // nvidia-smi list half read does. A driver that has no such list (NotSupported)
            // lists none.
            let compute = match device.running_compute_processes() {
                Ok(list) => list,
                Err(NvmlError::NotSupported) => Vec::new(),
                Err(e) => return Err(nvml_error(&format!("processes of GPU {index}"), e)),
            };
            let graphics = device.running_graphics_processes().unwrap_or_default();
            for p in compute.into_iter().chain(graphics) {
                if !seen.insert(p.pid) {
                    continue;
                }
                sample.processes.push(RawProcess {
                    pid: p.pid,
                    name: None,
                    used_memory_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
                        UsedGpuMemory::Unavailable => None,
                    },
                    gpu_index: index,
                });
            }
        }
        Ok(sample)
    }
}

/// Libraries to try: the configured one, else the environment's, else the usual places.
fn candidates<'a>(configured: &'a str, from_env: &'a str) -> Vec<&'a str> {
    match (configured, from_env) {
        ("", "") => USUAL_PLACES.to_vec(),
        ("", env) => vec![env],
        (configured, _) => vec![configured],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_beats_environment_beats_usual_places() {
        assert_eq!(candidates("/c/lib.so", "/e/lib.so"), ["/c/lib.so"]);
        assert_eq!(candidates("", "/e/lib.so"), ["/e/lib.so"]);
        assert!(candidates("", "").contains(&"/usr/lib/wsl/lib/libnvidia-ml.so.1"));
    }

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = NvmlBackend::open("/nonexistent/libnvidia-ml.so.1").unwrap_err();
        assert!(matches!(err, ProbeError::NotFound { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("/nonexistent/libnvidia-ml.so.1:"),
            "{err}"
        );
    }
}
