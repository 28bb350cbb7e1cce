//! Job folders: one per job in the temp dir (or in memory for small uploads), named after the
//! host's pid so that a later host can sweep what a dead one left behind.

use std::path::PathBuf;

use crate::audio::{self, Source};
use crate::Config;

/// Job folders are `gpuhost-job-<host pid>-<random>`: the pid tells a live host's folders from
/// the leftovers of one that died.
const JOB_PREFIX: &str = "gpuhost-job-";

/// A fresh job folder in the configured temp dir.
pub fn job_dir(config: &Config) -> std::io::Result<tempfile::TempDir> {
    job_dir_in(config.temp_dir())
}

/// A fresh job folder for `upload`: in `limits.small_temp_dir` (memory) when it is a small
/// upload that needs no decoding, so the folder stays as small as the upload; in the temp dir
/// otherwise, or when the small one cannot take it.
pub fn job_dir_for(config: &Config, upload: &Source) -> std::io::Result<tempfile::TempDir> {
    if let Some(small) = config.small_temp_dir() {
        // A small folder (often a few MiB of shared memory in a container) with too little room
        // left for the copy and a result: the temp dir takes it.
        let roomy = || free_bytes(&small).is_none_or(|free| free >= SMALL_ROOM);
        if audio::is_small_and_normalized(upload) && roomy() {
            match job_dir_in(small) {
                Ok(dir) => return Ok(dir),
                Err(e) => tracing::debug!(error = %e, "small_temp_dir unusable; using temp_dir"),
            }
        }
    }
    job_dir(config)
}

/// Room a small job's folder must find free in `small_temp_dir`: its copy (at most 256 KiB), a
/// result and those of a few others.
const SMALL_ROOM: u64 = 4 << 20;

/// A job folder, its owner's only (0700): uploads are other people's speech, and the folder
/// may be in a shared `/tmp` or `/dev/shm`.
fn job_dir_in(dir: PathBuf) -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    in_made_dir(&dir, || {
        tempfile::Builder::new()
            .prefix(&format!("{JOB_PREFIX}{}-", std::process::id()))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&dir)
    })
    .map_err(without_path)
}

/// `make` (something created in `dir`), with `dir` made first when it is gone (a tmp cleaner,
/// a first start) and `make` tried again. Jobs and the `/health` probe make it alike: a probe
/// that called a missing dir unusable kept `/ready` at 503, so no job came to make it.
fn in_made_dir<T>(
    dir: &std::path::Path,
    make: impl Fn() -> std::io::Result<T>,
) -> std::io::Result<T> {
    match make() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            make()
        }
        made => made,
    }
}

/// The temp dir's filesystem would be left with less than `limits.min_free_bytes` free: the
/// upload or decode is refused instead of filling the disk under the jobs already running (and
/// the rest of the box).
#[derive(Debug, Clone, Copy)]
pub struct NoSpace {
    /// Bytes free when it was looked at.
    pub free: u64,
    /// `limits.min_free_bytes`.
    pub keep: u64,
    /// Bytes about to be written (0: the disk is already below what is kept free).
    pub more: u64,
}

impl std::fmt::Display for NoSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        if self.free >= self.keep && self.more == 0 {
            return write!(
                f,
                "the temp dir's disk is full ({:.1} MiB free): try again once it has room",
                mib(self.free)
            );
        }
        write!(f, "the temp dir's disk has {:.1} MiB free", mib(self.free))?;
        if self.more > 0 {
            write!(
                f,
                "; {:.1} MiB more of this upload would leave",
                mib(self.more)
            )?;
        } else {
            write!(f, ", which is")?;
        }
        write!(
            f,
            " less than the {:.1} MiB kept free (limits.min_free_bytes): try again once running \
             jobs have finished or the disk has room",
            mib(self.keep)
        )
    }
}

impl std::error::Error for NoSpace {}

/// Whether a failed write is the disk, or the user's quota, being full (ENOSPC, EDQUOT).
pub fn is_disk_full(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(e.kind(), StorageFull | QuotaExceeded)
}

/// `e` without the path tempfile puts in its errors (`… at path "/tmp/gpuhost-job-…"`: a
/// message may reach a client, and paths on the server are none of its business). Its kind
/// stays, which is what tells a full disk (`is_disk_full`): tempfile keeps no OS error number.
fn without_path(e: std::io::Error) -> std::io::Error {
    if e.raw_os_error().is_some() {
        return e;
    }
    let text = e.to_string();
    let text = text
        .split(" at path ")
        .next()
        .unwrap_or_default()
        .to_string();
    std::io::Error::new(e.kind(), text)
}

/// What a client is told when a write of the server's own found the disk full.
pub const DISK_FULL: &str = "the server's temp dir is full (no space left on device, or the \
                             quota is used up): try again once running jobs have finished";

/// Bytes an unprivileged writer may still write on the filesystem holding `path` (`None`: it
/// cannot be told, and nothing is refused for it).
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path and a zeroed struct the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// `Err` when writing `more` bytes under `dir` would leave less than `keep` bytes free there
/// (`keep` 0: the check is off).
pub fn room_for(dir: &std::path::Path, more: u64, keep: u64) -> Result<(), NoSpace> {
    match free_bytes(dir) {
        Some(free) if keep > 0 && free < keep.saturating_add(more) => {
            Err(NoSpace { free, keep, more })
        }
        _ => Ok(()),
    }
}

/// After a write under `dir` failed: whether the disk is why (nearly full; a decoder child
/// reports ENOSPC only as text). Below `keep` alone is no reason: a file that is not audio
/// stays a 415.
pub fn out_of_room(dir: &std::path::Path, keep: u64) -> Option<NoSpace> {
    const NEARLY_FULL: u64 = 1 << 20;
    free_bytes(dir)
        .filter(|&free| free < NEARLY_FULL)
        .map(|free| NoSpace {
            free,
            keep,
            more: 0,
        })
}

/// Removes job folders left behind by hosts that are no longer running (a crash or SIGKILL
/// skips the cleanup a finished job does). Returns how many were removed.
pub fn sweep_stale(temp_dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(temp_dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(JOB_PREFIX)) else {
            continue;
        };
        let owner = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        let modified = entry.metadata().and_then(|m| m.modified()).ok();
        let stale = match owner {
            Some(pid) => owner_gone(pid, modified),
            // Older hosts named folders without their pid: stale once an hour old.
            None => modified
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(3600)),
        };
        if stale
            && entry.file_type().is_ok_and(|t| t.is_dir())
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Whether the host that made a folder named after `pid`, last changed at `modified`, is gone:
/// no process has that pid, or it is this very process and the folder is older than it (a
/// predecessor's: a container's host often gets the same pid at every start; this runs as a
/// host starts, and a process may hold more than one, as the tests do). A pid that another live
/// process has now is left alone: its folder may be a live host's.
fn owner_gone(pid: u32, modified: Option<std::time::SystemTime>) -> bool {
    if pid != std::process::id() {
        return !std::path::Path::new(&format!("/proc/{pid}")).exists();
    }
    // The boot clock's figures are read together with the wall clock's: no clock step between.
    let Some(started) = own_start() else {
        return false;
    };
    modified.is_some_and(|m| m + std::time::Duration::from_secs(2) < started)
}

/// When this process started, by the wall clock: now less its age (its start in clock ticks
/// since boot, against the time since boot).
fn own_start() -> Option<std::time::SystemTime> {
    let ticks = crate::gpu::procfs::ProcFs::new("/proc").start_time(std::process::id())?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)?;
    let age = (uptime - ticks as f64 / hz as f64).max(0.0);
    std::time::SystemTime::now().checked_sub(std::time::Duration::from_secs_f64(age))
}

/// Whether job folders can be made in `temp_dir` now (it exists or can be made, as a job makes
/// it; it is writable and has room for a small file). `Err` says why not.
/// (`limits.min_free_bytes` is not asked here: `/health` and `/ready` stay up while uploads are
/// refused for want of room.)
pub fn temp_dir_usable(temp_dir: &std::path::Path) -> Result<(), String> {
    use std::io::Write;
    let mut probe = in_made_dir(temp_dir, || {
        tempfile::Builder::new()
            .prefix(".gpuhost-probe-")
            .tempfile_in(temp_dir)
    })
    .map_err(|e| {
        format!(
            "cannot create files in the temp dir (limits.temp_dir): {}",
            e.kind()
        )
    })?;
    probe
        .write_all(&[0u8; 4096])
        .and_then(|()| probe.as_file().sync_data())
        .map_err(|e| {
            format!(
                "cannot write to the temp dir (limits.temp_dir): {}",
                e.kind()
            )
        })
}

/// Replaces the job folder's path in a message meant for a client: paths on the server are
/// none of its business.
pub fn redact(message: &str, dir: &std::path::Path) -> String {
    message.replace(&dir.display().to_string(), "<job>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_folder_that_cannot_be_made_names_no_path_and_keeps_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let e = job_dir_in(file.clone()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotADirectory, "{e}");
        assert!(e.to_string().contains("os error 20"), "{e}");
        assert!(
            !e.to_string().contains(&*dir.path().to_string_lossy()),
            "{e}"
        );
        // A full disk is told as one through the same unwrapping (ENOSPC, or its kind alone).
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(
            libc::ENOSPC
        )));
        assert!(is_disk_full(&std::io::Error::from(
            std::io::ErrorKind::StorageFull
        )));
        assert!(!is_disk_full(&e));
    }

    #[test]
    fn folders_of_hosts_that_are_gone_are_swept_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: String, age_s: u64| {
            let path = dir.path().join(name);
            std::fs::create_dir(&path).unwrap();
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age_s);
            std::fs::File::open(&path)
                .unwrap()
                .set_modified(when)
                .unwrap();
            path
        };
        let me = std::process::id();
        // This process's pid on a folder older than it: a predecessor's with the same pid.
        let own_old = make(format!("{JOB_PREFIX}{me}-old"), 10 * 365 * 24 * 3600);
        // This process's own (a host in it made it since it started).
        let own_new = make(format!("{JOB_PREFIX}{me}-new"), 0);
        let dead = make(format!("{JOB_PREFIX}2147483646-dead"), 0);
        // The pid of a live process (the first one): it may be a live host's.
        let live = make(format!("{JOB_PREFIX}1-live"), 10 * 365 * 24 * 3600);
        assert_eq!(sweep_stale(dir.path()), 2);
        assert!(!own_old.exists() && !dead.exists());
        assert!(own_new.exists() && live.exists());
    }

    #[test]
    fn room_that_an_upload_would_take_is_said_as_such() {
        let mib = 1 << 20;
        let short = NoSpace {
            free: 100 * mib,
            keep: 64 * mib,
            more: 50 * mib,
        };
        let text = short.to_string();
        assert!(text.contains("50.0 MiB more of this upload"), "{text}");
        assert!(!text.contains("disk is full"), "{text}");
    }
}
