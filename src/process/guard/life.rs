//! The guard's own life, in its process (forked by the host at its start, or started anew by the
//! host in place of one that died): it reads the host's registrations until EOF, notes what is
//! below the host once a second, and when the host is gone stops all of it.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::mark::marked_soon;
use super::{apply, Registered};
use crate::gpu::procfs::ProcFs;

/// The guard's whole life. Never returns.
pub(super) fn run_guard(read_end: RawFd, host: u32, token: &str) -> ! {
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

/// How often the guard notes the host's descendants.
const LOOK_EVERY_MS: libc::c_int = 1000;

/// A process as the guard saw it: its pid and start time (so a reused pid is never taken for it).
pub(super) type Seen = Vec<(u32, u64)>;

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

/// SIGTERM to every group, and to every process of every tree, of the last look below the host
/// and with the host's `token` in its environment's mark (with all below them now), up to a second for
/// them to go, then SIGKILL to what is left (read again: a process that died meanwhile left its
/// children to init), and again to what such a process started meanwhile, until none is left.
/// A process is signalled only while its start time is the one seen, so a reused pid is never
/// hit.
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
    // What a process started between that look and its SIGKILL (one that ignores SIGTERM and
    // keeps detaching children): looked for again until a look finds none alive, a few seconds
    // at most (each SIGKILL ends a spawner, so this ends).
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let left: Seen = targets(&marked_soon(token, me))
            .into_iter()
            .filter(|s| alive(s))
            .collect();
        if left.is_empty() {
            break;
        }
        for &(p, start) in &left {
            // Only those processes (no group again: its id may be another's by now).
            if procfs.start_time(p) == Some(start) {
                // SAFETY: signals the process just checked to be the one seen.
                unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
