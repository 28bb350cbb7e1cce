//! Verified teardown: a holder's processes are gone from the GPU process list and used memory is
//! back within a tolerance of where it was before the holder started — seen in a sample taken
//! after the stop — before anyone else is granted the GPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::gpu::Snapshot;

/// What must be gone for a teardown to count as done.
#[derive(Debug, Clone)]
pub struct Gone {
    /// For messages: `service vllm`, `worker asr`.
    pub what: String,
    /// Process ids that must leave the GPU.
    pub pids: Vec<u32>,
    /// The holder's process group: any GPU process in it must leave too.
    pub pgid: Option<u32>,
    /// Used memory of the device before the holder started.
    pub baseline_used_mib: Option<u64>,
    /// With `share = "vram"`: the GPU processes listed when the holder started. One listed now
    /// that is neither among them nor the holder's came with another holder sharing the GPU
    /// (a lease's program, a job's worker): its memory is not the holder's to give back.
    pub listed_before: Option<Vec<u32>>,
    /// A `[[gpu.watch]]` server asked to free its memory (it keeps running): the processes
    /// matched by it may hold no more than the tolerance in all.
    pub watch: Option<String>,
    /// Only samples taken after this count.
    pub after: Instant,
}

/// Waits until `gone` holds on the device, or `deadline` passes (then `Err` names what still
/// holds memory). With no GPU backend there is nothing to observe: it holds at once.
pub async fn verify(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    observed: bool,
    device: u32,
    gone: &Gone,
    tolerance_mib: u64,
    deadline: Duration,
) -> Result<(), String> {
    if !observed {
        return Ok(());
    }
    let until = tokio::time::Instant::now() + deadline;
    let mut last = format!("no GPU sample was taken after {} stopped", gone.what);
    loop {
        let snap = Arc::clone(&snapshots.borrow_and_update());
        if snap.taken.is_some_and(|t| t > gone.after) {
            match check(&snap, device, gone, tolerance_mib) {
                Ok(()) => return Ok(()),
                Err(why) => last = why,
            }
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() {
                return Err(format!("GPU sampling stopped while waiting for {} to free its memory", gone.what));
            },
            _ = tokio::time::sleep_until(until) => {
                return Err(format!(
                    "the memory of {} did not come back within {:.0} s (arbiter.teardown_timeout_s): {last}",
                    gone.what,
                    deadline.as_secs_f64()
                ));
            }
        }
    }
}

/// One sample's verdict.
pub fn check(snap: &Snapshot, device: u32, gone: &Gone, tolerance_mib: u64) -> Result<(), String> {
    if let Some(error) = &snap.error {
        return Err(format!("GPU status unavailable: {error}"));
    }
    let lingering: Vec<String> = snap
        .processes
        .iter()
        .filter(|p| p.gpu_index == device)
        .filter(|p| {
            gone.pids.contains(&p.pid) || gone.pgid.is_some_and(|g| process_group(p.pid) == Some(g))
        })
        .map(|p| format!("pid {} ({}, {} MiB)", p.pid, p.name, p.used_memory_mib))
        .collect();
    if !lingering.is_empty() {
        return Err(format!("{} still on the GPU", lingering.join(", ")));
    }
    if let Some(watch) = &gone.watch {
        let held: Vec<&crate::gpu::GpuProcess> = snap
            .processes
            .iter()
            .filter(|p| p.gpu_index == device && p.watch.as_deref() == Some(watch.as_str()))
            .collect();
        let total = held
            .iter()
            .map(|p| p.used_memory_mib)
            .fold(0, u64::saturating_add);
        if total > tolerance_mib {
            let pids: Vec<String> = held
                .iter()
                .map(|p| format!("pid {} ({} MiB)", p.pid, p.used_memory_mib))
                .collect();
            return Err(format!(
                "{watch} still holds {total} MiB after its release call: {}",
                pids.join(", ")
            ));
        }
    }
    let Some(gpu) = snap.gpus.iter().find(|g| g.index == device) else {
        return Err(format!("GPU {device} is not in the sample"));
    };
    if let Some(before) = gone.baseline_used_mib {
        let others_mib = gone.listed_before.as_ref().map_or(0, |listed| {
            snap.processes
                .iter()
                .filter(|p| p.gpu_index == device && !listed.contains(&p.pid))
                .map(|p| p.used_memory_mib)
                .fold(0, u64::saturating_add)
        });
        let used = gpu.memory_used_mib.saturating_sub(others_mib);
        if used > before.saturating_add(tolerance_mib) {
            let holders: Vec<String> = snap
                .processes
                .iter()
                .filter(|p| p.gpu_index == device)
                .map(|p| {
                    format!(
                        "pid {} {} MiB: {}",
                        p.pid,
                        p.used_memory_mib,
                        short(&p.command, &p.name)
                    )
                })
                .collect();
            let others = if others_mib > 0 {
                format!(" (not counting {others_mib} MiB of processes that came since)")
            } else {
                String::new()
            };
            return Err(format!(
                "{} MiB used{others}, {} MiB before {} started (tolerance {} MiB); on the GPU: {}",
                used,
                before,
                gone.what,
                tolerance_mib,
                if holders.is_empty() {
                    "no listed process (memory held by the driver or a dead process)".into()
                } else {
                    holders.join("; ")
                }
            ));
        }
    }
    Ok(())
}

/// A process for a reason line: its command line (its name when that is empty or hidden), on
/// one line, at most 120 characters.
fn short(command: &str, name: &str) -> String {
    let c = if command.is_empty() { name } else { command };
    let mut out: String = c
        .chars()
        .take(120)
        .map(|ch| if ch.is_control() { ' ' } else { ch })
        .collect();
    if c.chars().nth(120).is_some() {
        out.push('…');
    }
    out
}

/// The process group of `pid` (field 5 of `/proc/PID/stat`), while it lives.
pub fn process_group(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_shown_on_one_line_cut_between_characters() {
        // Byte 120 inside an `é`: the whole line came back (20 000 characters in a reason).
        let long = format!("{}{}", "a".repeat(119), "é".repeat(20_000));
        let shown = short(&long, "python3");
        assert_eq!(shown.chars().count(), 121);
        assert!(shown.ends_with("é…"), "{shown}");
        assert_eq!(short("run\nme\tnow", "x"), "run me now");
        assert_eq!(short("", "python3"), "python3");
    }
    use crate::gpu::{Decision, GpuInfo, GpuProcess};

    fn snap(used: u64, pids: &[u32]) -> Snapshot {
        Snapshot {
            taken: Some(Instant::now()),
            taken_wall: None,
            gpus: vec![GpuInfo {
                index: 0,
                uuid: String::new(),
                name: "fake".into(),
                utilization: 0,
                memory_used_mib: used,
                memory_total_mib: 32_000,
                memory_free_mib: 32_000 - used,
                temperature: 0,
                power_draw: 0.0,
            }],
            unmeasured: Vec::new(),
            processes: pids
                .iter()
                .map(|&pid| GpuProcess {
                    pid,
                    name: "python3".into(),
                    used_memory_mib: 1000,
                    command: String::new(),
                    command_pid: None,
                    command_note: None,
                    gpu_index: 0,
                    worker: None,
                    service: None,
                    watch: None,
                })
                .collect(),
            watched: Vec::new(),
            error: None,
            decision: Decision::Idle,
            reason: String::new(),
        }
    }

    #[test]
    fn pids_and_memory_must_be_gone() {
        let gone = Gone {
            what: "service x".into(),
            pids: vec![42],
            pgid: None,
            baseline_used_mib: Some(500),
            listed_before: None,
            watch: None,
            after: Instant::now(),
        };
        assert!(check(&snap(500, &[42]), 0, &gone, 256)
            .unwrap_err()
            .contains("pid 42"));
        let err = check(&snap(9000, &[]), 0, &gone, 256).unwrap_err();
        assert!(err.contains("9000 MiB used"), "{err}");
        assert!(check(&snap(700, &[7]), 0, &gone, 256).is_ok());
    }

    #[test]
    fn with_shared_vram_a_process_that_came_since_is_not_the_holders() {
        let mut gone = Gone {
            what: "service x".into(),
            pids: vec![42],
            pgid: None,
            baseline_used_mib: Some(500),
            listed_before: Some(vec![7]),
            watch: None,
            after: Instant::now(),
        };
        // pid 7 was there before; pid 9 (1000 MiB) came with a lease beside the service.
        assert!(check(&snap(1500, &[7, 9]), 0, &gone, 256).is_ok());
        let err = check(&snap(2600, &[7, 9]), 0, &gone, 256).unwrap_err();
        assert!(
            err.contains("1600 MiB used (not counting 1000 MiB"),
            "{err}"
        );
        gone.listed_before = None;
        assert!(check(&snap(1500, &[7, 9]), 0, &gone, 256).is_err());
    }
}
