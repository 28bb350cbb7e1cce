//! A running child's process group: signals to the whole group or its leader, waiting, signal →
//! grace → kill, and SIGKILL to the group when its owner drops it.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use super::{guard, ProcessGroup};

pub(super) fn kill_group(pid: u32, signal: libc::c_int) {
    // SAFETY: plain syscall; a stale group id only yields ESRCH.
    unsafe {
        libc::killpg(pid as libc::pid_t, signal);
    }
}

impl ProcessGroup {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` to the whole group (no-op once reaped).
    pub fn signal(&self, signal: libc::c_int) {
        if self.exited.is_none() {
            kill_group(self.pid, signal);
        }
    }

    /// Sends `signal` to the group leader only (the worker itself, not its helpers).
    pub fn signal_leader(&self, signal: libc::c_int) {
        if self.exited.is_none() {
            // SAFETY: plain syscall; the leader is our unreaped child, so the pid is not reused.
            unsafe {
                libc::kill(self.pid as libc::pid_t, signal);
            }
        }
    }

    /// Waits for the leader to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.exited = Some(status);
        // Whatever the leader left behind in its group goes with it.
        kill_group(self.pid, libc::SIGKILL);
        guard::unregister(self.pid);
        Ok(status)
    }

    /// Waits up to `timeout` for the leader to exit by itself.
    pub async fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.wait()).await.ok()?.ok()
    }

    /// SIGTERM to the group, up to `grace` to exit, then SIGKILL; returns once reaped.
    pub async fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exited {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        if let Some(status) = self.wait_timeout(grace).await {
            return Some(status);
        }
        self.kill().await
    }

    /// SIGKILL to the group; returns once reaped.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGKILL);
        self.wait().await.ok()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.exited.is_none() {
            // The Child's kill_on_drop kills the leader and tokio reaps it in the background;
            // this takes down everything else in its group as well.
            kill_group(self.pid, libc::SIGKILL);
            guard::unregister(self.pid);
        }
    }
}
