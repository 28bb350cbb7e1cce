//! Who held the GPU: a ring buffer of per-device memory and utilization samples (with the queue
//! length at each) and of every grant — speech job, service, lease, unload, reload — with holder,
//! start, end, time waited and the peak memory seen while it held the GPU. `GET /gpu/history`
//! returns it and the dashboard draws it; every grant is also written as an audit log line.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::queue::HolderKind;
use crate::gpu::Snapshot;

/// One device in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceSample {
    pub index: u32,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub utilization: u32,
    /// Requests waiting for this GPU at that moment.
    pub waiting: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Unix time, seconds.
    pub t: f64,
    pub gpus: Vec<DeviceSample>,
    /// Requests waiting for any GPU at that moment.
    pub waiting: usize,
}

/// What a grant was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantKind {
    Job,
    Service,
    Lease,
    /// A resident worker unloaded to make room (or for idleness).
    Unload,
    /// A resident worker loaded again.
    Reload,
}

impl GrantKind {
    /// Its wire name (`job`), as `/gpu/history` says it and the audit log records it.
    pub fn as_str(self) -> &'static str {
        match self {
            GrantKind::Job => "job",
            GrantKind::Service => "service",
            GrantKind::Lease => "lease",
            GrantKind::Unload => "unload",
            GrantKind::Reload => "reload",
        }
    }
}

impl From<HolderKind> for GrantKind {
    fn from(kind: HolderKind) -> GrantKind {
        match kind {
            HolderKind::Job => GrantKind::Job,
            HolderKind::Service => GrantKind::Service,
            HolderKind::Lease => GrantKind::Lease,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GrantRecord {
    pub id: u64,
    /// The GPU it held.
    pub device: u32,
    pub kind: GrantKind,
    pub holder: String,
    /// Unix time, seconds.
    pub start: f64,
    /// `None` while it still holds the GPU.
    pub end: Option<f64>,
    /// Seconds it waited in the queue before the grant.
    pub waited_s: f64,
    /// The highest device memory use sampled while it held the GPU (none for a job on the CPU).
    pub peak_mib: Option<u64>,
    /// A speech job whose every stage runs on the CPU: it took a place among jobs, not the GPU.
    pub on_cpu: bool,
}

#[derive(Debug, Default)]
struct Rings {
    samples: VecDeque<Sample>,
    grants: VecDeque<GrantRecord>,
    next_event_id: u64,
}

#[derive(Debug)]
pub struct History {
    /// How far back it keeps.
    span: Duration,
    /// std Mutex: pushes and copies only, never held across `.await`.
    rings: Mutex<Rings>,
}

/// What `GET /gpu/history` returns.
#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub span_s: f64,
    pub now: f64,
    pub samples: Vec<Sample>,
    pub grants: Vec<GrantRecord>,
}

pub fn unix_now() -> f64 {
    unix(SystemTime::now())
}

fn unix(t: SystemTime) -> f64 {
    let s = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    (s * 1000.0).round() / 1000.0
}

/// The most grant records kept, whatever the span (the oldest finished ones go first).
const MAX_GRANT_RECORDS: usize = 10_000;

/// Longest holder label a record keeps, in characters: a lease's holder and purpose may be 8 KiB
/// each, and 10 000 records of that made `/gpu/history` hundreds of MB.
const LABEL_MAX: usize = 200;

/// `holder`, cut to `LABEL_MAX` characters with an ellipsis.
fn label(holder: &str) -> String {
    match holder.char_indices().nth(LABEL_MAX) {
        Some((at, _)) => format!("{}…", &holder[..at]),
        None => holder.to_string(),
    }
}

/// Grant records that are not queue grants get ids from here up (queue ids stay below).
const EVENT_IDS: u64 = 1 << 48;

impl History {
    pub fn new(span: Duration) -> History {
        History {
            span,
            rings: Mutex::new(Rings::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A queue grant began (`id` is the queue's; `on_cpu`: a job that takes no GPU).
    pub fn granted(
        &self,
        id: u64,
        device: u32,
        kind: HolderKind,
        holder: &str,
        waited: Duration,
        on_cpu: bool,
    ) {
        let record = GrantRecord {
            id,
            device,
            kind: kind.into(),
            holder: label(holder),
            start: unix_now(),
            end: None,
            waited_s: (waited.as_secs_f64() * 1000.0).round() / 1000.0,
            peak_mib: None,
            on_cpu,
        };
        let what = if on_cpu {
            "job place granted (the job runs on the CPU)"
        } else {
            "GPU granted"
        };
        tracing::info!(target: "gpuhost::audit", grant = id, device, kind = record.kind.as_str(), holder, waited_s = record.waited_s, on_cpu, "{what}");
        let mut rings = self.lock();
        rings.grants.push_back(record);
        self.trim(&mut rings);
    }

    /// A queue grant ended.
    pub fn released(&self, device: u32, id: u64) {
        let mut rings = self.lock();
        if let Some(r) = rings
            .grants
            .iter_mut()
            .rev()
            .find(|r| r.id == id && r.device == device)
        {
            let end = unix_now();
            r.end = Some(end);
            let what = if r.on_cpu {
                "job place released"
            } else {
                "GPU released"
            };
            tracing::info!(target: "gpuhost::audit", grant = id, kind = r.kind.as_str(), holder = %r.holder, held_s = end - r.start, peak_mib = r.peak_mib, "{what}");
        }
    }

    /// Something the arbiter did that is not a queue grant (unload, reload): from now until
    /// `end_event` is called with the returned id.
    pub fn begin_event(&self, device: u32, kind: GrantKind, holder: &str) -> u64 {
        let mut rings = self.lock();
        let id = EVENT_IDS + rings.next_event_id;
        rings.next_event_id += 1;
        tracing::info!(target: "gpuhost::audit", event = id, device, kind = kind.as_str(), holder, "GPU event");
        rings.grants.push_back(GrantRecord {
            id,
            device,
            kind,
            holder: label(holder),
            start: unix_now(),
            end: None,
            waited_s: 0.0,
            peak_mib: None,
            on_cpu: false,
        });
        self.trim(&mut rings);
        id
    }

    pub fn end_event(&self, id: u64) {
        let device = self
            .lock()
            .grants
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.device);
        if let Some(device) = device {
            self.released(device, id);
        }
    }

    /// Adds a sample of `snap` (once per new sample) and raises the peaks of open grants;
    /// `waiting` tells how many wait for each device.
    pub fn sample(&self, snap: &Snapshot, waiting: impl Fn(u32) -> usize) {
        let Some(taken) = snap.taken_wall else { return };
        let t = unix(taken);
        let gpus: Vec<DeviceSample> = snap
            .gpus
            .iter()
            .map(|g| DeviceSample {
                index: g.index,
                memory_used_mib: g.memory_used_mib,
                memory_total_mib: g.memory_total_mib,
                utilization: g.utilization,
                waiting: waiting(g.index),
            })
            .collect();
        let total_waiting = gpus.iter().map(|g| g.waiting).sum();
        let mut rings = self.lock();
        if rings.samples.back().is_some_and(|s| s.t >= t) {
            return;
        }
        for r in rings
            .grants
            .iter_mut()
            .filter(|r| r.end.is_none() && !r.on_cpu)
        {
            if let Some(g) = gpus.iter().find(|g| g.index == r.device) {
                r.peak_mib = Some(r.peak_mib.unwrap_or(0).max(g.memory_used_mib));
            }
        }
        rings.samples.push_back(Sample {
            t,
            gpus,
            waiting: total_waiting,
        });
        self.trim(&mut rings);
    }

    /// Drops what is older than the span (open grants stay, however old).
    fn trim(&self, rings: &mut Rings) {
        let oldest = unix_now() - self.span.as_secs_f64();
        while rings.samples.front().is_some_and(|s| s.t < oldest) {
            rings.samples.pop_front();
        }
        // Records are in start order: when the first began inside the span, none ended before it.
        if rings.grants.front().is_some_and(|r| r.start < oldest) {
            rings
                .grants
                .retain(|r| r.end.is_none_or(|end| end >= oldest));
        }
        // A busy host (many short jobs) keeps the newest records only; cut in batches, so that
        // a full ring does not cost a pass per grant.
        if rings.grants.len() > MAX_GRANT_RECORDS + MAX_GRANT_RECORDS / 8 {
            let mut excess = rings.grants.len() - MAX_GRANT_RECORDS;
            rings.grants.retain(|r| {
                let drop = excess > 0 && r.end.is_some();
                excess -= usize::from(drop);
                !drop
            });
        }
    }

    /// Everything since `since` (unix seconds; everything kept when `None`).
    pub fn view(&self, since: Option<f64>) -> HistoryView {
        let mut rings = self.lock();
        self.trim(&mut rings);
        let since = since.unwrap_or(f64::MIN);
        HistoryView {
            span_s: self.span.as_secs_f64(),
            now: unix_now(),
            samples: rings
                .samples
                .iter()
                .filter(|s| s.t >= since)
                .cloned()
                .collect(),
            grants: rings
                .grants
                .iter()
                .filter(|r| r.end.is_none_or(|end| end >= since))
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
