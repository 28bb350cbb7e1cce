//! The user's program under `gpuhost lease -- CMD`: started in the foreground (same terminal and
//! process group) and stopped together with everything below it — by the lease client when its
//! lease is lost or it is told to stop, and by the orphan guard when the client itself is killed.

use std::io;
use std::process::ExitStatus;

use tokio::process::{Child, Command};

use super::{adopted, guard, SECRET_ENV};
use crate::gpu::procfs::ProcFs;

/// A program started by [`spawn_foreground`]. While it runs, the orphan guard holds its pid as
/// the root of a tree to stop if the client dies (a SIGKILLed client runs no code of its own).
#[derive(Debug)]
pub struct Foreground {
    child: Child,
    /// Set until the program is reaped (then the pid may be reused).
    pid: Option<u32>,
}

impl Foreground {
    /// Sends `signal` to the program and to every process below it (a wrapper's children:
    /// `sh -c`, `uv run`, `bash train.sh`), found through `/proc` at this moment. It shares
    /// gpuhost's process group (so Ctrl-C reaches it), so the group cannot be signalled.
    pub fn signal(&self, signal: libc::c_int) {
        let Some(root) = self.pid else { return };
        for pid in ProcFs::new("/proc").descendants(root) {
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) on pids just read below our own unreaped child.
                unsafe {
                    libc::kill(pid, signal);
                }
            }
        }
    }

    /// Waits for the program to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.forget();
        Ok(status)
    }

    fn forget(&mut self) {
        if let Some(pid) = self.pid.take() {
            guard::unregister_tree(pid);
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.forget(); // kill_on_drop takes the program itself
    }
}

/// Runs a user's program in the foreground (`gpuhost lease -- CMD`): same terminal, same process
/// group (Ctrl-C reaches it), inherited stdio. If gpuhost dies, the orphan guard stops the
/// program's whole tree (SIGTERM, a second, SIGKILL), since the lease it runs under ends then
/// too; without a guard the program itself gets SIGTERM (`PR_SET_PDEATHSIG`). (With a guard the
/// death signal is left off: the program would die at once and orphan its children before the
/// guard could find them below it.)
pub fn spawn_foreground(argv: &[String]) -> io::Result<Foreground> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"))?;
    #[allow(clippy::disallowed_methods)] // this module is the one allowed spawner
    let mut cmd = Command::new(program);
    cmd.args(args).kill_on_drop(true);
    for key in SECRET_ENV {
        cmd.env_remove(key);
    }
    if !guard::installed() {
        // SAFETY: only async-signal-safe calls (prctl) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
    }
    let child = adopted::recorded(|| cmd.spawn(), Child::id)?;
    let pid = child.id();
    if let Some(pid) = pid {
        guard::register_tree(pid);
    }
    Ok(Foreground { child, pid })
}
