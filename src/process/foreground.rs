//! The user's program under `gpuhost lease -- CMD`: started in the foreground (same terminal and
//! process group) and stopped together with everything below it — by the lease client when its
//! lease is lost or it is told to stop, and by the orphan guard when the client itself is killed.
//! The client is a child subreaper, so what the program double-forks away (a daemon) becomes the
//! client's child when its parent exits, is stopped with the program, and is stopped when the
//! program ends: nothing the program started runs on after its lease.

use std::io;
use std::process::ExitStatus;

use tokio::process::{Child, Command};

use super::{adopted, guard, hide_secrets_and_mark};
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
    /// `sh -c`, `uv run`, `bash train.sh`), and to what it left to the client (adopted, with
    /// everything below), found through `/proc` at this moment. It shares gpuhost's process
    /// group (so Ctrl-C reaches it), so the group cannot be signalled.
    pub fn signal(&self, signal: libc::c_int) {
        let procfs = ProcFs::new("/proc");
        let roots: Vec<u32> = self
            .pid
            .into_iter()
            .chain(adopted::adopted(&procfs))
            .collect();
        // Another PID namespace's /proc names other processes: the program alone then.
        let tree = if procfs.is_own() {
            procfs.descendants_of(&roots)
        } else {
            roots
        };
        for pid in tree {
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) on pids just read below our own unreaped children.
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

    /// After the program has exited: what it left running (adopted by the client) gets
    /// SIGTERM, up to `grace` to go, then SIGKILL, and is reaped. Returns how many there were.
    pub async fn stop_left_behind(&self, grace: std::time::Duration) -> usize {
        let procfs = ProcFs::new("/proc");
        let left = adopted::adopted(&procfs).len();
        if left == 0 {
            return 0;
        }
        self.signal(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while !adopted::adopted(&procfs).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.signal(libc::SIGKILL);
        adopted::sweep(&procfs);
        left
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
/// group (Ctrl-C reaches it), inherited stdio. If gpuhost dies, the program gets SIGTERM
/// (`PR_SET_PDEATHSIG`), and the orphan guard stops its whole tree and what the client had
/// adopted (SIGTERM, a second, SIGKILL: from its last look a second before, so children the
/// program's death orphans are not missed), since the lease it runs under ends then too.
pub fn spawn_foreground(argv: &[std::ffi::OsString]) -> io::Result<Foreground> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"))?;
    #[allow(clippy::disallowed_methods)] // this module is the one allowed spawner
    let mut cmd = Command::new(program);
    cmd.args(args).kill_on_drop(true);
    hide_secrets_and_mark(&mut cmd);
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
    let child = adopted::recorded(|| cmd.spawn(), Child::id)?;
    let pid = child.id();
    if let Some(pid) = pid {
        guard::register_tree(pid);
    }
    Ok(Foreground { child, pid })
}
