//! Adopted orphans: `gpuhost serve` (and `gpuhost lease`, for its program) is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a
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

/// Makes this process the subreaper of everything it starts. Call once, from `main`, for the
/// long-running server only (a library or test process must not adopt its callers' orphans).
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

/// The children of this process it did not start that still run: what it adopted as subreaper.
pub fn adopted(proc: &ProcFs) -> Vec<u32> {
    let me = std::process::id();
    let started = started();
    proc.pids()
        .into_iter()
        .filter(|&pid| proc.ppid(pid) == Some(me) && !started.contains(&pid) && !proc.zombie(pid))
        .collect()
}

/// One sweep: kills every child of this process it did not start, reaps those that have exited,
/// and forgets started pids that are no longer its children. Returns the pids killed.
pub fn sweep(proc: &ProcFs) -> Vec<u32> {
    let me = std::process::id();
    let mut started = started();
    let children: Vec<u32> = proc
        .pids()
        .into_iter()
        .filter(|&pid| proc.ppid(pid) == Some(me))
        .collect();
    started.retain(|pid| children.contains(pid));
    let mut killed = Vec::new();
    for pid in children.into_iter().filter(|pid| !started.contains(pid)) {
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            continue;
        };
        if proc.zombie(pid) {
            // SAFETY: waits for this one pid only, an adopted child no other code waits for.
            unsafe { libc::waitpid(raw, std::ptr::null_mut(), libc::WNOHANG) };
            continue;
        }
        let command = proc.cmdline(pid).unwrap_or_default();
        if proc.pgid(pid) == Some(pid) {
            tracing::warn!(pid, %command, "killing an orphan a worker or service left outside its process group");
        } else {
            // Still in a worker's group, orphaned as its leader exited: the group kill's anyway.
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

/// Sweeps at every SIGCHLD and every 2 s until dropped (the server aborts it).
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
        let proc = proc.clone();
        let _ = tokio::task::spawn_blocking(move || sweep(&proc)).await;
    }
}
