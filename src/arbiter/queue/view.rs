//! The queue as `/status` and `/gpu/leases` show it: holders, waiters with their positions, and
//! what the first waiter waits for.

use serde::Serialize;

use super::{GpuQueue, HolderKind};

/// A holder of the GPU, as `/status` and `/gpu/leases` show it.
#[derive(Debug, Clone, Serialize)]
pub struct HolderView {
    pub kind: HolderKind,
    pub label: String,
    pub held_s: f64,
    /// A speech job that runs on the CPU only (`Ticket::on_cpu`): a place among the jobs, no
    /// part of the GPU.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub on_cpu: bool,
}

/// A waiter, as `/gpu/leases` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct WaiterView {
    pub position: usize,
    pub kind: HolderKind,
    pub label: String,
    pub priority: i32,
}

impl GpuQueue {
    /// How many hold the GPU and how many wait, as `/status`, `/workers` and `/health` say it.
    pub fn counts(&self) -> serde_json::Value {
        serde_json::json!({ "running": self.running(), "waiting": self.waiting() })
    }

    pub fn holders(&self) -> Vec<HolderView> {
        self.lock()
            .holding
            .iter()
            .map(|h| HolderView {
                kind: h.ticket.kind,
                label: h.ticket.label.clone(),
                held_s: (h.since.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
                on_cpu: h.ticket.on_cpu,
            })
            .collect()
    }

    pub fn waiters(&self) -> Vec<WaiterView> {
        self.lock()
            .waiting
            .iter()
            .enumerate()
            .map(|(i, w)| WaiterView {
                position: i + 1,
                kind: w.ticket.kind,
                label: w.ticket.label.clone(),
                priority: w.ticket.priority,
            })
            .collect()
    }

    /// What the first waiter waits for, in words (holders, or the block).
    pub fn waiting_for(&self) -> Option<String> {
        let state = self.lock();
        if state.closed {
            return state.blocked();
        }
        // The blocks that hold the first waiter (a watched program's loading holds no job whose
        // workers are loaded).
        let loading = state
            .waiting
            .first()
            .is_some_and(|w| self.held_by_loading(&state, &w.ticket));
        let reasons: Vec<&str> = state
            .blocks
            .iter()
            .filter(|(b, _)| loading || matches!(b, super::Block::Teardown(_)))
            .map(|(_, why)| why.as_str())
            .collect();
        if !reasons.is_empty() {
            return Some(reasons.join("; "));
        }
        let labels: Vec<&str> = state
            .holding
            .iter()
            .map(|h| h.ticket.label.as_str())
            .collect();
        (!labels.is_empty()).then(|| labels.join(", "))
    }
}
