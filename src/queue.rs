//! The GPU queue: a fair FIFO gate around GPU work that also tells each waiter its position.
//!
//! `tokio::sync::Mutex` is FIFO too, but cannot say where a waiter stands, and positions are part
//! of the API. So the queue keeps its own list behind a `std::sync::Mutex` (held only for a few
//! instructions, never across an `.await`); a grant travels over a oneshot, and a `GpuPermit` is
//! the guard that is held across the `.await`s of a job. `/health` and `/status` read counters only.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};

#[derive(Debug)]
pub struct GpuQueue {
    /// Short critical sections only (`.await` rule): std Mutex.
    state: Mutex<QueueState>,
    /// Bumped on every change so waiters can recompute their position.
    version: watch::Sender<u64>,
    max_running: usize,
}

#[derive(Debug, Default)]
struct QueueState {
    running: usize,
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    next_id: u64,
}

/// A place in the queue. Dropping it leaves the queue at once.
#[derive(Debug)]
pub struct Waiter {
    queue: Arc<GpuQueue>,
    id: u64,
    grant: oneshot::Receiver<()>,
    version: watch::Receiver<u64>,
    /// `true` once this waiter turned into a permit (nothing to undo on drop).
    consumed: bool,
}

/// The right to use the GPU. Dropping it hands the GPU to the next waiter.
#[derive(Debug)]
pub struct GpuPermit {
    queue: Arc<GpuQueue>,
}

impl GpuQueue {
    pub fn new(max_running: usize) -> Arc<GpuQueue> {
        Arc::new(GpuQueue {
            state: Mutex::new(QueueState::default()),
            version: watch::Sender::new(0),
            max_running: max_running.max(1),
        })
    }

    /// Joins the end of the queue.
    pub fn enqueue(self: &Arc<Self>) -> Waiter {
        self.try_enqueue(usize::MAX)
            .expect("an unbounded queue is never full")
    }

    /// Joins the end of the queue unless `max_waiting` requests already wait (then `None`); the
    /// check and the join are one step, so concurrent callers never overshoot the bound.
    pub fn try_enqueue(self: &Arc<Self>, max_waiting: usize) -> Option<Waiter> {
        let (tx, grant) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            // A request that would be granted at once never counts as waiting.
            let free = state.running < self.max_running && state.waiting.is_empty();
            if !free && state.waiting.len() >= max_waiting {
                return None;
            }
            let id = state.next_id;
            state.next_id += 1;
            state.waiting.push_back((id, tx));
            self.dispatch(&mut state);
            id
        };
        self.bump();
        Some(Waiter {
            queue: Arc::clone(self),
            id,
            grant,
            version: self.version.subscribe(),
            consumed: false,
        })
    }

    /// Jobs holding the GPU now.
    pub fn running(&self) -> usize {
        self.lock().running
    }

    /// Jobs waiting for the GPU now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding this lock cannot leave the counters half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grants the GPU to the heads of the queue while capacity is free.
    fn dispatch(&self, state: &mut QueueState) {
        while state.running < self.max_running {
            let Some((_, tx)) = state.waiting.pop_front() else {
                break;
            };
            state.running += 1;
            if tx.send(()).is_err() {
                // The waiter vanished between leaving the list and the grant.
                state.running -= 1;
            }
        }
    }

    fn release(&self) {
        {
            let mut state = self.lock();
            state.running -= 1;
            self.dispatch(&mut state);
        }
        self.bump();
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

impl Waiter {
    /// 1-based position among the waiters (1 = next), or `None` once the GPU is granted.
    pub fn position(&self) -> Option<usize> {
        let state = self.queue.lock();
        state
            .waiting
            .iter()
            .position(|(id, _)| *id == self.id)
            .map(|i| i + 1)
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
                Some(GpuPermit { queue: Arc::clone(&self.queue) })
            }
            _ = self.version.changed() => None,
        }
    }

    /// Waits until the GPU is ours.
    pub async fn granted(mut self) -> GpuPermit {
        loop {
            if let Some(permit) = self.next().await {
                return permit;
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
            state.waiting.retain(|(id, _)| *id != self.id);
            before != state.waiting.len()
        };
        if removed {
            self.queue.bump();
        } else {
            // Granted but never taken: give it back.
            self.queue.release();
        }
    }
}

impl Drop for GpuPermit {
    fn drop(&mut self) {
        self.queue.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fifo_positions_and_leaving() {
        let q = GpuQueue::new(1);
        let a = q.enqueue();
        let first = a.granted().await;
        let b = q.enqueue();
        let c = q.enqueue();
        let d = q.enqueue();
        assert_eq!(
            (b.position(), c.position(), d.position()),
            (Some(1), Some(2), Some(3))
        );
        drop(c);
        assert_eq!(d.position(), Some(2));
        drop(b);
        assert_eq!(d.position(), Some(1));
        drop(first);
        let _second = d.granted().await;
        assert_eq!(q.running(), 1);
        assert_eq!(q.waiting(), 0);
    }

    #[tokio::test]
    async fn granted_but_dropped_waiter_releases() {
        let q = GpuQueue::new(1);
        let a = q.enqueue();
        let p = a.granted().await;
        let b = q.enqueue();
        let c = q.enqueue();
        drop(p); // b is granted now
        drop(b); // …and never takes it
        let _pc = c.granted().await;
        assert_eq!(q.running(), 1);
    }

    #[tokio::test]
    async fn bounded_waiting() {
        let q = GpuQueue::new(1);
        let running = q.try_enqueue(1).unwrap();
        let _permit = running.granted().await;
        let waiting = q.try_enqueue(1).unwrap();
        assert!(q.try_enqueue(1).is_none(), "one waits already");
        drop(waiting);
        assert!(q.try_enqueue(1).is_some());
    }

    #[tokio::test]
    async fn capacity_two() {
        let q = GpuQueue::new(2);
        let a = q.enqueue();
        let b = q.enqueue();
        let c = q.enqueue();
        let _pa = a.granted().await;
        let _pb = b.granted().await;
        assert_eq!(c.position(), Some(1));
    }
}
