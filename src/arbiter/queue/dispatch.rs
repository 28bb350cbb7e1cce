//! Granting: whether the next waiter fits beside the holders (exclusive grants, VRAM sharing,
//! the block), handing out grants in order, and taking them back.

use std::time::Instant;

use super::super::sharing::{fits, Room};
use super::{GpuQueue, HolderKind, Holding, QueueState, Ticket, Waiting};

impl GpuQueue {
    pub(super) fn grantable(&self, state: &QueueState, ticket: &Ticket) -> bool {
        if state.blocked().is_some() {
            return false;
        }
        let exclusive_held = state.holding.iter().any(|h| h.ticket.exclusive());
        let alone = if ticket.exclusive() {
            state.holding.is_empty()
        } else {
            state.holding.len() < self.max_running && !exclusive_held
        };
        if alone {
            return true;
        }
        let jobs = state
            .holding
            .iter()
            .filter(|h| h.ticket.kind == HolderKind::Job)
            .count();
        if !ticket.exclusive() && jobs >= self.max_running {
            return false;
        }
        let room = self.room.get().and_then(|r| (r.0)());
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
        // What the holders reserved and have not taken yet is not free for this one: a lease
        // granted a moment ago has allocated nothing, and its memory still reads free.
        let room = room.map(|r| Room {
            free_mib: r.free_mib.saturating_sub(untaken(state, &r)),
            ..r
        });
        fits(&self.sharing, room, holders_mib, need)
    }

    /// Whether a later waiter that fits may go before one that does not.
    pub(super) fn backfills(&self) -> bool {
        self.sharing.allow_backfill && self.shares_vram()
    }

    /// Grants the GPU to the heads of the queue while they fit; never past a head that does not
    /// (unless `allow_backfill` with `share = "vram"`).
    pub(super) fn dispatch(&self, state: &mut QueueState) {
        let backfill = self.backfills();
        let mut i = 0;
        while i < state.waiting.len() {
            if !self.grantable(state, &state.waiting[i].ticket) {
                if backfill {
                    i += 1;
                    continue;
                }
                break;
            }
            let Waiting {
                id,
                ticket,
                tx,
                since,
            } = state.waiting.remove(i);
            if tx.send(()).is_ok() {
                self.history
                    .granted(id, self.device, ticket.kind, &ticket.label, since.elapsed());
                let base_mib = self
                    .shares_vram()
                    .then(|| self.room.get().and_then(|r| (r.0)()))
                    .flatten()
                    .map(|r| outside(&r));
                state.holding.push(Holding {
                    id,
                    ticket,
                    since: Instant::now(),
                    base_mib,
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
            }
            self.dispatch(&mut state);
        }
        self.bump();
    }

    pub(super) fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// The device's used memory outside the residents' footprints.
fn outside(room: &Room) -> u64 {
    room.total_mib
        .saturating_sub(room.free_mib)
        .saturating_sub(room.residents_mib)
}

/// How much of their reservations (`need_mib`) the holders have not taken yet: all of them,
/// less what the used memory (outside the residents) grew by since the earliest grant among
/// them. A holder of unknown size reserves nothing here (nothing is granted beside it).
fn untaken(state: &QueueState, room: &Room) -> u64 {
    let reserved = state
        .holding
        .iter()
        .filter_map(|h| h.ticket.need_mib)
        .fold(0u64, u64::saturating_add);
    let grown = state
        .holding
        .iter()
        .filter_map(|h| h.base_mib)
        .min()
        .map_or(0, |base| outside(room).saturating_sub(base));
    reserved.saturating_sub(grown)
}
