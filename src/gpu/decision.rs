//! Decides idle / loading / busy / unknown from a sample. Memory alone misjudges (a server at
//! 200 MiB while it loads looks idle), so processes and watched services come first, and idle
//! needs a quiet period. When in doubt the answer is never `idle`.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{GpuInfo, GpuProcess};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Nothing on the GPU, quiet for the whole quiet period: safe to start something big.
    Idle,
    /// A watched service is starting and not serving yet: do not start another.
    Loading,
    /// In use.
    Busy,
    /// Sampling failed or is stale.
    Unknown,
}

/// A `[[gpu.watch]]` service as seen in this sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchState {
    pub name: String,
    /// Processes whose command line matched.
    pub pids: Vec<u32>,
    /// `None` when no health URL is configured or nothing matched.
    pub healthy: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_url: Option<String>,
}

pub struct DecisionInput<'a> {
    pub gpu: Option<&'a GpuInfo>,
    pub processes: &'a [GpuProcess],
    pub watched: &'a [WatchState],
    pub error: Option<&'a str>,
}

/// Keeps the hysteresis state between samples.
#[derive(Debug)]
pub struct Judge {
    pub idle_utilization_pct: u32,
    pub idle_memory_mib: u64,
    pub quiet_period: Duration,
    quiet_since: Option<Instant>,
}

impl Judge {
    pub fn new(idle_utilization_pct: u32, idle_memory_mib: u64, quiet_period: Duration) -> Judge {
        Judge {
            idle_utilization_pct,
            idle_memory_mib,
            quiet_period,
            quiet_since: None,
        }
    }

    pub fn decide(&mut self, input: &DecisionInput<'_>, now: Instant) -> (Decision, String) {
        let (decision, reason) = self.judge(input, now);
        if decision != Decision::Idle && !reason.starts_with("quiet for") {
            self.quiet_since = None;
        }
        (decision, reason)
    }

    fn judge(&mut self, input: &DecisionInput<'_>, now: Instant) -> (Decision, String) {
        if let Some(error) = input.error {
            return (Decision::Unknown, format!("GPU sampling failed: {error}"));
        }
        let Some(gpu) = input.gpu else {
            return (
                Decision::Unknown,
                "the configured GPU is not in the sample".into(),
            );
        };
        if let Some(w) = input
            .watched
            .iter()
            .find(|w| !w.pids.is_empty() && w.healthy == Some(false))
        {
            return (
                Decision::Loading,
                format!(
                    "{} (pid {}) is running but {} does not answer yet",
                    w.name,
                    list(&w.pids),
                    w.health_url.as_deref().unwrap_or("its health URL")
                ),
            );
        }
        if !input.processes.is_empty() {
            let who: Vec<String> = input
                .processes
                .iter()
                .map(|p| {
                    let label = p
                        .watch
                        .as_deref()
                        .or(p.worker.as_deref())
                        .or(p.service.as_deref())
                        .unwrap_or(&p.name);
                    format!("{label} (pid {}, {} MiB)", p.pid, p.used_memory_mib)
                })
                .collect();
            return (
                Decision::Busy,
                format!("{} process(es) on the GPU: {}", who.len(), who.join(", ")),
            );
        }
        if let Some(w) = input.watched.iter().find(|w| !w.pids.is_empty()) {
            return (
                Decision::Busy,
                format!("{} (pid {}) is running", w.name, list(&w.pids)),
            );
        }
        if gpu.utilization > self.idle_utilization_pct {
            return (
                Decision::Busy,
                format!(
                    "utilization {}% is above {}% with no process listed",
                    gpu.utilization, self.idle_utilization_pct
                ),
            );
        }
        if gpu.memory_used_mib > self.idle_memory_mib {
            return (
                Decision::Busy,
                format!(
                    "{} MiB in use (above {} MiB) with no process listed (WSL hides processes)",
                    gpu.memory_used_mib, self.idle_memory_mib
                ),
            );
        }
        let since = *self.quiet_since.get_or_insert(now);
        let quiet = now.saturating_duration_since(since);
        if quiet >= self.quiet_period {
            return (
                Decision::Idle,
                format!(
                    "no process on the GPU, quiet for {:.0} s",
                    quiet.as_secs_f64()
                ),
            );
        }
        (
            Decision::Busy,
            format!(
                "quiet for {:.1} s of the {:.1} s required before idle",
                quiet.as_secs_f64(),
                self.quiet_period.as_secs_f64()
            ),
        )
    }
}

fn list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(util: u32, used: u64) -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "RTX".into(),
            utilization: util,
            memory_used_mib: used,
            memory_total_mib: 32607,
            memory_free_mib: 32607 - used,
            temperature: 40,
            power_draw: 20.0,
        }
    }

    fn process(pid: u32) -> GpuProcess {
        GpuProcess {
            pid,
            name: "python".into(),
            used_memory_mib: 200,
            command: "python -m vllm".into(),
            command_pid: None,
            command_note: None,
            gpu_index: 0,
            worker: None,
            service: None,
            watch: None,
        }
    }

    #[test]
    fn idle_needs_the_quiet_period() {
        let mut j = Judge::new(5, 1024, Duration::from_secs(10));
        let g = gpu(0, 512);
        let input = DecisionInput {
            gpu: Some(&g),
            processes: &[],
            watched: &[],
            error: None,
        };
        let t0 = Instant::now();
        assert_eq!(j.decide(&input, t0).0, Decision::Busy);
        assert_eq!(
            j.decide(&input, t0 + Duration::from_secs(5)).0,
            Decision::Busy
        );
        assert_eq!(
            j.decide(&input, t0 + Duration::from_secs(10)).0,
            Decision::Idle
        );
        // Any use restarts the quiet period.
        let hot = gpu(80, 512);
        let busy = DecisionInput {
            gpu: Some(&hot),
            ..input
        };
        assert_eq!(
            j.decide(&busy, t0 + Duration::from_secs(11)).0,
            Decision::Busy
        );
        assert_eq!(
            j.decide(&input, t0 + Duration::from_secs(12)).0,
            Decision::Busy
        );
        assert_eq!(
            j.decide(&input, t0 + Duration::from_secs(22)).0,
            Decision::Idle
        );
    }

    #[test]
    fn small_process_is_busy_and_unhealthy_watch_is_loading() {
        let mut j = Judge::new(5, 1024, Duration::ZERO);
        let g = gpu(0, 200);
        let procs = [process(77)];
        let input = DecisionInput {
            gpu: Some(&g),
            processes: &procs,
            watched: &[],
            error: None,
        };
        assert_eq!(j.decide(&input, Instant::now()).0, Decision::Busy);
        let watched = [WatchState {
            name: "vllm".into(),
            pids: vec![77],
            healthy: Some(false),
            health_url: Some("http://127.0.0.1:8000/health".into()),
        }];
        let input = DecisionInput {
            watched: &watched,
            ..input
        };
        let (d, reason) = j.decide(&input, Instant::now());
        assert_eq!(d, Decision::Loading);
        assert!(reason.contains("vllm (pid 77)"), "{reason}");
    }

    #[test]
    fn failure_is_unknown_never_idle() {
        let mut j = Judge::new(5, 1024, Duration::ZERO);
        let input = DecisionInput {
            gpu: None,
            processes: &[],
            watched: &[],
            error: Some("nvidia-smi timed out"),
        };
        assert_eq!(j.decide(&input, Instant::now()).0, Decision::Unknown);
    }
}
