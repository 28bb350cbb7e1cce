//! The only module that starts processes: every child gets its own process group, a
//! parent-death signal, is registered with the orphan guard (`guard.rs`: its whole group goes if
//! the host is SIGKILLed), and is killed with its whole group when its owner drops it.
//!
//! Invariant: `spawn_*` must be called from an async task (a runtime worker thread), never from
//! `spawn_blocking`: `PR_SET_PDEATHSIG` fires when the *thread* that forked exits, and blocking
//! threads are retired after a few idle seconds.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

pub mod adopted;
mod foreground;
mod group;
use group::kill_group;
pub mod guard;
pub use foreground::{spawn_foreground, Foreground};

/// Environment variables no child inherits (the API token must not leak to workers' logs).
const SECRET_ENV: &[&str] = &["GPUHOST_TOKEN"];

/// A child running in its own process group. Dropping it SIGKILLs the group; tokio reaps the
/// child in the background.
#[derive(Debug)]
pub struct ProcessGroup {
    child: Child,
    pid: u32,
    /// Set once `wait` has returned: the pid may be reused, so no more signals.
    exited: Option<ExitStatus>,
}

/// The three channels of a worker.
pub struct Pipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

fn guarded_command(program: &OsStr, args: &[String], cwd: Option<&Path>) -> Command {
    guarded_command_limited(program, args, cwd, None)
}

/// [`guarded_command`] with an address-space limit (`RLIMIT_AS`, bytes) when one is given.
fn guarded_command_limited(
    program: &OsStr,
    args: &[String],
    cwd: Option<&Path>,
    address_space: Option<u64>,
) -> Command {
    #[allow(clippy::disallowed_methods)] // this module is the one allowed spawner
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0).kill_on_drop(true);
    hide_secrets_and_mark(&mut cmd);
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, setrlimit, _exit) between fork and
    // exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(bytes) = address_space {
                let limit = libc::rlimit {
                    rlim_cur: bytes as libc::rlim_t,
                    rlim_max: bytes as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd
}

/// Takes the secrets out of a child's environment and puts the orphan guard's mark in (its
/// children inherit it: the guard finds them by it if the host is killed).
fn hide_secrets_and_mark(cmd: &mut Command) {
    for key in SECRET_ENV {
        cmd.env_remove(key);
    }
    // Without a guard of its own the process passes on what it inherited.
    if let Some(mark) = guard::mark() {
        cmd.env(guard::MARK_VAR, mark);
    }
}

/// Starts a worker with piped stdin/stdout/stderr.
pub fn spawn_worker(
    argv: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> io::Result<(ProcessGroup, Pipes)> {
    let (group, stdin, stdout, stderr) = spawn_piped(argv, cwd, env, true)?;
    let stdin = stdin.expect("stdin is piped");
    Ok((
        group,
        Pipes {
            stdin,
            stdout,
            stderr,
        },
    ))
}

/// Starts an on-demand service: no stdin, stdout and stderr piped (its log).
pub fn spawn_service(
    argv: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
) -> io::Result<(ProcessGroup, ChildStdout, ChildStderr)> {
    let (group, _, stdout, stderr) = spawn_piped(argv, cwd, env, false)?;
    Ok((group, stdout, stderr))
}

type Spawned = (ProcessGroup, Option<ChildStdin>, ChildStdout, ChildStderr);

fn spawn_piped(
    argv: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
    stdin: bool,
) -> io::Result<Spawned> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the command is empty"))?;
    let mut cmd = guarded_command(OsStr::new(program), args, Some(cwd));
    cmd.envs(env)
        .env("PYTHONUNBUFFERED", "1")
        .env("GPUHOST_PARENT_PID", std::process::id().to_string())
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        adopted::recorded(|| cmd.spawn(), Child::id).map_err(|e| which_missing(e, cwd))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let pid = child.id().expect("a just-spawned child has a pid");
    guard::register(pid);
    Ok((
        ProcessGroup {
            child,
            pid,
            exited: None,
        },
        stdin,
        stdout,
        stderr,
    ))
}

/// A spawn's "No such file or directory" is the program's or the working folder's: says which
/// (the OS does not), so that a config's `cwd` that does not exist is not read as a missing
/// program.
fn which_missing(e: io::Error, cwd: &Path) -> io::Error {
    if e.kind() == io::ErrorKind::NotFound && !cwd.is_dir() {
        let what = if cwd.exists() {
            "is not a folder"
        } else {
            "does not exist"
        };
        return io::Error::new(
            io::ErrorKind::NotFound,
            format!("its working folder (`cwd`) {} {what}", cwd.display()),
        );
    }
    e
}

/// What a short helper command printed.
#[derive(Debug)]
pub struct Captured {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start {program}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("{program} did not finish within {timeout:?} and was killed")]
    Timeout { program: String, timeout: Duration },
    #[error("reading the output of {program} failed: {source}")]
    Io { program: String, source: io::Error },
}

/// Most bytes kept of a helper's stdout or stderr; a helper that writes more is killed (a
/// broken or hostile `nvidia-smi` printing without end must not fill the host's memory).
const CAPTURE_MAX: usize = 16 << 20;

/// What a helper gets besides its arguments.
#[derive(Debug, Default)]
pub struct HelperInput {
    /// Written to its stdin (then closed); `None`: stdin is `/dev/null`.
    pub stdin: Option<bytes::Bytes>,
    /// Its address-space limit in bytes (`RLIMIT_AS`): past it, allocations fail in the helper.
    pub address_space: Option<u64>,
}

/// Runs a helper (`ffmpeg`, `nvidia-smi`) to completion, killing its group after `timeout` or
/// once it writes more than `CAPTURE_MAX` bytes to either stream.
pub async fn run_captured(
    program: &Path,
    args: &[String],
    timeout: Duration,
) -> Result<Captured, RunError> {
    run_helper(program, args, timeout, HelperInput::default()).await
}

/// [`run_captured`] with `input` on stdin and limits.
pub async fn run_helper(
    program: &Path,
    args: &[String],
    timeout: Duration,
    input: HelperInput,
) -> Result<Captured, RunError> {
    let name = program.display().to_string();
    let mut cmd = guarded_command_limited(program.as_os_str(), args, None, input.address_space);
    cmd.stdin(if input.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child =
        adopted::recorded(|| cmd.spawn(), Child::id).map_err(|source| RunError::Spawn {
            program: name.clone(),
            source,
        })?;
    let pid = child.id();
    if let Some(pid) = pid {
        guard::register(pid);
    }
    let _forget = pid.map(Unregister);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(RunError::Io {
            program: name,
            source: io::Error::other("no pipes to the helper"),
        });
    };
    let stdin = child.stdin.take();
    let feed = async move {
        use tokio::io::AsyncWriteExt;
        if let (Some(mut pipe), Some(bytes)) = (stdin, input.stdin) {
            // A helper that exits without reading all of it (it refused the header) is no
            // error here: its exit status and output say what happened.
            let _ = pipe.write_all(&bytes).await;
        }
        Ok::<_, io::Error>(())
    };
    let work = async {
        let (_, stdout, stderr) = tokio::try_join!(feed, read_capped(stdout), read_capped(stderr))?;
        Ok::<_, io::Error>((child.wait().await?, stdout, stderr))
    };
    let outcome = tokio::time::timeout(timeout, work).await;
    if !matches!(outcome, Ok(Ok(_))) {
        // The future (and with it the Child, kill_on_drop) is gone; take the group too.
        if let Some(pid) = pid {
            kill_group(pid, libc::SIGKILL);
        }
    }
    match outcome {
        Ok(Ok((status, stdout, stderr))) => Ok(Captured {
            status,
            stdout,
            stderr,
        }),
        Ok(Err(source)) => Err(RunError::Io {
            program: name,
            source,
        }),
        Err(_) => Err(RunError::Timeout {
            program: name,
            timeout,
        }),
    }
}

/// All of `stream`, or an error once it passes `CAPTURE_MAX` bytes.
async fn read_capped(stream: impl tokio::io::AsyncRead + Unpin) -> io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    stream
        .take(CAPTURE_MAX as u64 + 1)
        .read_to_end(&mut out)
        .await?;
    if out.len() > CAPTURE_MAX {
        return Err(io::Error::other(format!(
            "it wrote more than {} MiB of output",
            CAPTURE_MAX >> 20
        )));
    }
    Ok(out)
}

/// Unregisters a helper's group from the orphan guard when the helper is done with.
struct Unregister(u32);

impl Drop for Unregister {
    fn drop(&mut self) {
        guard::unregister(self.0);
    }
}

/// Finds `program` on PATH (or checks it when it has a slash).
pub fn find_program(program: impl AsRef<OsStr>) -> Option<PathBuf> {
    let path = std::env::var_os("PATH");
    find_program_in(program, Path::new("."), path.as_deref())
}

/// Where `program` is found when run in `cwd` with `path` as its `PATH` (`None`: unset, the
/// C library's default), as `exec` finds it: a name with a `/` as it is (relative to `cwd`), a
/// bare name on the `PATH` (an empty entry is `cwd`).
pub fn find_program_in(
    program: impl AsRef<OsStr>,
    cwd: &Path,
    path: Option<&OsStr>,
) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let program = program.as_ref();
    if program.is_empty() {
        return None;
    }
    if program.as_bytes().contains(&b'/') {
        let at = cwd.join(program);
        return is_executable(&at).then_some(at);
    }
    // Bytes, as `exec` reads it: a PATH need not be UTF-8.
    path.unwrap_or(OsStr::new("/bin:/usr/bin"))
        .as_bytes()
        .split(|&b| b == b':')
        .map(|dir| cwd.join(OsStr::from_bytes(dir)).join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Describes an exit status the way a person reads it.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown exit".into(),
    }
}

#[cfg(test)]
mod tests;
