//! The `/proc` reads of a sample, off the runtime threads: one at a time, each bounded. Reading
//! `/proc/PID/cmdline` blocks while that process's memory map is locked (a process stuck in the
//! driver), the same way `ps` hangs; a read that never returns must not end sampling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the `/proc` reads of one sample gave nothing.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum HopError {
    #[error("reading {root}/ did not finish within {timeout:?} (a process stuck in the kernel?): GPU processes cannot be told apart")]
    Timeout { root: String, timeout: Duration },
    #[error("reading {root}/ has not returned for {secs} s (a process stuck in the kernel?): GPU processes cannot be told apart")]
    Stuck { root: String, secs: u64 },
    #[error("reading {root}/ failed: {message}")]
    Panicked { root: String, message: String },
}

/// Runs the blocking reads; remembers a read still under way so that a stuck one is waited on
/// by no sample after it and no second thread piles up behind it.
pub(super) struct Hop {
    root: String,
    timeout: Duration,
    /// Set while a read runs, cleared by the blocking thread itself when it returns (atomic:
    /// written off the runtime, read by the sampler without waiting).
    in_flight: Arc<AtomicBool>,
    /// Since when reads have not come back, for the log lines and the error's age.
    stuck_since: Option<Instant>,
}

impl Hop {
    pub(super) fn new(root: String, timeout: Duration) -> Hop {
        Hop {
            root,
            timeout,
            in_flight: Arc::default(),
            stuck_since: None,
        }
    }

    /// `read` on a blocking thread, unless the previous one is still there.
    pub(super) async fn run<T: Send + 'static>(
        &mut self,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HopError> {
        if self.in_flight.swap(true, Ordering::AcqRel) {
            let since = *self.stuck_since.get_or_insert_with(Instant::now);
            return Err(HopError::Stuck {
                root: self.root.clone(),
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
                root: self.root.clone(),
                message: e.to_string(),
            }),
            Err(_) => Err(HopError::Timeout {
                root: self.root.clone(),
                timeout: self.timeout,
            }),
        };
        match (&out, self.stuck_since) {
            (Err(HopError::Timeout { .. }), None) => {
                tracing::warn!(root = %self.root, timeout = ?self.timeout, "reading /proc hangs (a process stuck in the kernel?): the GPU reads unknown until it returns");
                self.stuck_since = Some(Instant::now());
            }
            (Ok(_), Some(since)) => {
                tracing::info!(root = %self.root, after = ?since.elapsed() + self.timeout, "reading /proc works again: GPU sampling goes on");
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
