//! A place in the GPU queue (`Waiter`: its position, the wait for the grant, leaving on drop) and
//! the grant itself (`GpuPermit`: the GPU is handed on when it drops).

use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use super::GpuQueue;

/// A place in the queue. Dropping it leaves the queue at once.
#[derive(Debug)]
pub struct Waiter {
    pub(super) queue: Arc<GpuQueue>,
    pub(super) id: u64,
    pub(super) grant: oneshot::Receiver<()>,
    pub(super) version: watch::Receiver<u64>,
    /// `true` once this waiter turned into a permit (nothing to undo on drop).
    pub(super) consumed: bool,
}

/// The right to use the GPU. Dropping it hands the GPU to the next waiter.
#[derive(Debug)]
pub struct GpuPermit {
    pub(super) queue: Arc<GpuQueue>,
    pub(super) id: u64,
}

impl Waiter {
    /// 1-based position among the waiters (1 = next), or `None` once the GPU is granted.
    pub fn position(&self) -> Option<usize> {
        let state = self.queue.lock();
        state
            .waiting
            .iter()
            .position(|w| w.id == self.id)
            .map(|i| i + 1)
    }

    /// Whether the queue will never grant again (gpuhost shuts down): leave and say so.
    pub fn closed(&self) -> bool {
        self.queue.is_closed()
    }

    /// Waits for the next thing that happens to this waiter: `Some(permit)` when the GPU is
    /// ours, `None` when the queue changed (so the position may have). Cancel-safe.
    pub async fn next(&mut self) -> Option<GpuPermit> {
        tokio::select! {
            biased;
            granted = &mut self.grant => {
                // The queue never drops the sender of a live waiter.
                granted.expect("queue dropped a waiter's grant");
                self.consumed = true;
                Some(GpuPermit { queue: Arc::clone(&self.queue), id: self.id })
            }
            _ = self.version.changed() => None,
        }
    }

    /// Waits until the GPU is ours; `None` when the queue closes first.
    pub async fn granted(mut self) -> Option<GpuPermit> {
        loop {
            if self.closed() {
                return None;
            }
            if let Some(permit) = self.next().await {
                return Some(permit);
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.consumed {
            return;
        }
        let removed = {
            let mut state = self.queue.lock();
            let before = state.waiting.len();
            state.waiting.retain(|w| w.id != self.id);
            before != state.waiting.len()
        };
        if removed {
            self.queue.bump();
        } else {
            // Granted but never taken: give it back.
            self.queue.release(self.id);
        }
    }
}

impl Drop for GpuPermit {
    fn drop(&mut self) {
        self.queue.release(self.id);
    }
}
