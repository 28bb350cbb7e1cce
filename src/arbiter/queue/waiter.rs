//! A place in the GPU queue (`Waiter`: what happens to it as a [`Turn`], leaving on drop) and the
//! grant itself (`GpuPermit`: the GPU is handed on when it drops).

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
    /// The position and holders last told by [`Waiter::next`].
    pub(super) told: Option<(usize, Option<String>)>,
}

/// What happens to a place in the queue, as [`Waiter::next`] tells it.
#[derive(Debug)]
pub enum Turn {
    /// The GPU is ours.
    Granted(GpuPermit),
    /// Still waiting: told first at once, then whenever the position or what it waits for
    /// changes (a lease that ends and leaves the GPU blocked is no longer what it waits for).
    Waiting {
        /// 1-based (1 = next).
        position: usize,
        /// The holders, or why the queue is blocked (`GpuQueue::waiting_for`).
        waiting_for: Option<String>,
    },
    /// The queue will never grant again (gpuhost shuts down): the caller leaves and says so.
    Closed,
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

    /// Whether it is the first waiter that wants the GPU (jobs on the CPU before it wait for a
    /// job place only).
    pub fn first_for_the_gpu(&self) -> bool {
        self.queue
            .lock()
            .gpu_head()
            .is_some_and(|w| w.id == self.id)
    }

    /// Waits for the next thing to tell: the grant, a new position, or the queue's closing
    /// (which wins over a grant not yet taken: nothing starts once gpuhost shuts down).
    /// Cancel-safe: a grant that arrives while the caller is elsewhere waits for the next call.
    pub async fn next(&mut self) -> Turn {
        loop {
            if self.queue.is_closed() {
                return Turn::Closed;
            }
            if let Ok(()) = self.grant.try_recv() {
                return self.take();
            }
            if let Some(position) = self.position() {
                let now = (position, self.queue.waiting_for());
                if self.told.as_ref() != Some(&now) {
                    self.told = Some(now.clone());
                    let (position, waiting_for) = now;
                    return Turn::Waiting {
                        position,
                        waiting_for,
                    };
                }
            }
            tokio::select! {
                biased;
                granted = &mut self.grant => {
                    // The queue never drops the sender of a live waiter.
                    granted.expect("queue dropped a waiter's grant");
                    if !self.queue.is_closed() {
                        return self.take();
                    }
                }
                _ = self.version.changed() => {}
            }
        }
    }

    /// Waits until the GPU is ours; `None` when the queue closes first. (The server's waiters
    /// tell their place meanwhile: `job::turn`, the leases' and services' loops.)
    #[cfg(test)]
    pub async fn granted(mut self) -> Option<GpuPermit> {
        loop {
            match self.next().await {
                Turn::Granted(permit) => return Some(permit),
                Turn::Waiting { .. } => {}
                Turn::Closed => return None,
            }
        }
    }

    /// The permit for a grant received.
    fn take(&mut self) -> Turn {
        self.consumed = true;
        Turn::Granted(GpuPermit {
            queue: Arc::clone(&self.queue),
            id: self.id,
        })
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
            let removed = before != state.waiting.len();
            if removed {
                // What stood behind it may go now (a job held while a watched program loads
                // left, and jobs of loaded workers were behind it).
                self.queue.dispatch(&mut state);
            }
            removed
        };
        if removed {
            self.queue.bump();
        } else {
            // Granted but never taken: give it back.
            self.queue.release(self.id);
        }
    }
}

impl GpuPermit {
    /// Says, on the holder's label, that it ended and only its memory's return is awaited: a
    /// released lease holds the GPU until a sample shows its memory back, and "taken by lease
    /// 7 (alice)" after alice released it reads as a bug.
    pub fn ended(&self) {
        let mut state = self.queue.lock();
        if let Some(h) = state.holding.iter_mut().find(|h| h.id == self.id) {
            if !h.ticket.label.ends_with(ENDED) {
                h.ticket.label.push_str(ENDED);
            }
        }
        drop(state);
        self.queue.bump();
    }
}

/// What [`GpuPermit::ended`] adds to a holder's label.
const ENDED: &str = ", ended: waiting for a sample to show its memory back";

impl Drop for GpuPermit {
    fn drop(&mut self) {
        self.queue.release(self.id);
    }
}
