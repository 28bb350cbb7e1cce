//! The orphan guard: a tiny process forked at startup that outlives a SIGKILLed host and then
//! kills every process group the host had registered, so a worker's own children (data loaders,
//! ffmpeg, compile workers — in production, processes that hold GPU memory) never survive the
//! host. `PR_SET_PDEATHSIG` reaches only the direct child; this reaches its whole group, without
//! relying on systemd.
//!
//! The host holds the write end of a pipe (close-on-exec, so no child inherits it) and writes
//! `+PGID` / `-PGID` lines for process groups and `>PID` / `<PID` for process trees (the
//! foreground program of `gpuhost lease`, which shares the client's group); the guard reads them.
//! Between lines, once a second, the guard notes every process below the host with its start
//! time: a descendant that left its group (`setsid`) or was orphaned a moment before the host
//! died is in that look. When the host dies, however it dies, the kernel closes the write end,
//! the guard reads EOF, sends SIGTERM to each group still registered, to each tree's processes
//! and to those of its last look that are still the same processes (with everything below
//! them), gives them a moment, SIGKILLs what is left and exits.
//!
//! Every child also carries a mark in its environment, `GPUHOST_GUARD=<host pid>-<nanos>`, which
//! its own children inherit: when the host dies the guard stops, besides the above, every process
//! whose environment holds this host's mark (a gpuhost started by another keeps the outer mark
//! too, space-separated; `guard/mark.rs`). That catches a daemon (`setsid`) made in the second
//! before the host died, after the guard's last look (the way Jenkins finds a build's strays).
//!
//! A guard that dies (someone killed it) is replaced: the server's sweep (`adopted.rs`, every
//! 2 s and at each SIGCHLD) reaps it and starts a new one from the host's own binary (the hidden
//! `gpuhost orphan-guard`), with the same mark, and says again to it every registration still
//! standing (the host keeps a copy). `/health` says `orphan_guard: "gone"` only while none could
//! be started.
//!
//! The write end, the copy and the mark live in process-wide cells: like the pid, the guard
//! belongs to the process, not to any one owner of children.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

mod life;
mod mark;
use life::run_guard;
pub(super) use mark::mark;
pub use mark::MARK_VAR;

/// The host's side of its guard, while it has one. std Mutex: held for one write to the pipe or
/// one start of a replacement, never across an `.await`.
static GUARD: Mutex<Option<HostSide>> = Mutex::new(None);

#[derive(Debug)]
struct HostSide {
    /// The write end of the pipe the guard reads; `None` while no guard runs.
    pipe: Option<OwnedFd>,
    /// The guard's pid until it has been reaped (then never waited for again: the pid may be
    /// another child's by then).
    pid: Option<libc::pid_t>,
    host: u32,
    token: String,
    /// What is registered now: said again to a guard started in place of a dead one.
    registered: Registered,
}

fn host_side() -> MutexGuard<'static, Option<HostSide>> {
    GUARD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process has an orphan guard that is gone and not replaced yet (the server's
/// sweep replaces one within 2 s; see [`mend`]): the workers' children would then outlive a
/// killed host. Reads the state only (the open `/health` asks). `false` where there never was
/// one (library use, tests in-process).
pub fn gone() -> bool {
    host_side().as_ref().is_some_and(|side| side.pipe.is_none())
}

/// Reaps a guard that died and starts a new one in its place (said in the log). Cheap when the
/// guard runs: one `waitpid` without blocking.
pub fn mend() {
    let mut side = host_side();
    let Some(side) = side.as_mut() else {
        return;
    };
    // Whether it died just now (else an earlier replacement failed, and was said).
    let just_died = match side.pid {
        Some(pid) => {
            // SAFETY: waitpid on our own child, without blocking; reaps it if it has exited.
            let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            let dead = reaped == pid
                || (reaped < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD));
            if !dead {
                return;
            }
            side.pid = None;
            side.pipe = None;
            true
        }
        None => false,
    };
    match restart(side) {
        Ok(pid) => tracing::warn!(pid, "the orphan guard was gone (killed?); a new one runs"),
        Err(e) if just_died => {
            tracing::error!(error = %e, "the orphan guard is gone and a new one cannot start: worker children may outlive a killed host; restart gpuhost")
        }
        Err(e) => tracing::debug!(error = %e, "still no orphan guard"),
    }
}

/// Starts a guard in place of the dead one: the host's binary (`/proc/self/exe`, which works
/// even when the file was replaced since) as `gpuhost orphan-guard`, the pipe's read end as its
/// fd 3, the mark's token in its environment (a command line is world-readable and audited), no
/// death signal (it must outlive the host); then says every standing registration.
fn restart(side: &mut HostSide) -> io::Result<libc::pid_t> {
    let (read, write) = pipe()?;
    let raw = read.as_raw_fd();
    // The one child gpuhost starts without a process group of its own to kill or a death
    // signal: it is what acts once the host is dead.
    #[allow(clippy::disallowed_methods)] // the process module is the one allowed spawner
    let mut cmd = std::process::Command::new("/proc/self/exe");
    use std::os::unix::process::CommandExt;
    cmd.arg0("gpuhost-guard")
        .args(["orphan-guard", &side.host.to_string()])
        .env(TOKEN_VAR, &side.token)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    for key in super::SECRET_ENV {
        cmd.env_remove(key);
    }
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let ok = if raw == 3 {
                libc::fcntl(3, libc::F_SETFD, 0) // keep it open across exec
            } else {
                libc::dup2(raw, 3)
            };
            if ok < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = super::adopted::recorded(|| cmd.spawn(), |c| Some(c.id()))?;
    drop(read);
    nonblocking(&write);
    let pid = child.id() as libc::pid_t;
    // Room for the whole copy before the new guard reads a line (64 KiB by default, 4 KiB for a
    // user past `pipe-user-pages-soft`): a full pipe here is not a stopped guard.
    // SAFETY: fcntl on a descriptor of ours; a refusal leaves the default size.
    unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    side.pid = Some(pid);
    side.pipe = Some(write);
    for line in side.registered.lines() {
        write_line(side, &line, false);
    }
    Ok(pid)
}

/// How `restart` hands the mark's token to the new guard.
const TOKEN_VAR: &str = "GPUHOST_GUARD_TOKEN";

/// The guard's life in a process started by `restart`: the pipe is fd 3. Anything else (a
/// person running `gpuhost orphan-guard` by hand) is refused: its end would stop every process
/// carrying the token's mark.
pub fn child_main(host: u32) -> Result<std::convert::Infallible, String> {
    let token = std::env::var(TOKEN_VAR).unwrap_or_default();
    // SAFETY: getppid has no preconditions; fstat fills the struct it is given.
    let (parent, fifo) = unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        let fifo = libc::fstat(3, &mut stat) == 0 && stat.st_mode & libc::S_IFMT == libc::S_IFIFO;
        (libc::getppid() as u32, fifo)
    };
    if parent != host || !fifo || token.is_empty() {
        return Err(
            "gpuhost orphan-guard is started by `gpuhost serve` itself, not by hand".into(),
        );
    }
    std::env::remove_var(TOKEN_VAR);
    run_guard(3, host, &token)
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both ends are fresh descriptors of ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The write end made non-blocking: a guard that stops reading (SIGSTOP, a debugger) must not
/// block the host, which writes under a process-wide lock; a full pipe is an unresponsive guard.
fn nonblocking(pipe: &OwnedFd) {
    // SAFETY: fcntl on a descriptor of ours.
    unsafe {
        let flags = libc::fcntl(pipe.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(pipe.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// Forks the guard. Call it from `main` while the process has a single thread (before the async
/// runtime starts): the forked child then runs ordinary code safely.
pub fn install() -> io::Result<()> {
    let (read, write) = pipe()?;
    let host = std::process::id();
    let (token, mark) = mark::new(host);
    // SAFETY: the caller guarantees a single-threaded process, so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(write); // the host keeps its own copy
            run_guard(read.as_raw_fd(), host, &token)
        }
        guard => {
            super::adopted::record(guard as u32);
            mark::set(mark);
            drop(read); // the guard's now; the write end is ours alone
            nonblocking(&write);
            *host_side() = Some(HostSide {
                pipe: Some(write),
                pid: Some(guard),
                host,
                token,
                registered: Registered::default(),
            });
            Ok(())
        }
    }
}

/// Records a new process group to kill if the host dies.
pub(super) fn register(pgid: u32) {
    send(&format!("+{pgid}"));
}

/// Forgets a process group that is gone.
pub(super) fn unregister(pgid: u32) {
    send(&format!("-{pgid}"));
}

/// Records a process whose whole tree is to be stopped if the host dies.
pub(super) fn register_tree(pid: u32) {
    send(&format!(">{pid}"));
}

/// Forgets a tree's root that has been reaped.
pub(super) fn unregister_tree(pid: u32) {
    send(&format!("<{pid}"));
}

fn send(line: &str) {
    let mut side = host_side();
    let Some(side) = side.as_mut() else {
        return; // no guard (library use, tests in-process): PR_SET_PDEATHSIG still applies
    };
    apply(&mut side.registered, line.as_bytes());
    write_line(side, line, true);
}

/// One registration line to the guard, when one runs (a replacement is told them all). With
/// `kill_when_full`, a guard whose pipe is full has stopped reading (stopped, not dead): it is
/// killed, so that the sweep replaces it with one that is told everything, this line included.
/// (Not while a new guard is told the copy: it has not started reading yet.)
fn write_line(side: &HostSide, line: &str, kill_when_full: bool) {
    let Some(fd) = &side.pipe else {
        return;
    };
    let line = format!("{line}\n");
    // A few bytes to a pipe the guard drains continuously: one write, never a partial one (a
    // write of at most PIPE_BUF bytes is all or nothing, non-blocking too).
    // SAFETY: writing a valid buffer to an open descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), line.as_ptr().cast(), line.len()) };
    if n >= 0 {
        return;
    }
    let error = io::Error::last_os_error();
    if error.kind() == io::ErrorKind::WouldBlock {
        if let Some(pid) = side.pid.filter(|_| kill_when_full) {
            tracing::warn!(
                pid,
                "the orphan guard stopped reading (its pipe is full); killing it for a new one"
            );
            // SAFETY: signals our own unreaped child (only `mend` reaps it).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    } else {
        tracing::warn!(%error, "the orphan guard is gone; worker children may outlive a killed host until a new one runs");
    }
}

/// What the guard stops when the host dies.
#[derive(Debug, Default, PartialEq)]
struct Registered {
    groups: Vec<libc::pid_t>,
    /// Roots of process trees.
    trees: Vec<libc::pid_t>,
}

fn apply(registered: &mut Registered, line: &[u8]) {
    let Some((&op, digits)) = line.split_first() else {
        return;
    };
    let Some(id) = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<libc::pid_t>().ok())
        .filter(|&p| p > 1)
    else {
        return;
    };
    let Registered { groups, trees } = registered;
    match op {
        b'+' => groups.push(id),
        b'-' => groups.retain(|&g| g != id),
        b'>' => trees.push(id),
        b'<' => trees.retain(|&t| t != id),
        _ => {}
    }
}

impl Registered {
    /// The lines that register all of it again.
    fn lines(&self) -> Vec<String> {
        let groups = self.groups.iter().map(|g| format!("+{g}"));
        groups
            .chain(self.trees.iter().map(|t| format!(">{t}")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{apply, nonblocking, pipe, write_line, HostSide, Registered};

    #[test]
    fn a_guard_that_stops_reading_is_killed_not_waited_for() {
        // A stopped guard's pipe filled up, and the blocking write, under the process-wide
        // lock, froze every spawn, the sweep and /health.
        let (read, write) = pipe().unwrap();
        nonblocking(&write);
        #[allow(clippy::disallowed_methods)] // a stand-in guard, never a worker
        let mut stopped = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let side = HostSide {
            pipe: Some(write),
            pid: Some(stopped.id() as libc::pid_t),
            host: 0,
            token: "t".into(),
            registered: Registered::default(),
        };
        let started = std::time::Instant::now();
        for _ in 0..20_000 {
            write_line(&side, "+123456", true); // 160 KB: more than a pipe holds
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(stopped.wait().unwrap().signal(), Some(libc::SIGKILL));
        drop(read);
    }

    #[test]
    fn registrations_add_and_remove() {
        let mut registered = Registered::default();
        for line in [
            "+100", "+200", "-100", "+x", "+1", "?5", "", ">300", ">400", "<300", ">1",
        ] {
            apply(&mut registered, line.as_bytes());
        }
        assert_eq!(
            registered,
            Registered {
                groups: vec![200],
                trees: vec![400]
            }
        );
        // What a replacement guard is told builds the same.
        let mut told = Registered::default();
        for line in registered.lines() {
            apply(&mut told, line.as_bytes());
        }
        assert_eq!(told, registered);
    }
}
