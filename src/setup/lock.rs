//! One setup at a time per worker package: an advisory `flock` on `<package>/.setup.lock`, held
//! while the venv is recovered, moved aside and built, and while `serve` checks it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// Name of the lock file in the package folder (beside `.venv`, which a rebuild moves).
pub(super) const LOCK_FILE: &str = ".setup.lock";

/// How often a waiting setup tries the lock again.
const RETRY: Duration = Duration::from_millis(200);

/// Held while it lives; the kernel releases it when the file closes, also when the process dies
/// (a killed setup leaves no stale lock). The descriptor is close-on-exec, so pip and the
/// package's prepare step, which setup runs, do not hold it.
pub(super) struct SetupLock {
    _file: Option<File>,
}

impl SetupLock {
    /// Waits for any other setup of this package to finish, saying once that it waits. Where no
    /// lock can be taken (no lock file and no right to make one, a file system without `flock`)
    /// it goes on unlocked: checking an installed venv must not fail for it, and building there
    /// fails on its own.
    pub(super) async fn take(home: &Path, name: &str, say: &dyn Fn(&str)) -> SetupLock {
        let file = match open(&home.join(LOCK_FILE)) {
            Ok(file) => file,
            Err(e) => {
                tracing::debug!(worker = name, error = %e, "no setup lock: going on without");
                return SetupLock { _file: None };
            }
        };
        let mut said = false;
        loop {
            match try_lock(&file) {
                Ok(true) => return SetupLock { _file: Some(file) },
                Ok(false) => {
                    if !said {
                        say(&format!(
                            "[{name}] another gpuhost setup is building this venv: waiting for it"
                        ));
                        said = true;
                    }
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => {
                    tracing::debug!(worker = name, error = %e, "no setup lock: going on without");
                    return SetupLock { _file: None };
                }
            }
        }
    }
}

/// The lock file, made if need be; read-only where this user may not write it (a `serve` run as
/// another user than `setup`, a checkout mounted read-only): `flock` needs no write access, so
/// such a reader still waits for a setup under way.
fn open(path: &Path) -> io::Result<File> {
    match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
    {
        Ok(file) => Ok(file),
        Err(_) => File::open(path),
    }
}

/// `Ok(false)`: another open file holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor this `File` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_second_taker_waits_for_the_first_and_says_so_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = SetupLock::take(dir.path(), "asr", &|_| {}).await;
        let said = std::sync::Mutex::new(Vec::new());
        let say = |line: &str| said.lock().unwrap().push(line.to_string());
        let second = SetupLock::take(dir.path(), "asr", &say);
        tokio::pin!(second);
        // Several retries go by while the first holds it.
        assert!(
            tokio::time::timeout(RETRY * 5, &mut second).await.is_err(),
            "taken twice"
        );
        drop(first);
        let _second = second.await;
        let said = said.lock().unwrap();
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("another gpuhost setup"), "{said:?}");
    }

    #[tokio::test]
    async fn a_folder_without_a_lock_file_is_used_unlocked() {
        let missing = Path::new("/nonexistent/gpuhost-package");
        let lock = SetupLock::take(missing, "asr", &|_| {}).await;
        assert!(lock._file.is_none());
    }
}
