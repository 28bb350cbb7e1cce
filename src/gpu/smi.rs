//! The `nvidia-smi` backend: two CSV queries, run with an absolute path (services under systemd
//! lack the shell's PATH) and a timeout (a wedged driver must not wedge the sampler).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{ProbeError, SampleError};
use super::{GpuInfo, RawProcess, RawSample, Unmeasured};
use crate::process::{find_program, run_captured};

/// `memory.free` comes last and is the driver's own figure: on an H200 it was 616 MiB under
/// total − used (memory the driver reserves), and NVML reports the same.
const GPU_QUERY: &str = "--query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,memory.free";
const APPS_QUERY: &str = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid";
const FORMAT: &str = "--format=csv,noheader,nounits";

/// Where to look when neither the config nor `NVIDIA_SMI_PATH` names one and PATH has none.
pub const USUAL_PLACES: &[&str] = &[
    "/usr/lib/wsl/lib/nvidia-smi",
    "/usr/bin/nvidia-smi",
    "/usr/local/nvidia/bin/nvidia-smi",
];

/// Finds nvidia-smi: the configured path, `NVIDIA_SMI_PATH`, PATH, then the usual places.
pub fn locate(configured: &str) -> Result<PathBuf, ProbeError> {
    if !configured.is_empty() {
        return find_program(configured).ok_or_else(|| {
            ProbeError::Configured(format!(
                "configured nvidia_smi {configured} is not an executable"
            ))
        });
    }
    if let Ok(from_env) = std::env::var("NVIDIA_SMI_PATH") {
        if !from_env.is_empty() {
            return find_program(&from_env).ok_or_else(|| {
                ProbeError::Configured(format!("NVIDIA_SMI_PATH={from_env} is not an executable"))
            });
        }
    }
    find_program("nvidia-smi")
        .or_else(|| USUAL_PLACES.iter().find_map(find_program))
        .ok_or_else(|| {
            not_found(format!(
                "nvidia-smi is not on PATH nor in {}",
                USUAL_PLACES.join(", ")
            ))
        })
}

#[derive(Debug, Clone)]
pub struct Smi {
    pub path: PathBuf,
    pub timeout: Duration,
}

impl Smi {
    pub async fn sample(&self) -> Result<RawSample, SampleError> {
        let (gpus, apps) = tokio::join!(self.query(GPU_QUERY), self.query(APPS_QUERY));
        let mut sample = parse_gpus(&gpus?)?;
        sample.processes = parse_apps(&apps?, &sample)?;
        Ok(sample)
    }

    async fn query(&self, query: &str) -> Result<String, SampleError> {
        let args = [query.to_string(), FORMAT.to_string()];
        let out = run_captured(&self.path, &args, self.timeout)
            .await
            .map_err(|e| SampleError::SmiRun {
                path: display(&self.path),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            let why = stderr
                .lines()
                .chain(stdout.lines())
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            return Err(SampleError::SmiFailed {
                path: display(&self.path),
                exit: crate::process::describe_exit(&out.status),
                why: why.to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn not_found(why: String) -> ProbeError {
    ProbeError::NotFound { tried: vec![why] }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// The start of an odd line for an error message (a broken nvidia-smi may print megabytes).
fn excerpt(line: &str) -> String {
    line.chars().take(200).collect()
}

fn fields(line: &str) -> Vec<&str> {
    line.split(',').map(str::trim).collect()
}

/// `[N/A]`, `[Not Supported]` and friends read as absent; so do `NaN` and `inf`, which Rust
/// parses as floats and JSON cannot carry (the dashboard failed on a `null` power draw).
fn number<T: std::str::FromStr>(field: &str) -> Option<T> {
    let unsigned = field.trim_start_matches(['+', '-']);
    if unsigned.starts_with(['n', 'N', 'i', 'I']) {
        return None;
    }
    field.parse().ok()
}

/// The GPUs of a sample (its processes still empty).
pub fn parse_gpus(csv: &str) -> Result<RawSample, SampleError> {
    let mut sample = RawSample::default();
    for line in csv.lines().filter(|l| !l.trim().is_empty()) {
        let f = fields(line);
        // Eight fields, or nine with memory.free. More is a line not understood (a power draw
        // in a locale with decimal commas, `70,50`, shifted the free memory to `50`).
        if !(8..=9).contains(&f.len()) {
            return Err(SampleError::SmiLine(excerpt(line)));
        }
        let index = number(f[0]).unwrap_or((sample.gpus.len() + sample.unmeasured.len()) as u32);
        // Utilization, temperature and power may be absent (MIG, some boards) and are shown as
        // 0; memory decides idle or busy, so a GPU without it is only known by name.
        let (Some(used), Some(total)) = (number::<u64>(f[4]), number::<u64>(f[5])) else {
            sample.unmeasured.push(Unmeasured {
                index,
                uuid: f[1].to_string(),
                name: f[2].to_string(),
                why: SampleError::SmiMemory(excerpt(line)).to_string(),
            });
            continue;
        };
        sample.gpus.push(GpuInfo {
            index,
            uuid: f[1].to_string(),
            name: f[2].to_string(),
            utilization: number(f[3]).unwrap_or(0),
            memory_used_mib: used,
            memory_total_mib: total,
            memory_free_mib: f
                .get(8)
                .and_then(|free| number(free))
                .unwrap_or_else(|| total.saturating_sub(used)),
            temperature: number(f[6]).unwrap_or(0),
            power_draw: number(f[7]).unwrap_or(0.0),
        });
    }
    if sample.gpus.is_empty() && sample.unmeasured.is_empty() {
        return Err(SampleError::NoGpu);
    }
    Ok(sample)
}

/// The compute processes; a line that is neither one nor nvidia-smi's "No running processes
/// found" makes the sample fail (a process list half read must not look like an idle GPU).
pub fn parse_apps(csv: &str, listed: &RawSample) -> Result<Vec<RawProcess>, SampleError> {
    let gpus: Vec<(u32, &str)> = (listed.gpus.iter().map(|g| (g.index, g.uuid.as_str())))
        .chain(listed.unmeasured.iter().map(|g| (g.index, g.uuid.as_str())))
        .collect();
    csv.lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("No running processes found"))
        .map(|line| {
            // pid, process_name, used_memory, gpu_uuid: the name may hold commas (a path such
            // as /opt/a,b/python), so the memory and the GPU are read from the end.
            let (first, rest) = line.split_once(',').unwrap_or((line, ""));
            let Some(pid) = number::<u32>(first.trim()) else {
                return Err(SampleError::SmiProcessLine(excerpt(line)));
            };
            let (name, memory, uuid) = match rest.rsplit_once(',') {
                Some((named, uuid)) => match named.rsplit_once(',') {
                    Some((name, memory)) => (name, Some(memory), Some(uuid.trim())),
                    None => (named, None, Some(uuid.trim())),
                },
                None => (rest, None, None),
            };
            // A process on a GPU the listing does not have (its UUID odd or missing) is on the
            // only GPU there is; among several, which one is not known: no GPU may then read
            // idle for want of it (it was counted on GPU 0, and the GPU it held read idle).
            let gpu_index = match uuid.and_then(|u| gpus.iter().find(|g| g.1 == u)) {
                Some(&(index, _)) => index,
                None if gpus.len() == 1 => gpus[0].0,
                None => {
                    return Err(SampleError::SmiProcessGpu {
                        pid,
                        uuid: excerpt(uuid.unwrap_or("")),
                    })
                }
            };
            Ok(RawProcess {
                pid,
                name: Some(name.trim())
                    .filter(|n| !n.is_empty())
                    .map(String::from),
                used_memory_mib: memory.and_then(|m| number(m.trim())),
                gpu_index,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
