//! Adopted orphans: `gpuhost serve` (and `gpuhost lease` for its program, `gpuhost run` and a local
//! `gpuhost transcribe` for their workers) is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a
//! descendant that left its worker's or service's process group (`setsid`, `setpgid`, a daemon's
//! double fork) becomes the host's child when its parent dies, not init's. The sweep finds the
//! host's children it did not start and kills them (their groups too), and reaps those that have
//! exited: what a group kill cannot reach still does not outlive the worker it came from.
//!
//! The pids the host starts are recorded at spawn, under the lock the sweep takes, so a child
//! between fork and record is never taken for an orphan. The record is process-wide, as the pid
//! and the subreaper flag are.

use std::collections::BTreeSet;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use crate::gpu::procfs::ProcFs;

/// Pids this process started and that may still be its children. std Mutex: held for one fork
/// or one sweep of `/proc`, never across an await.
static STARTED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// How often the host looks for adopted children besides each SIGCHLD (a reparenting sends none).
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Makes this process the subreaper of everything it starts. Call once, from the command that
/// starts workers or a leased program (a library or test process must not adopt its callers'
/// orphans).
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: plain prctl on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process adopts orphaned descendants (then it must sweep them).
pub fn is_subreaper() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER writes one int through the pointer.
    let ok = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    ok == 0 && flag != 0
}

fn started() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    STARTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `spawn` (a fork and exec) with the record locked, and records the child it started.
pub(super) fn recorded<T>(
    spawn: impl FnOnce() -> io::Result<T>,
    pid_of: impl Fn(&T) -> Option<u32>,
) -> io::Result<T> {
    let mut started = started();
    let spawned = spawn()?;
    if let Some(pid) = pid_of(&spawned) {
        started.insert(pid);
    }
    Ok(spawned)
}

/// Records a child started outside `recorded` (the orphan guard, forked before any thread).
pub(super) fn record(pid: u32) {
    started().insert(pid);
}

/// This process's children it did not start, as (pid, exited), by what `/proc` positively says:
/// `None` when `/proc` cannot be listed (no descriptors left, say), and a process whose parent
/// cannot be read is left out. Prunes the record of started pids that are gone.
fn strays(proc: &ProcFs, started: &mut BTreeSet<u32>) -> Option<Vec<(u32, bool)>> {
    let me = std::process::id();
    if !proc.is_own() {
        return None; // another PID namespace's /proc: its pids are not our processes
    }
    let children = proc.children_or_scan(me)?;
    // Forgotten only once its /proc entry is gone (reaped), never because a read failed.
    started.retain(|&pid| !proc.gone(pid));
    let strays = children
        .into_iter()
        .filter(|pid| !started.contains(pid))
        .map(|pid| (pid, proc.zombie(pid)))
        .collect();
    Some(strays)
}

/// The children of this process it did not start that still run: what it adopted as subreaper.
pub fn adopted(proc: &ProcFs) -> Vec<u32> {
    let mut started = started();
    let strays = strays(proc, &mut started).unwrap_or_default();
    strays
        .into_iter()
        .filter(|&(_, exited)| !exited)
        .map(|(pid, _)| pid)
        .collect()
}

/// Reaps the adopted children that have exited (zombies; none of them ours to wait for).
pub fn reap(proc: &ProcFs) {
    let mut started = started();
    let strays = strays(proc, &mut started).unwrap_or_default();
    for (pid, _) in strays.into_iter().filter(|&(_, exited)| exited) {
        reap_one(pid);
    }
}

/// Reaps one adopted child that has exited (a zombie).
fn reap_one(pid: u32) {
    if let Ok(raw) = libc::pid_t::try_from(pid) {
        // SAFETY: waits for this one pid only, an adopted child no other code waits for.
        unsafe { libc::waitpid(raw, std::ptr::null_mut(), libc::WNOHANG) };
    }
}

/// One sweep: reaps the adopted children that have exited and kills those still running, unless
/// they are still in the process group of a live child the host started (a worker's helper whose
/// own parent exited: the worker's group kill takes it when the time comes). Only what `/proc`
/// positively shows is acted on. Returns the pids killed.
pub fn sweep(proc: &ProcFs) -> Vec<u32> {
    let me = std::process::id();
    let mut started = started();
    let Some(strays) = strays(proc, &mut started) else {
        return Vec::new();
    };
    let mut killed = Vec::new();
    for (pid, exited) in strays {
        if exited {
            reap_one(pid);
            continue;
        }
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            continue;
        };
        let Some(group) = proc.pgid(pid) else {
            continue; // unreadable: left for the next sweep
        };
        let in_live_group = group != pid
            && started.contains(&group)
            && proc.ppid(group) == Some(me)
            && !proc.zombie(group);
        if in_live_group {
            continue;
        }
        let command = proc.cmdline(pid).unwrap_or_default();
        if group == pid {
            tracing::warn!(pid, %command, "killing an orphan in a process group of its own (detached by a program gpuhost started)");
        } else if !started.contains(&group) {
            // The group's leader is gone: a stopped worker's or service's helper still ending
            // after the group kill, or a daemon's double fork.
            tracing::warn!(pid, %command, group, "killing an orphan whose process group's leader has exited (a helper of a stopped worker or service, or a detached daemon)");
        } else {
            // In the group of a worker that has exited (a helper still ending at its stop):
            // the group kill's anyway.
            tracing::debug!(pid, %command, "killing an orphan of an exited worker or service");
        }
        // SAFETY: signals to our own unreaped child (its pid cannot be reused meanwhile) and to
        // the group it leads, if it leads one (a group id is never a pid in use elsewhere).
        unsafe {
            libc::killpg(raw, libc::SIGKILL);
            libc::kill(raw, libc::SIGKILL);
        }
        killed.push(pid);
    }
    killed
}

/// For a one-shot command (`gpuhost run`, `gpuhost transcribe` without a server) whose workers
/// have stopped: kills what they left behind and waits, 2 s at most, until it is gone and reaped.
/// Without it a daemon a worker detached would outlive the command unless the orphan guard had
/// happened to see it.
pub fn sweep_before_exit(proc: &ProcFs) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    sweep(proc);
    while !adopted(proc).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        sweep(proc);
    }
    reap(proc);
}

/// Sweeps at every SIGCHLD and every 2 s until dropped (the server aborts it), and mends the
/// orphan guard.
/// A killed orphan's exit is the next SIGCHLD, whose sweep reaps it.
pub async fn sweep_forever(proc: ProcFs) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut children = match signal(SignalKind::child()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGCHLD; sweeping orphans on a timer only");
            None
        }
    };
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(()) = async { children.as_mut()?.recv().await } => {}
        }
        // A guard that died is reaped and replaced first (its SIGCHLD is one of these).
        super::guard::mend();
        let proc = proc.clone();
        let _ = tokio::task::spawn_blocking(move || sweep(&proc)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_proc_forgets_nothing_and_kills_nothing() {
        // A started pid that no longer exists (pids stay below 2^22 on Linux).
        let ghost = 999_999_999;
        record(ghost);
        assert!(sweep(&ProcFs::new("/nonexistent/proc")).is_empty());
        assert!(adopted(&ProcFs::new("/nonexistent/proc")).is_empty());
        assert!(started().contains(&ghost), "forgotten on a failed read");
        // Another PID namespace's /proc (its `self` is not us) is not read at all.
        let foreign = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("1", foreign.path().join("self")).unwrap();
        assert!(sweep(&ProcFs::new(foreign.path())).is_empty());
        assert!(started().contains(&ghost), "forgotten on a foreign /proc");
        // Once /proc says it is gone, it is forgotten (an empty tree: nothing else is touched).
        let empty = tempfile::tempdir().unwrap();
        let me = std::process::id().to_string();
        std::os::unix::fs::symlink(&me, empty.path().join("self")).unwrap();
        sweep(&ProcFs::new(empty.path()));
        assert!(!started().contains(&ghost));
    }
}
