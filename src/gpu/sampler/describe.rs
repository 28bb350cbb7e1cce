//! What a raw sample becomes: its processes described from `/proc` (command line, owning
//! worker, watched service) and the device's used memory reconciled with what they hold.

use std::collections::HashMap;

use super::super::procfs::ProcFs;
use super::super::{GpuInfo, GpuProcess, RawProcess};
use crate::config::WatchConfig;

/// The process groups gpuhost started, by their leader's pid.
pub(super) struct Owners<'a> {
    pub(super) workers: &'a HashMap<u32, String>,
    pub(super) services: &'a HashMap<u32, String>,
}

/// The listed GPU processes with what `/proc` tells of them: command line (the parent's when
/// empty), owning worker or service (its own pid or an ancestor's), watched service.
pub(super) fn describe(
    procfs: &ProcFs,
    watch: &[WatchConfig],
    owners: &Owners,
    listed: &[RawProcess],
) -> Vec<GpuProcess> {
    listed
        .iter()
        .map(|p| {
            let cmd = procfs.command(p.pid);
            let lineage = procfs.lineage(p.pid);
            let owner =
                |of: &HashMap<u32, String>| lineage.iter().find_map(|pid| of.get(pid).cloned());
            let watch = watch
                .iter()
                .find(|w| cmd.command.contains(&w.pattern))
                .map(|w| w.name.clone());
            GpuProcess {
                pid: p.pid,
                name: p
                    .name
                    .clone()
                    .or_else(|| procfs.comm(p.pid))
                    .unwrap_or_default(),
                used_memory_mib: p.used_memory_mib.unwrap_or(0),
                // Matched whole above, shown cut.
                command: crate::text::cut(cmd.command, COMMAND_MAX),
                command_pid: cmd.from_pid,
                command_note: cmd.note,
                gpu_index: p.gpu_index,
                worker: owner(owners.workers),
                service: owner(owners.services),
                watch,
            }
        })
        .collect()
}

/// The listed GPU processes as the backend gives them, when `/proc` could not be read: no
/// command line, an owner only where the pid itself is a worker's or a service's.
pub(super) fn undescribed(owners: &Owners, listed: &[RawProcess]) -> Vec<GpuProcess> {
    listed
        .iter()
        .map(|p| GpuProcess {
            pid: p.pid,
            name: p.name.clone().unwrap_or_default(),
            used_memory_mib: p.used_memory_mib.unwrap_or(0),
            command_note: Some("not read: /proc did not answer (see error)".into()),
            gpu_index: p.gpu_index,
            worker: owners.workers.get(&p.pid).cloned(),
            service: owners.services.get(&p.pid).cloned(),
            ..GpuProcess::default()
        })
        .collect()
}

/// One sample is two readings (the process list, the device's memory), taken apart: a process
/// listed with memory the device total does not count yet must not make room look free. Used
/// memory is at least what the listed processes hold.
pub(super) fn reconcile(gpus: &mut [GpuInfo], processes: &[GpuProcess]) {
    for g in gpus {
        let listed: u64 = processes
            .iter()
            .filter(|p| p.gpu_index == g.index)
            .map(|p| p.used_memory_mib)
            .fold(0, u64::saturating_add);
        let used = listed.min(g.memory_total_mib);
        // (A driver that reports more used than total is left as it says.)
        if used > g.memory_used_mib {
            // What the listing adds comes off the driver's free figure, which already leaves
            // out the memory it reserves (616 MiB on an H200).
            let more = used - g.memory_used_mib;
            g.memory_used_mib = used;
            g.memory_free_mib = g.memory_free_mib.saturating_sub(more);
        }
        g.memory_free_mib = g.memory_free_mib.min(g.memory_total_mib);
    }
}

/// The longest command line shown, in characters: `/status` is fetched every few seconds (a
/// process with an 8 MiB command line made it 8 MB), and a command line that long is data.
const COMMAND_MAX: usize = 8192;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_command_line_is_matched_whole_and_shown_cut() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("42");
        std::fs::create_dir_all(&at).unwrap();
        // A classpath of 20 000 characters before what names the program.
        let line = format!("java\0-cp\0{}\0org.vllm.Server\0", "a:".repeat(10_000));
        std::fs::write(at.join("cmdline"), line).unwrap();
        std::fs::write(at.join("status"), "Name:\tjava\nPPid:\t1\n").unwrap();
        let watch = [WatchConfig {
            name: "vllm".into(),
            pattern: "org.vllm.Server".into(),
            health_url: None,
            release: None,
            load_timeout_s: 600.0,
        }];
        let empty = HashMap::new();
        let owners = Owners {
            workers: &empty,
            services: &empty,
        };
        let listed = [RawProcess {
            pid: 42,
            name: None,
            used_memory_mib: Some(100),
            gpu_index: 0,
        }];
        let p = &describe(&ProcFs::new(dir.path()), &watch, &owners, &listed)[0];
        assert_eq!(p.watch.as_deref(), Some("vllm"));
        assert!(p.command.chars().count() < COMMAND_MAX + 50);
        assert!(p.command.ends_with("characters left out)"));
    }
}
