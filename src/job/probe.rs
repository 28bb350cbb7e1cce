//! The temp dir check behind `/health` and `/ready`: at most one probe a second, off the async
//! runtime. Both endpoints are open to anyone, and each probe writes and syncs a file.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::temp_dir_usable;

/// How long a probe's answer is given again without a new probe.
const FRESH: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Last {
    answer: Option<(Instant, Result<(), String>)>,
    probing: bool,
}

pub struct TempProbe {
    dir: PathBuf,
    /// std: held only to read or store the answer, never across an `.await`. Shared with the
    /// probe's own task, which stores its answer even when the request that started it is gone.
    last: std::sync::Arc<std::sync::Mutex<Last>>,
}

impl TempProbe {
    pub fn new(dir: PathBuf) -> TempProbe {
        TempProbe {
            dir,
            last: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Last> {
        lock(&self.last)
    }

    /// Whether job folders can be made now; `Err` says why, without the server's path (the
    /// log has it). Callers while a probe runs get the one before it (none yet: usable).
    pub async fn check(&self) -> Result<(), String> {
        {
            let mut last = self.lock();
            match &last.answer {
                Some((at, answer)) if at.elapsed() < FRESH => return answer.clone(),
                Some((_, answer)) if last.probing => return answer.clone(),
                None if last.probing => return Ok(()),
                _ => last.probing = true,
            }
        }
        // Probed and stored by a blocking task of its own, which runs to its end: a caller that
        // goes away (a client that hangs up, a probe's timeout) must not leave `probing` set,
        // which froze every later answer.
        let (dir, shared) = (self.dir.clone(), std::sync::Arc::clone(&self.last));
        tokio::task::spawn_blocking(move || {
            let answer = temp_dir_usable(&dir);
            let mut last = lock(&shared);
            let was_ok = last.answer.as_ref().is_none_or(|(_, a)| a.is_ok());
            if let (true, Err(why)) = (was_ok, &answer) {
                tracing::warn!(dir = %dir.display(), problem = %why, "the temp dir is unusable: no job can start");
            }
            last.answer = Some((Instant::now(), answer.clone()));
            last.probing = false;
            answer
        })
        .await
        .unwrap_or_else(|_| Err("the temp dir check failed".into()))
    }
}

fn lock(last: &std::sync::Mutex<Last>) -> std::sync::MutexGuard<'_, Last> {
    last.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn says_why_without_the_path_and_sees_a_repair_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        // Under a file: it cannot be made (a missing temp dir that can be made is usable).
        let blocker = dir.path().join("a-file");
        std::fs::write(&blocker, b"").unwrap();
        let probe = TempProbe::new(blocker.join("secret-place"));
        let why = probe.check().await.unwrap_err();
        assert!(!why.contains("secret-place"), "{why}");
        assert!(why.contains("limits.temp_dir"), "{why}");
        std::fs::remove_file(&blocker).unwrap();
        // The answer is kept for a second, then probed again.
        assert!(probe.check().await.is_err());
        probe.lock().answer.as_mut().unwrap().0 -= FRESH;
        assert_eq!(probe.check().await, Ok(()));
        assert!(blocker.join("secret-place").is_dir());
    }

    #[tokio::test]
    async fn a_missing_temp_dir_is_made_as_a_job_would_make_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not").join("yet");
        assert_eq!(TempProbe::new(missing.clone()).check().await, Ok(()));
        assert!(missing.is_dir());
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_does_not_freeze_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("a-file");
        std::fs::write(&blocker, b"").unwrap();
        let probe = TempProbe::new(blocker.join("not-yet"));
        // Polled once (the probe starts), then dropped.
        let mut started = Box::pin(probe.check());
        assert!(futures_util::poll!(&mut started).is_pending());
        drop(started);
        // The probe finishes on its own and says what it found.
        for _ in 0..200 {
            if !probe.lock().probing {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(probe.check().await.is_err(), "frozen on no answer");
    }
}
