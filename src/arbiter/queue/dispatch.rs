//! Granting: whether the next waiter fits beside the holders (exclusive grants, VRAM sharing,
//! the block), handing out grants in order, and taking them back.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::sharing::{fits, Room};
use super::{Block, GpuQueue, HolderKind, Holding, QueueState, Ticket, Waiting};

/// Residents a waiter would be granted without (`GpuQueue::head_fits_if_freed`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Freed {
    /// Their footprints: what the sharing arithmetic counts for them.
    pub footprint_mib: u64,
    /// What the latest sample shows them using: what would read free once they are gone (a
    /// footprint is a peak, or a guess, not what a process holds now).
    pub used_mib: u64,
}

impl GpuQueue {
    pub(super) fn grantable(&self, state: &QueueState, ticket: &Ticket) -> bool {
        self.grantable_freeing(state, ticket, Freed::default())
    }

    /// Whether the first waiter for the GPU, a lease or a service, is held back only by loaded
    /// residents that `freed` describes (`share = "vram"`): unloaded, it would be granted beside
    /// the holders. Then the residents make room, not a service (a restarted vLLM costs minutes,
    /// a resident seconds), and a lease beside another does not wait until that one ends.
    pub fn head_fits_if_freed(&self, freed: Freed) -> bool {
        let state = self.lock();
        let Some(head) = state.gpu_head() else {
            return false;
        };
        // A lease or a service: a job may need the very residents (they would load again).
        freed.footprint_mib > 0
            && head.ticket.exclusive()
            && self.sharing.mode == super::super::sharing::ShareMode::Vram
            && !self.grantable(&state, &head.ticket)
            && self.grantable_freeing(&state, &head.ticket, freed)
    }

    /// [`GpuQueue::grantable`] as if the residents `freed` describes were unloaded.
    fn grantable_freeing(&self, state: &QueueState, ticket: &Ticket, freed: Freed) -> bool {
        let teardown = state
            .blocks
            .iter()
            .any(|(b, _)| matches!(b, Block::Teardown(_)));
        if state.closed {
            return false;
        }
        if ticket.on_cpu {
            return state.jobs() < self.max_running;
        }
        if teardown || self.held_by_loading(state, ticket) {
            return false;
        }
        let exclusive_held = state.holding.iter().any(|h| h.ticket.exclusive());
        let alone = if ticket.exclusive() {
            state.gpu_unheld()
        } else {
            state.holding.len() < self.max_running && !exclusive_held
        };
        if alone {
            return true;
        }
        if !ticket.exclusive() && state.jobs() >= self.max_running {
            return false;
        }
        // A job that holds the GPU loads the residents it runs on that were unloaded: until they
        // read as loaded (a job granted in this same dispatch has not begun to), they count as
        // loaded, and their memory as not free. A job granted meanwhile reloads nothing more.
        // Residents unloaded in thought (`freed`) are unloaded ones like the others: a job
        // holding the GPU would load them again.
        let room = self.room.get().and_then(|r| (r.0)()).map(|r| Room {
            residents_mib: r.residents_mib.saturating_sub(freed.footprint_mib),
            unloaded_residents_mib: r.unloaded_residents_mib.saturating_add(freed.footprint_mib),
            free_mib: r.free_mib.saturating_add(freed.used_mib),
            ..r
        });
        let room = room.map(|r| {
            let gpu_job = |h: &Holding| !h.ticket.exclusive() && !h.ticket.on_cpu;
            let reloading = if state.holding.iter().any(gpu_job) {
                r.unloaded_residents_mib
            } else {
                0
            };
            Room {
                residents_mib: r.residents_mib.saturating_add(reloading),
                unloaded_residents_mib: r.unloaded_residents_mib - reloading,
                // What the holders reserved and have not taken yet is not free for this one
                // either: a lease granted a moment ago has allocated nothing, and its memory
                // still reads free.
                free_mib: r
                    .free_mib
                    .saturating_sub(untaken(state))
                    .saturating_sub(reloading),
                ..r
            }
        });
        let holders_mib = state
            .holding
            .iter()
            .map(|h| h.ticket.need_mib)
            .try_fold(0u64, |sum, need| need.map(|n| sum.saturating_add(n)));
        let need = match ticket.kind {
            HolderKind::Job => ticket
                .need_mib
                .zip(room)
                .map(|(n, r)| n.saturating_add(r.unloaded_residents_mib)),
            _ => ticket.need_mib,
        };
        fits(&self.sharing, room, holders_mib, need)
    }

    /// Whether a watched program's loading holds `ticket` back: everything that takes memory,
    /// not a speech job whose workers are loaded already (a voice command waited out every
    /// vLLM restart); a job with a one-shot stage (`need_mib` not 0) loads one.
    pub(super) fn held_by_loading(&self, state: &QueueState, ticket: &Ticket) -> bool {
        if !state
            .blocks
            .iter()
            .any(|(b, _)| matches!(b, Block::Loading(_)))
        {
            return false;
        }
        if ticket.on_cpu {
            return false;
        }
        if ticket.kind != HolderKind::Job {
            return true;
        }
        let room = self.room.get().and_then(|r| (r.0)());
        ticket.loads_model() || room.is_none_or(|r| r.unloaded_residents_mib > 0)
    }

    /// Whether a later waiter that fits may go before one that does not.
    /// Whether a later waiter that fits may go first: `allow_backfill` under `share = "vram"`,
    /// except while residents are unloaded for the first waiter (the room made is its own).
    pub(super) fn backfills(&self) -> bool {
        self.sharing.allow_backfill
            && self.shares_vram()
            && !self.unloading_for_head.load(Ordering::SeqCst)
    }

    /// Grants the GPU to the heads of the queue while they fit; never past a head that does not
    /// (unless `allow_backfill` with `share = "vram"`), except that a speech job that waits for
    /// what its own one-shot stages need (a loading watched program, memory) lets the jobs of
    /// loaded workers behind it go, and jobs on the CPU go past anyone: they take nothing the
    /// waiters before them wait for.
    pub(super) fn dispatch(&self, state: &mut QueueState) {
        let room = self.vram_room();
        if let Some(room) = &room {
            settle(state, room);
        }
        let backfill = self.backfills();
        let mut passed_a_job = false;
        // A waiter that does not fit stands before the rest: only jobs on the CPU go past it
        // (they take nothing it waits for).
        let mut stuck = false;
        let mut i = 0;
        while i < state.waiting.len() {
            let ticket = &state.waiting[i].ticket;
            let loads = ticket.loads_model();
            let stops = stuck || (passed_a_job && !backfill && ticket.kind != HolderKind::Job);
            if stops && !ticket.on_cpu {
                stuck = true;
                i += 1;
                continue;
            }
            if passed_a_job && !backfill && loads {
                // Jobs that load keep their order among themselves.
                i += 1;
                continue;
            }
            if !self.grantable(state, ticket) {
                if backfill {
                    i += 1;
                    continue;
                }
                if loads {
                    passed_a_job = true;
                } else if !ticket.on_cpu {
                    // A job on the CPU waits for a job place only: nothing behind it that needs
                    // the GPU waits for what it waits for.
                    stuck = true;
                }
                i += 1;
                continue;
            }
            let Waiting {
                id,
                ticket,
                tx,
                since,
            } = state.waiting.remove(i);
            if tx.send(()).is_ok() {
                self.history.granted(
                    id,
                    self.device,
                    ticket.kind,
                    &ticket.label,
                    since.elapsed(),
                    ticket.on_cpu,
                );
                if state.gpu_unheld() && !ticket.on_cpu {
                    // The memory used outside the residents before this holder takes any.
                    state.taken_from = room.as_ref().map(outside);
                }
                state.holding.push(Holding {
                    id,
                    ticket,
                    since: Instant::now(),
                    taken_mib: 0,
                });
            }
        }
    }

    pub(super) fn release(&self, id: u64) {
        {
            let mut state = self.lock();
            let before = state.holding.len();
            state.holding.retain(|h| h.id != id);
            if state.holding.len() != before {
                self.history.released(self.device, id);
                // Its memory is back (a holder's permit goes only then): the start stays what
                // was used before the holders, and `dispatch`'s `settle` gives what is used
                // beyond it to those left. (Not rebuilt from their `taken_mib`: `settle` gives
                // memory in grant order, so a sample taken after this holder's program exited
                // but before its permit went credited it with the next holders' memory, and
                // they read as having taken nothing, their reservations counted twice.)
                if state.gpu_unheld() {
                    state.taken_from = None;
                }
            }
            self.dispatch(&mut state);
        }
        self.bump();
    }

    /// The device's memory now, when holders share it by memory.
    fn vram_room(&self) -> Option<Room> {
        if !self.shares_vram() {
            return None;
        }
        self.room.get().and_then(|r| (r.0)())
    }

    pub(super) fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// Whether `ticket` goes past every one of the waiters `ahead` (as `dispatch` lets it): a job
/// on the CPU past anyone, anyone past jobs on the CPU (they wait for a job place only), a job
/// of loaded workers past jobs that wait for what their one-shot stages need.
pub(super) fn passes(ahead: &[Waiting], ticket: &Ticket) -> bool {
    let loaded_job = ticket.kind == HolderKind::Job && !ticket.loads_model();
    ticket.on_cpu
        || ahead
            .iter()
            .all(|w| w.ticket.on_cpu || (loaded_job && w.ticket.loads_model()))
}

/// The device's used memory outside the residents' footprints.
fn outside(room: &Room) -> u64 {
    room.total_mib
        .saturating_sub(room.free_mib)
        .saturating_sub(room.residents_mib)
}

/// How much of their reservations (`need_mib`) the holders have not taken yet.
fn untaken(state: &QueueState) -> u64 {
    state
        .holding
        .iter()
        .map(|h| h.ticket.need_mib.unwrap_or(0).saturating_sub(h.taken_mib))
        .fold(0u64, u64::saturating_add)
}

/// Brings each holder's `taken_mib` up to date with `room`: what the used memory (outside the
/// residents) grew by since before the holders took theirs, given to them in the order they were
/// granted, each up to its reservation. Memory is not told apart by process (WSL's driver does
/// not say per process), so what an outside program takes meanwhile counts as the holders'; what
/// outside programs free lowers the start, and what a holder that ends took leaves with it
/// (its memory is back when its permit goes: the next `settle` gives the rest to those left).
fn settle(state: &mut QueueState, room: &Room) {
    let now = outside(room);
    let from = state.taken_from.get_or_insert(now);
    if now < *from {
        *from = now;
    }
    let mut grown = now - *from;
    for h in &mut state.holding {
        h.taken_mib = grown.min(h.ticket.need_mib.unwrap_or(0));
        grown -= h.taken_mib;
    }
}
