//! Granting: whether the next waiter fits beside the holders (exclusive grants, VRAM sharing,
//! the block), handing out grants in order, and taking them back.

use std::time::Instant;

use super::super::sharing::fits;
use super::{GpuQueue, HolderKind, Holding, QueueState, Ticket, Waiting};

impl GpuQueue {
    pub(super) fn grantable(&self, state: &QueueState, ticket: &Ticket) -> bool {
        if state.blocked.is_some() {
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
        fits(&self.sharing, room, holders_mib, need)
    }

    /// Grants the GPU to the heads of the queue while they fit; never past a head that does not
    /// (unless `allow_backfill` with `share = "vram"`).
    pub(super) fn dispatch(&self, state: &mut QueueState) {
        let backfill = self.sharing.allow_backfill && self.shares_vram();
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
                state.holding.push(Holding {
                    id,
                    ticket,
                    since: Instant::now(),
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
