//! VRAM footprints: what each worker and service needs on the GPU. The configured `vram_mib` is
//! the first guess; once the sampler has seen the holder's processes, the peak measured for them
//! replaces it. Peaks are kept in `<state_dir>/footprints.json`, so a restart (or a holder that
//! has not run yet since) still knows how much room to make.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuProcess, Snapshot};

/// Measured peaks by holder key (`worker asr`, `service vllm`).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    peaks_mib: BTreeMap<String, u64>,
}

#[derive(Debug)]
pub struct Footprints {
    /// `None`: nowhere to keep them (kept in memory only).
    file: Option<PathBuf>,
    /// std Mutex: a map lookup or insert, never held across `.await`.
    peaks: Mutex<BTreeMap<String, u64>>,
}

impl Footprints {
    /// Reads the state file; a missing or unreadable one starts empty (with a warning when it
    /// exists but cannot be read, so a corrupt file never stops the server).
    pub fn load(file: Option<PathBuf>) -> Footprints {
        /// A few bytes per service: anything larger is not ours.
        const FILE_MAX: u64 = 1 << 20;
        let peaks = file
            .as_ref()
            .and_then(|path| match crate::files::read_regular(path, FILE_MAX) {
                Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                    Ok(saved) => Some(saved.peaks_mib),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable footprint file");
                        None
                    }
                },
                Err(e) if e.not_found() => None,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read the footprint file");
                    None
                }
            })
            .unwrap_or_default();
        Footprints {
            file,
            peaks: Mutex::new(peaks),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.peaks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The measured peak of `key`, if it was ever seen.
    pub fn measured(&self, key: &str) -> Option<u64> {
        self.lock().get(key).copied()
    }

    /// What `key` needs: its measured peak, else the configured footprint (0 = unknown).
    pub fn need(&self, key: &str, configured_mib: u64) -> Option<u64> {
        self.measured(key)
            .or((configured_mib > 0).then_some(configured_mib))
    }

    /// Records the memory `owner`'s processes use in `snap` as a new peak for `key` when
    /// higher; persists the file when a peak grew. Returns the memory seen now. Its processes:
    /// those in its process group `owner.pgid`, and those the sample gives to it (a child it
    /// started in a session of its own: `/status` counts it as the owner's, so does this).
    pub fn observe(&self, key: &str, owner: Owner<'_>, device: u32, snap: &Snapshot) -> u64 {
        let used: u64 = snap
            .processes
            .iter()
            .filter(|p| p.gpu_index == device)
            .filter(|p| owner.owns(p))
            .map(|p| p.used_memory_mib)
            .fold(0, u64::saturating_add);
        if used == 0 {
            return 0;
        }
        let grew = {
            let mut peaks = self.lock();
            let peak = peaks.entry(key.to_string()).or_insert(0);
            let grew = used > *peak;
            *peak = (*peak).max(used);
            grew.then(|| peaks.clone())
        };
        if let Some(peaks) = grew {
            self.save(peaks);
        }
        used
    }

    /// Writes the file atomically (temp file + rename); failures are logged, never fatal.
    fn save(&self, peaks_mib: BTreeMap<String, u64>) {
        let Some(path) = &self.file else { return };
        let write = || -> std::io::Result<()> {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            std::fs::create_dir_all(dir)?;
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            serde_json::to_writer_pretty(&mut tmp, &Saved { peaks_mib })?;
            tmp.persist(path).map_err(|e| e.error)?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::warn!(path = %path.display(), error = %e, "cannot save measured footprints");
        }
    }
}

/// Whose memory [`Footprints::observe`] measures.
#[derive(Debug, Clone, Copy)]
pub enum Owner<'a> {
    /// A worker: its process group, and the processes the sample names it the worker of.
    Worker { pgid: u32, name: &'a str },
    /// A `[[services]]` entry: likewise.
    Service { pgid: u32, name: &'a str },
}

impl Owner<'_> {
    fn owns(&self, p: &GpuProcess) -> bool {
        let (pgid, named) = match *self {
            Owner::Worker { pgid, name } => (pgid, p.worker.as_deref() == Some(name)),
            Owner::Service { pgid, name } => (pgid, p.service.as_deref() == Some(name)),
        };
        named || p.pid == pgid || super::teardown::process_group(p.pid) == Some(pgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pid: u32, mib: u64) -> Snapshot {
        Snapshot {
            processes: vec![GpuProcess {
                pid,
                gpu_index: 0,
                used_memory_mib: mib,
                ..GpuProcess::default()
            }],
            ..Snapshot::empty("test")
        }
    }

    #[test]
    fn the_peak_replaces_the_guess_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state/footprints.json");
        let f = Footprints::load(Some(file.clone()));
        assert_eq!(f.need("worker asr", 14_000), Some(14_000));
        assert_eq!(f.need("worker asr", 0), None);
        let me = std::process::id();
        let asr = Owner::Worker {
            pgid: me,
            name: "asr",
        };
        assert_eq!(f.observe("worker asr", asr, 0, &snap(me, 900)), 900);
        f.observe("worker asr", asr, 0, &snap(me, 1200));
        f.observe("worker asr", asr, 0, &snap(me, 300));
        assert_eq!(f.need("worker asr", 14_000), Some(1200));
        let again = Footprints::load(Some(file.clone()));
        assert_eq!(again.measured("worker asr"), Some(1200));
        std::fs::write(&file, "not json").unwrap();
        assert_eq!(Footprints::load(Some(file)).measured("worker asr"), None);
    }

    #[test]
    fn a_child_in_a_session_of_its_own_is_measured_with_its_service() {
        // A service whose launcher starts its engine with `setsid`: `/status` gave the child to
        // the service, the footprint counted the launcher's 10 MiB only, and the GPU was
        // over-committed on that figure.
        let f = Footprints::load(None);
        let launcher = std::process::id();
        let mut sample = snap(launcher, 10);
        sample.processes.push(GpuProcess {
            pid: u32::MAX - 1, // in no process group of ours
            gpu_index: 0,
            used_memory_mib: 16_000,
            service: Some("vllm".into()),
            ..GpuProcess::default()
        });
        let vllm = Owner::Service {
            pgid: launcher,
            name: "vllm",
        };
        assert_eq!(f.observe("service vllm", vllm, 0, &sample), 16_010);
        let other = Owner::Service {
            pgid: u32::MAX - 2,
            name: "comfy",
        };
        assert_eq!(f.observe("service comfy", other, 0, &sample), 0);
    }
}
