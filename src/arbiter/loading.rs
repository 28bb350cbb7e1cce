//! Holding grants while a watched program loads: a `[[gpu.watch]]` server that runs but does
//! not answer its health URL yet has not taken the memory it will take (vLLM reads 200 MiB
//! while it loads), so what the sample shows free is not free. Nothing that takes memory is
//! granted on its GPU until it answers, ends, or has loaded for its `load_timeout_s`.

use std::time::{Duration, Instant};

use crate::config::WatchConfig;
use crate::gpu::Snapshot;

use super::queue::Block;
use super::Core;

/// A program that ends while it loads and is started again within this long (a service
/// manager's restart) loads on from the first start: `load_timeout_s` bounds the whole.
const RESTART_WINDOW: Duration = Duration::from_secs(30);

/// What the samples told of one watched program.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// When it began loading (kept over a quick restart).
    since: Option<Instant>,
    /// When it was last seen loading.
    last: Option<Instant>,
    /// The processes that answered its health URL once: when they stop answering they are a
    /// server in trouble, not one that loads (its memory is taken).
    served: Vec<u32>,
}

fn key(name: &str) -> Block {
    Block::Loading(name.to_string())
}

impl Core {
    /// Blocks or unblocks this device's queue for each watched program as `snap` shows it.
    /// A program is this device's when its processes are listed on it, or, before it has
    /// touched any GPU (nothing listed yet), on every device.
    pub fn hold_while_loading(&self, snap: &Snapshot) {
        if snap.taken.is_none() {
            return;
        }
        let now = Instant::now();
        let mut seen = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        for watch in &self.watches {
            let seen = seen.entry(watch.name.clone()).or_default();
            let state = snap.watched.iter().find(|w| w.name == watch.name);
            if let Some(w) = state.filter(|w| w.healthy == Some(true)) {
                seen.served.clone_from(&w.pids);
            }
            let here = state.is_some_and(|w| {
                let devices: Vec<u32> = snap
                    .processes
                    .iter()
                    .filter(|p| w.pids.contains(&p.pid) || p.watch.as_deref() == Some(&w.name))
                    .map(|p| p.gpu_index)
                    .collect();
                !w.pids.is_empty()
                    && w.healthy == Some(false)
                    && !w.pids.iter().any(|p| seen.served.contains(p))
                    && (devices.is_empty() || devices.contains(&self.device))
            });
            if !here {
                let restarted_soon = seen.last.is_some_and(|t| now - t < RESTART_WINDOW);
                if state.is_some_and(|w| w.healthy == Some(true)) || !restarted_soon {
                    seen.since = None;
                }
                self.queue.unblock(&key(&watch.name));
                continue;
            }
            let since = *seen.since.get_or_insert(now);
            seen.last = Some(now);
            if self.loaded_too_long(watch, since, now) {
                continue;
            }
            let health = watch.health_url.as_deref().unwrap_or("its health URL");
            self.queue.block(
                key(&watch.name),
                format!(
                    "{} loads ({health} does not answer yet; its memory is not taken yet): \
                     grants wait until it answers, ends, or has loaded for {} s \
                     (load_timeout_s)",
                    watch.name, watch.load_timeout_s
                ),
            );
        }
    }

    /// Lifts the hold of each program that has loaded past its `load_timeout_s`, sample or not:
    /// samples that stop, or keep failing, must not hold every grant for ever.
    pub fn expire_loading(&self) {
        let now = Instant::now();
        let seen = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        for watch in &self.watches {
            if let Some(since) = seen.get(&watch.name).and_then(|s| s.since) {
                self.loaded_too_long(watch, since, now);
            }
        }
    }

    /// Whether `watch`, loading since `since`, is past its `load_timeout_s`; lifts its hold
    /// (once, with a warning) when it is.
    fn loaded_too_long(&self, watch: &WatchConfig, since: Instant, now: Instant) -> bool {
        let waited = now.duration_since(since).as_secs_f64();
        if waited < watch.load_timeout_s {
            return false;
        }
        if self.queue.blocked_by(&key(&watch.name)) {
            tracing::warn!(watch = %watch.name, seconds = waited.round(), "a watched program still loads after its load_timeout_s; grants go on by memory alone");
            self.queue.unblock(&key(&watch.name));
        }
        true
    }
}
