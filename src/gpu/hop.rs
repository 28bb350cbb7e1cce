//! A blocking call of the sampler (an NVML driver call, the `/proc` reads of a sample) off the
//! runtime threads: one at a time, each bounded. A wedged driver, or a process stuck in it whose
//! `/proc/PID/cmdline` blocks its readers (as `ps` hangs), must not end sampling, nor pile up
//! blocking threads behind it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a bounded call gave nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum HopError {
    #[error("{what} did not finish within {timeout:?} {why}")]
    Timeout {
        what: String,
        why: &'static str,
        timeout: Duration,
    },
    #[error("{what} has not returned for {secs} s {why}")]
    Stuck {
        what: String,
        why: &'static str,
        secs: u64,
    },
    #[error("{what} failed: {message}")]
    Panicked { what: String, message: String },
}

/// Runs the blocking calls; remembers a call still under way so that a stuck one is waited on
/// by no sample after it and no second thread piles up behind it.
#[derive(Debug)]
pub(crate) struct Hop {
    /// The call, for messages (`reading /proc/`, `an NVML call`).
    what: String,
    /// What is likely wrong when it hangs, and what that costs.
    why: &'static str,
    timeout: Duration,
    /// Set while a call runs, cleared by the blocking thread itself when it returns (atomic:
    /// written off the runtime, read by the sampler without waiting).
    in_flight: Arc<AtomicBool>,
    /// Since when calls have not come back, for the log lines and the error's age.
    stuck_since: Option<Instant>,
}

impl Hop {
    pub(crate) fn new(what: String, why: &'static str, timeout: Duration) -> Hop {
        Hop {
            what,
            why,
            timeout,
            in_flight: Arc::default(),
            stuck_since: None,
        }
    }

    /// `read` on a blocking thread, unless the previous one is still there.
    pub(crate) async fn run<T: Send + 'static>(
        &mut self,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HopError> {
        if self.in_flight.swap(true, Ordering::AcqRel) {
            let since = *self.stuck_since.get_or_insert_with(Instant::now);
            return Err(HopError::Stuck {
                what: self.what.clone(),
                why: self.why,
                secs: since.elapsed().as_secs() + self.timeout.as_secs(),
            });
        }
        let done = Done(Arc::clone(&self.in_flight));
        let call = tokio::task::spawn_blocking(move || {
            let _done = done;
            read()
        });
        let out = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(HopError::Panicked {
                what: self.what.clone(),
                message: e.to_string(),
            }),
            Err(_) => Err(HopError::Timeout {
                what: self.what.clone(),
                why: self.why,
                timeout: self.timeout,
            }),
        };
        match (&out, self.stuck_since) {
            (Err(HopError::Timeout { .. }), None) => {
                tracing::warn!(timeout = ?self.timeout, "{} hangs {}: the GPU reads unknown until it returns", self.what, self.why);
                self.stuck_since = Some(Instant::now());
            }
            (Ok(_), Some(since)) => {
                tracing::info!(after = ?since.elapsed() + self.timeout, "{} works again: GPU sampling goes on", self.what);
                self.stuck_since = None;
            }
            _ => {}
        }
        out
    }
}

/// Clears the in-flight flag when the read returns or panics.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stuck_proc_read_is_waited_on_once_and_a_panicking_one_frees_the_next() {
        let mut hop = Hop::new(
            "reading /proc/".into(),
            "(stuck?)",
            Duration::from_millis(300),
        );
        let (release, held) = std::sync::mpsc::channel::<()>();
        let stuck = hop.run(move || held.recv().is_ok()).await;
        assert!(matches!(stuck, Err(HopError::Timeout { .. })), "{stuck:?}");
        // The next samples do not start a second read behind the stuck one.
        let next = hop.run(|| true).await;
        assert!(matches!(next, Err(HopError::Stuck { .. })), "{next:?}");
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match hop.run(|| 7).await {
                Ok(v) => break assert_eq!(v, 7),
                Err(HopError::Stuck { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                other => panic!("{other:?}"),
            }
        }
        // (A panic's backtrace may take long to print on a loaded machine: a roomier bound.)
        let mut hop = Hop::new("reading /proc/".into(), "(stuck?)", Duration::from_secs(30));
        let panicked = hop.run(|| -> u8 { panic!("odd /proc") }).await;
        assert!(
            matches!(panicked, Err(HopError::Panicked { .. })),
            "{panicked:?}"
        );
        assert_eq!(hop.run(|| 8).await, Ok(8));
    }
}
