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
use dispatch::passes;
mod view;
mod waiter;

pub use dispatch::Freed;
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
    /// A speech job whose every stage runs on a loaded resident that said it runs on the CPU
    /// (`job::ticket`): it takes nothing of the GPU, so it runs beside services and leases (and
    /// they beside it), through blocks and loading programs; it counts among the jobs
    /// (`max_concurrent_jobs`) only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub on_cpu: bool,
}

impl Ticket {
    pub fn job(priority: i32) -> Ticket {
        Ticket {
            kind: HolderKind::Job,
            label: "speech job".into(),
            priority,
            // Its resident workers' memory is counted in `Room`; one-shot stages add theirs
            // (`job::ticket`).
            need_mib: Some(0),
            on_cpu: false,
        }
    }

    /// A speech job that loads a model when granted (a one-shot stage: `need_mib` not 0). It
    /// waits for what that model needs, and jobs of loaded workers need not wait behind it.
    pub fn loads_model(&self) -> bool {
        self.kind == HolderKind::Job && self.need_mib != Some(0)
    }

    /// Services and leases hold the whole GPU; jobs share it with jobs.
    pub fn exclusive(&self) -> bool {
        self.kind != HolderKind::Job
    }
}

/// Why nothing is granted for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// The memory of a holder that ended did not come back (the n-th such teardown).
    Teardown(u64),
    /// A watched program (`[[gpu.watch]]`, by name) is loading.
    Loading(String),
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
    /// Residents are being unloaded for the first waiter (`Core::unload_for_head`): no service
    /// is stopped for it meanwhile, and nothing goes past it (`allow_backfill` would let a later
    /// waiter take the room being made, and more residents be unloaded for the first).
    pub(super) unloading_for_head: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct Holding {
    id: u64,
    ticket: Ticket,
    since: Instant,
    /// How much of its reservation it has taken, as far as the samples tell (`share = "vram"`;
    /// see `dispatch::settle`).
    taken_mib: u64,
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
    /// While any is set, nothing is granted: each block with its reason. Each is lifted on its
    /// own: one holder's memory coming back says nothing of another's.
    blocks: Vec<(Block, String)>,
    /// `share = "vram"`: the used memory outside the residents before the holders took theirs
    /// (`None` while nobody holds the GPU).
    taken_from: Option<u64>,
    /// gpuhost is shutting down: nothing is granted again, and every waiter is told so.
    closed: bool,
}

impl QueueState {
    fn blocked(&self) -> Option<String> {
        if self.closed {
            return Some("gpuhost is shutting down".into());
        }
        let reasons: Vec<&str> = self.blocks.iter().map(|(_, why)| why.as_str()).collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// How many speech jobs hold the GPU (those on the CPU too: `max_concurrent_jobs`).
    fn jobs(&self) -> usize {
        self.holding
            .iter()
            .filter(|h| h.ticket.kind == HolderKind::Job)
            .count()
    }

    /// The first waiter that wants the GPU (jobs on the CPU wait for a place among jobs only).
    fn gpu_head(&self) -> Option<&Waiting> {
        self.waiting.iter().find(|w| !w.ticket.on_cpu)
    }

    /// Whether every holder runs on the CPU (or none holds): the GPU itself is nobody's.
    fn gpu_unheld(&self) -> bool {
        self.holding.iter().all(|h| h.ticket.on_cpu)
    }
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
            unloading_for_head: Default::default(),
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
            let at = state
                .waiting
                .iter()
                .position(|w| w.ticket.priority < ticket.priority)
                .unwrap_or(state.waiting.len());
            // A request that would be granted at once never counts as waiting: one that fits,
            // and that no waiter stands before (the waiters are those that do not fit), unless
            // what fits may go ahead (`allow_backfill`).
            let at_once = (at == 0 || self.backfills() || passes(&state.waiting[..at], &ticket))
                && self.grantable(&state, &ticket);
            if !at_once && state.waiting.len() >= max_waiting {
                return None;
            }
            let id = state.next_id;
            state.next_id += 1;
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

    /// The first waiter's ticket that wants the GPU (jobs on the CPU wait for a place among
    /// jobs only), if one waits.
    pub fn head(&self) -> Option<Ticket> {
        self.lock().gpu_head().map(|w| w.ticket.clone())
    }

    /// How many hold the GPU itself (not the jobs that run on the CPU).
    pub fn gpu_holders(&self) -> usize {
        self.lock()
            .holding
            .iter()
            .filter(|h| !h.ticket.on_cpu)
            .count()
    }

    /// Whether an exclusive grant (service or lease) is held now.
    pub fn exclusive_held(&self) -> bool {
        self.lock().holding.iter().any(|h| h.ticket.exclusive())
    }

    /// Stops granting until `unblock(block)` (and every other block is lifted): a holder's
    /// memory never came back, a watched program loads. The same block again changes its reason.
    pub fn block(&self, block: Block, reason: String) {
        {
            let mut state = self.lock();
            match state.blocks.iter_mut().find(|(b, _)| *b == block) {
                Some((_, why)) if *why == reason => return,
                Some((_, why)) => *why = reason,
                None => state.blocks.push((block, reason)),
            }
        }
        self.bump();
    }

    /// Lifts `block` (not set: nothing happens).
    pub fn unblock(&self, block: &Block) {
        {
            let mut state = self.lock();
            let before = state.blocks.len();
            state.blocks.retain(|(b, _)| b != block);
            if state.blocks.len() == before {
                return;
            }
            self.dispatch(&mut state);
        }
        self.bump();
    }

    /// Whether `block` is set.
    pub fn blocked_by(&self, block: &Block) -> bool {
        self.lock().blocks.iter().any(|(b, _)| b == block)
    }

    /// Why nothing is granted because memory a holder left behind has not come back (or
    /// gpuhost shuts down); a watched program's loading is not counted: it ends by itself.
    pub fn blocked_on_memory(&self) -> Option<String> {
        let state = self.lock();
        if state.closed {
            return state.blocked();
        }
        let reasons: Vec<&str> = state
            .blocks
            .iter()
            .filter(|(b, _)| matches!(b, Block::Teardown(_)))
            .map(|(_, why)| why.as_str())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// Grants nothing more, ever (gpuhost shuts down): each waiter is told [`Turn::Closed`].
    pub fn close(&self) {
        self.lock().closed = true;
        self.bump();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Why nothing is granted now, if so: the blocks' reasons, or the shutdown.
    pub fn blocked(&self) -> Option<String> {
        self.lock().blocked()
    }

    /// Whether the first waiter waits for room that a service could give (its memory, or the
    /// GPU it holds alone), not only for a place among jobs (`max_concurrent_jobs`): a
    /// service stops to make room only for the first kind.
    pub fn head_waits_for_room(&self) -> bool {
        let state = self.lock();
        let Some(head) = state.gpu_head() else {
            return false;
        };
        if state
            .blocks
            .iter()
            .any(|(b, _)| matches!(b, Block::Teardown(_)))
        {
            return true;
        }
        // Held while a watched program loads: no service's room would change that.
        if self.held_by_loading(&state, &head.ticket) {
            return false;
        }
        if head.ticket.exclusive() {
            return true;
        }
        state.jobs() < self.max_running
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
