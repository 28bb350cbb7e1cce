//! The GPU queue: the one FIFO (within a priority) through which every grant of the GPU passes —
//! speech jobs, service starts and leases — and which tells each waiter its position and what it
//! waits for. Nothing running is ever interrupted; a higher priority only orders the waiters.
//!
//! `tokio::sync::Mutex` is FIFO too, but cannot say where a waiter stands, and positions are part
//! of the API. So the queue keeps its own lists behind a `std::sync::Mutex` (held only for a few
//! instructions, never across an `.await`); a grant travels over a oneshot, and a `GpuPermit` is
//! the guard that is held across the `.await`s of a job. `/health` and `/status` read counters only.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{oneshot, watch};

mod dispatch;
mod view;
mod waiter;

pub use view::{HolderView, WaiterView};
pub use waiter::{GpuPermit, Turn, Waiter};

use super::history::History;
use super::sharing::{RoomSource, ShareMode, Sharing};

/// Who asks for the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HolderKind {
    /// A speech job (`/transcribe`): shares the GPU with other jobs up to `max_concurrent_jobs`.
    Job,
    /// An on-demand service from its start until its verified teardown: exclusive.
    Service,
    /// A lease for an outside program: exclusive.
    Lease,
}

/// What a request for the GPU is.
#[derive(Debug, Clone, Serialize)]
pub struct Ticket {
    pub kind: HolderKind,
    /// Who it is, for people: `job`, `service vllm`, `lease 7 (alice: training)`.
    pub label: String,
    /// Higher first; FIFO within a priority.
    pub priority: i32,
    /// The memory it needs, when known (`share = "vram"` packs only known sizes).
    pub need_mib: Option<u64>,
}

impl Ticket {
    pub fn job(priority: i32) -> Ticket {
        Ticket {
            kind: HolderKind::Job,
            label: "speech job".into(),
            priority,
            // Its workers' memory is counted as resident; see `Room`.
            need_mib: Some(0),
        }
    }

    /// Services and leases hold the whole GPU; jobs share it with jobs.
    pub fn exclusive(&self) -> bool {
        self.kind != HolderKind::Job
    }
}

#[derive(Debug)]
pub struct GpuQueue {
    /// Short critical sections only (`.await` rule): std Mutex.
    state: Mutex<QueueState>,
    /// Bumped on every change so waiters can recompute their position.
    version: watch::Sender<u64>,
    max_running: usize,
    /// Every grant, for `/gpu/history` and the audit log (one history for every device).
    pub history: Arc<History>,
    /// The GPU this queue grants.
    pub device: u32,
    sharing: Sharing,
    /// The device's memory now, for `share = "vram"`; set once by the arbiter.
    room: std::sync::OnceLock<RoomSource>,
}

#[derive(Debug)]
struct Holding {
    id: u64,
    ticket: Ticket,
    since: Instant,
}

#[derive(Debug)]
struct Waiting {
    id: u64,
    ticket: Ticket,
    tx: oneshot::Sender<()>,
    since: Instant,
}

#[derive(Debug, Default)]
struct QueueState {
    holding: Vec<Holding>,
    /// Ordered by priority (high first), then arrival.
    waiting: Vec<Waiting>,
    next_id: u64,
    /// While set, nothing is granted (a teardown that never completed): the reason.
    blocked: Option<String>,
    /// gpuhost is shutting down: nothing is granted again, and every waiter is told so.
    closed: bool,
}

impl GpuQueue {
    pub fn new(max_running: usize) -> Arc<GpuQueue> {
        GpuQueue::with_sharing(
            max_running,
            Arc::new(History::new(std::time::Duration::from_secs(3600))),
            Sharing::default(),
            0,
        )
    }

    /// The queue of `device`, which may pack holders by memory (see `sharing.rs`).
    pub fn with_sharing(
        max_running: usize,
        history: Arc<History>,
        sharing: Sharing,
        device: u32,
    ) -> Arc<GpuQueue> {
        Arc::new(GpuQueue {
            state: Mutex::new(QueueState::default()),
            version: watch::Sender::new(0),
            max_running: max_running.max(1),
            history,
            device,
            sharing,
            room: std::sync::OnceLock::new(),
        })
    }

    /// Tells the queue how to read the device's memory (once; later calls are ignored).
    pub fn set_room(&self, source: RoomSource) {
        let _ = self.room.set(source);
    }

    /// Whether holders may share the GPU by memory.
    pub fn shares_vram(&self) -> bool {
        self.sharing.mode == ShareMode::Vram
    }

    /// Grants what fits now (after the memory changed; only matters with `share = "vram"`).
    pub fn redispatch(&self) {
        if !self.shares_vram() {
            return;
        }
        let granted = {
            let mut state = self.lock();
            let before = state.holding.len();
            self.dispatch(&mut state);
            state.holding.len() != before
        };
        if granted {
            self.bump();
        }
    }

    /// Joins the queue as a speech job of normal priority.
    pub fn enqueue(self: &Arc<Self>) -> Waiter {
        self.try_enqueue(Ticket::job(0), usize::MAX)
            .expect("an unbounded queue is never full")
    }

    /// Joins the queue unless `max_waiting` requests already wait (then `None`); the check and
    /// the join are one step, so concurrent callers never overshoot the bound.
    pub fn try_enqueue(self: &Arc<Self>, ticket: Ticket, max_waiting: usize) -> Option<Waiter> {
        let (tx, grant) = oneshot::channel();
        let id = {
            let mut state = self.lock();
            // A request that would be granted at once never counts as waiting.
            if !self.grantable(&state, &ticket) && state.waiting.len() >= max_waiting {
                return None;
            }
            let id = state.next_id;
            state.next_id += 1;
            let at = state
                .waiting
                .iter()
                .position(|w| w.ticket.priority < ticket.priority)
                .unwrap_or(state.waiting.len());
            state.waiting.insert(
                at,
                Waiting {
                    id,
                    ticket,
                    tx,
                    since: Instant::now(),
                },
            );
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
            told: None,
        })
    }

    /// Requests holding the GPU now.
    pub fn running(&self) -> usize {
        self.lock().holding.len()
    }

    /// Requests waiting for the GPU now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The first waiter's ticket, if one waits.
    pub fn head(&self) -> Option<Ticket> {
        self.lock().waiting.first().map(|w| w.ticket.clone())
    }

    /// Whether an exclusive grant (service or lease) is held now.
    pub fn exclusive_held(&self) -> bool {
        self.lock().holding.iter().any(|h| h.ticket.exclusive())
    }

    /// Stops granting until `unblock`: the last holder's memory never came back.
    pub fn block(&self, reason: String) {
        self.lock().blocked = Some(reason);
        self.bump();
    }

    /// Grants nothing more, ever (gpuhost shuts down): each waiter is told [`Turn::Closed`].
    pub fn close(&self) {
        {
            let mut state = self.lock();
            state.closed = true;
            state.blocked = Some("gpuhost is shutting down".into());
        }
        self.bump();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    pub fn unblock(&self) {
        {
            let mut state = self.lock();
            if state.closed {
                return;
            }
            state.blocked = None;
            self.dispatch(&mut state);
        }
        self.bump();
    }

    pub fn blocked(&self) -> Option<String> {
        self.lock().blocked.clone()
    }

    /// A receiver that changes whenever the queue does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A panic while holding this lock cannot leave the lists half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// "1 request already waits", "3 requests already wait": what a full queue holds, in words.
pub fn already_waiting(n: usize) -> String {
    match n {
        1 => "1 request already waits".into(),
        n => format!("{n} requests already wait"),
    }
}

#[cfg(test)]
mod tests;
