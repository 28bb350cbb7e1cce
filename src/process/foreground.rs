//! The user's program under `gpuhost lease -- CMD`: started in the foreground (same terminal and
//! process group) and, when its lease is lost, stopped together with everything below it.

use std::io;

use tokio::process::{Child, Command};

use super::SECRET_ENV;
use crate::gpu::procfs::ProcFs;

/// Sends `signal` to a program started by `spawn_foreground` and to every process below it (a
/// wrapper's children: `sh -c`, `uv run`, `bash train.sh`), found through `/proc` at this moment.
/// It shares gpuhost's process group (so Ctrl-C reaches it), so the group cannot be signalled.
pub fn signal_foreground(child: &Child, signal: libc::c_int) {
    let Some(root) = child.id() else { return };
    for pid in ProcFs::new("/proc").descendants(root) {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: kill(2) on pids just read below our own child.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Runs a user's program in the foreground (`gpuhost lease -- CMD`): same terminal, same process
/// group (Ctrl-C reaches it), inherited stdio; it gets SIGTERM if gpuhost dies, since the lease
/// it runs under ends then too.
pub fn spawn_foreground(argv: &[String]) -> io::Result<Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"))?;
    #[allow(clippy::disallowed_methods)] // this module is the one allowed spawner
    let mut cmd = Command::new(program);
    cmd.args(args).kill_on_drop(true);
    for key in SECRET_ENV {
        cmd.env_remove(key);
    }
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
    super::adopted::recorded(|| cmd.spawn(), Child::id)
}
