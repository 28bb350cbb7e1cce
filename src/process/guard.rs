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
//! The write end and the mark live in process-wide cells: like the pid, the guard belongs to the
//! process, not to any one owner of children.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::gpu::procfs::ProcFs;

mod mark;
pub(super) use mark::mark;
use mark::marked_soon;
pub use mark::MARK_VAR;

static GUARD: OnceLock<OwnedFd> = OnceLock::new();
/// The guard's pid, while this process has one.
static GUARD_PID: OnceLock<libc::pid_t> = OnceLock::new();
/// Set once the guard was found gone (reaped).
static GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process has an orphan guard that has died (someone killed it): the workers'
/// children would then outlive a killed host. The dead guard is reaped here, and said once in
/// the log. `false` where there never was one (library use, tests in-process).
pub fn gone() -> bool {
    use std::sync::atomic::Ordering;
    if GONE.load(Ordering::Relaxed) {
        return true;
    }
    let Some(&pid) = GUARD_PID.get() else {
        return false;
    };
    // SAFETY: waitpid on our own child, without blocking; reaps it if it has exited.
    let reaped = unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
    let dead = reaped == pid
        || (reaped < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD));
    if dead && !GONE.swap(true, Ordering::Relaxed) {
        tracing::error!(pid, "the orphan guard is gone: worker children may outlive a killed host; restart gpuhost to get a new one");
    }
    dead
}

/// Forks the guard. Call it from `main` while the process has a single thread (before the async
/// runtime starts): the forked child then runs ordinary code safely.
pub fn install() -> io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    let host = std::process::id();
    let (token, mark) = mark::new(host);
    // SAFETY: the caller guarantees a single-threaded process, so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: closing our copy of the write end; the host keeps its own.
            unsafe { libc::close(write_end) };
            run_guard(read_end, host, &token)
        }
        guard => {
            super::adopted::record(guard as u32);
            let _ = GUARD_PID.set(guard);
            mark::set(mark);
            // SAFETY: the read end belongs to the guard now; the write end is ours alone.
            unsafe { libc::close(read_end) };
            let _ = GUARD.set(unsafe { OwnedFd::from_raw_fd(write_end) });
            Ok(())
        }
    }
}

/// Records a new process group to kill if the host dies.
pub(super) fn register(pgid: u32) {
    send(&format!("+{pgid}\n"));
}

/// Forgets a process group that is gone.
pub(super) fn unregister(pgid: u32) {
    send(&format!("-{pgid}\n"));
}

/// Records a process whose whole tree is to be stopped if the host dies.
pub(super) fn register_tree(pid: u32) {
    send(&format!(">{pid}\n"));
}

/// Forgets a tree's root that has been reaped.
pub(super) fn unregister_tree(pid: u32) {
    send(&format!("<{pid}\n"));
}

fn send(line: &str) {
    let Some(fd) = GUARD.get() else {
        return; // no guard (library use, tests in-process): PR_SET_PDEATHSIG still applies
    };
    // A few bytes to a pipe the guard drains continuously: one write, never a partial one.
    // SAFETY: writing a valid buffer to an open descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), line.as_ptr().cast(), line.len()) };
    if n < 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "the orphan guard is gone; worker children may outlive a killed host");
    }
}

/// The guard's whole life. Never returns.
fn run_guard(read_end: RawFd, host: u32, token: &str) -> ! {
    // SAFETY: plain syscalls in the freshly forked, single-threaded child.
    unsafe {
        // Its own session: a Ctrl-C or SIGHUP aimed at the host's terminal group passes it by.
        libc::setsid();
        libc::prctl(
            libc::PR_SET_NAME,
            c"gpuhost-guard".as_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
        // Keep only the pipe (as fd 3) and stderr: no listening socket or file stays open here.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
        }
        if read_end != 3 {
            libc::dup2(read_end, 3);
        }
        if libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32) != 0 {
            for fd in 4..1024 {
                libc::close(fd);
            }
        }
    }
    retitle(b"gpuhost-guard");
    let (registered, seen) = watch(3, host);
    stop(&registered, &seen, token);
    // SAFETY: leave without running the host's atexit handlers or destructors.
    unsafe { libc::_exit(0) }
}

/// Writes `title` over the command line the guard shares with the host (forked, not started
/// anew), so `/proc/PID/cmdline` reads `gpuhost-guard`: a `pkill -9 -f "gpuhost serve"` aimed
/// at the host took the guard with it, and the workers' children then outlived both. (Its name,
/// `comm`, is set too; `pkill gpuhost` still matches it, and nothing can stop a kill of both.)
fn retitle(title: &[u8]) {
    // `self`, not the pid: a /proc of another pid namespace has some other process at our pid.
    let Some((start, end)) = ProcFs::new("/proc").own_arg_range() else {
        return;
    };
    if start == 0 || end <= start {
        return;
    }
    // SAFETY: [start, end) is this process's own argument area (on its initial stack, which is
    // writable), as the kernel reports it; the process is single-threaded and nothing reads
    // the arguments after this.
    let area = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, end - start) };
    area.fill(0);
    let n = title.len().min(area.len() - 1);
    area[..n].copy_from_slice(&title[..n]);
}

/// What the guard stops when the host dies.
#[derive(Debug, Default, PartialEq)]
struct Registered {
    groups: Vec<libc::pid_t>,
    /// Roots of process trees.
    trees: Vec<libc::pid_t>,
}

/// How often the guard notes the host's descendants.
const LOOK_EVERY_MS: libc::c_int = 1000;

/// A process as the guard saw it: its pid and start time (so a reused pid is never taken for it).
type Seen = Vec<(u32, u64)>;

/// Reads registration lines until EOF, and between them, every second, notes every process
/// below the host. Returns what is still registered and the last such look: a process that
/// left its group (`setsid`) or whose parent died just before the host (a SIGTERMed wrapper,
/// its children gone to init) is in it.
fn watch(fd: RawFd, host: u32) -> (Registered, Seen) {
    let procfs = ProcFs::new("/proc");
    let me = std::process::id();
    // A /proc of another PID namespace would name other processes: no looks then.
    let looks = procfs.is_own();
    let every = Duration::from_millis(LOOK_EVERY_MS as u64);
    let mut next_look = Instant::now() + every;
    let mut registered = Registered::default();
    let mut seen = Seen::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // The look keeps its own clock: registration lines (a helper every second) never
        // postpone it.
        let now = Instant::now();
        if looks && now >= next_look {
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } as u32 == host {
                seen = below(&procfs, &[host], me);
            }
            next_look = now + every;
        }
        let wait = if looks {
            next_look
                .saturating_duration_since(Instant::now())
                .as_millis() as libc::c_int
        } else {
            -1
        };
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one descriptor of ours.
        let ready = unsafe { libc::poll(&mut poll, 1, wait) };
        if ready == 0 {
            continue;
        }
        // SAFETY: reading into a local buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return (registered, seen);
        }
        pending.extend_from_slice(&buf[..n as usize]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            apply(&mut registered, &line[..line.len() - 1]);
        }
    }
}

/// `roots` and every process below them but `me`, with their start times.
fn below(procfs: &ProcFs, roots: &[u32], me: u32) -> Seen {
    let pids = procfs
        .descendants_of(roots)
        .into_iter()
        .filter(|&p| p != me && p > 1);
    pids.filter_map(|p| Some((p, procfs.start_time(p)?)))
        .collect()
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

/// SIGTERM to every group, and to every process of every tree, of the last look below the host
/// and with the host's `token` in its environment's mark (with all below them now), up to a second for
/// them to go, then SIGKILL to what is left (read again: a process that died meanwhile left its
/// children to init). A process is signalled only while its start time is the one seen, so a
/// reused pid is never hit.
fn stop(registered: &Registered, seen: &Seen, token: &str) {
    let procfs = ProcFs::new("/proc");
    let me = std::process::id();
    if !procfs.is_own() {
        // Another PID namespace's /proc names other processes: the registered ids alone.
        for signal in [libc::SIGTERM, libc::SIGKILL] {
            for &g in &registered.groups {
                // SAFETY: signals a registered process group; one that is gone yields ESRCH.
                unsafe { libc::killpg(g, signal) };
            }
            for &t in &registered.trees {
                // SAFETY: signals a registered program; one that is gone yields ESRCH.
                unsafe { libc::kill(t, signal) };
            }
            if signal == libc::SIGTERM {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        return;
    }
    let targets = |also: &Seen| -> Seen {
        let same = |&(p, start): &(u32, u64)| procfs.start_time(p) == Some(start);
        let mut roots: Vec<u32> = registered.trees.iter().map(|&t| t as u32).collect();
        roots.extend(seen.iter().chain(also).filter(|s| same(s)).map(|s| s.0));
        below(&procfs, &roots, me)
    };
    let signal = |targets: &Seen, signal| {
        for &g in &registered.groups {
            // SAFETY: signals a process group; one that is gone yields ESRCH.
            unsafe { libc::killpg(g, signal) };
        }
        for &(p, start) in targets {
            if procfs.start_time(p) == Some(start) {
                // SAFETY: signals the process just checked to be the one seen.
                unsafe { libc::kill(p as libc::pid_t, signal) };
            }
        }
    };
    // The registered groups first: nothing below (a scan of /proc) may hold them up.
    for &g in &registered.groups {
        // SAFETY: signals a process group; one that is gone yields ESRCH.
        unsafe { libc::killpg(g, libc::SIGTERM) };
    }
    let first = targets(&marked_soon(token, me));
    signal(&first, libc::SIGTERM);
    // SAFETY: signal 0 only checks that a group exists.
    let group_alive = |g: libc::pid_t| unsafe { libc::killpg(g, 0) } == 0;
    let alive = |&(p, start): &(u32, u64)| procfs.start_time(p) == Some(start) && !procfs.zombie(p);
    let deadline = Instant::now() + Duration::from_secs(1);
    while (registered.groups.iter().any(|&g| group_alive(g)) || first.iter().any(alive))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut last = first;
    last.extend(marked_soon(token, me));
    signal(&targets(&last), libc::SIGKILL);
}

#[cfg(test)]
mod tests {
    use super::{apply, Registered};

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
    }
}
