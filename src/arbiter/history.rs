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
    /// The highest device memory use sampled while it held the GPU.
    pub peak_mib: Option<u64>,
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

    /// A queue grant began (`id` is the queue's).
    pub fn granted(&self, id: u64, device: u32, kind: HolderKind, holder: &str, waited: Duration) {
        let record = GrantRecord {
            id,
            device,
            kind: kind.into(),
            holder: holder.to_string(),
            start: unix_now(),
            end: None,
            waited_s: (waited.as_secs_f64() * 1000.0).round() / 1000.0,
            peak_mib: None,
        };
        tracing::info!(target: "gpuhost::audit", grant = id, device, kind = ?record.kind, holder, waited_s = record.waited_s, "GPU granted");
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
            tracing::info!(target: "gpuhost::audit", grant = id, kind = ?r.kind, holder = %r.holder, held_s = end - r.start, peak_mib = ?r.peak_mib, "GPU released");
        }
    }

    /// Something the arbiter did that is not a queue grant (unload, reload): from now until
    /// `end_event` is called with the returned id.
    pub fn begin_event(&self, device: u32, kind: GrantKind, holder: &str) -> u64 {
        let mut rings = self.lock();
        let id = EVENT_IDS + rings.next_event_id;
        rings.next_event_id += 1;
        tracing::info!(target: "gpuhost::audit", event = id, device, kind = ?kind, holder, "GPU event");
        rings.grants.push_back(GrantRecord {
            id,
            device,
            kind,
            holder: holder.to_string(),
            start: unix_now(),
            end: None,
            waited_s: 0.0,
            peak_mib: None,
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
        for r in rings.grants.iter_mut().filter(|r| r.end.is_none()) {
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
                .retain(|r| r.end.map_or(true, |end| end >= oldest));
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
                .filter(|r| r.end.map_or(true, |end| end >= since))
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuInfo;

    fn snap(at: SystemTime, used: u64) -> Snapshot {
        Snapshot {
            taken_wall: Some(at),
            gpus: vec![GpuInfo {
                index: 0,
                uuid: String::new(),
                name: "fake".into(),
                utilization: 50,
                memory_used_mib: used,
                memory_total_mib: 32_000,
                memory_free_mib: 32_000 - used,
                temperature: 0,
                power_draw: 0.0,
            }],
            ..Snapshot::empty("test")
        }
    }

    #[test]
    fn grants_record_their_peak_and_old_samples_fall_out() {
        let h = History::new(Duration::from_secs(60));
        let now = SystemTime::now();
        h.sample(&snap(now - Duration::from_secs(120), 100), |_| 0);
        h.granted(
            1,
            0,
            HolderKind::Lease,
            "lease 1 (alice)",
            Duration::from_millis(1500),
        );
        h.sample(&snap(now - Duration::from_secs(1), 9000), |_| 2);
        h.sample(&snap(now - Duration::from_secs(1), 9999), |_| 2); // the same sample again
        h.sample(&snap(now, 4000), |_| 1);
        h.released(0, 1);
        let v = h.view(None);
        assert_eq!(v.samples.len(), 2, "the two-minute-old sample is gone");
        assert_eq!(v.samples[0].waiting, 2);
        let g = &v.grants[0];
        assert_eq!(
            (g.kind, g.peak_mib, g.waited_s),
            (GrantKind::Lease, Some(9000), 1.5)
        );
        assert!(g.end.is_some());
        let e = h.begin_event(0, GrantKind::Unload, "worker asr");
        assert!(e >= EVENT_IDS);
        assert!(h.view(None).grants[1].end.is_none());
        h.end_event(e);
        assert!(h.view(Some(unix_now() + 10.0)).grants.is_empty());
    }

    #[test]
    fn a_busy_host_keeps_the_newest_records_and_open_ones() {
        let h = History::new(Duration::from_secs(3600));
        h.granted(0, 0, HolderKind::Lease, "long lease", Duration::ZERO);
        let jobs = MAX_GRANT_RECORDS as u64 * 2;
        for id in 1..=jobs {
            h.granted(id, 0, HolderKind::Job, "job", Duration::ZERO);
            h.released(0, id);
        }
        let v = h.view(None);
        assert!(v.grants.len() <= MAX_GRANT_RECORDS + MAX_GRANT_RECORDS / 8);
        assert_eq!(v.grants[0].holder, "long lease", "open grants stay");
        assert_eq!(v.grants.last().map(|g| g.id), Some(jobs), "the newest stay");
    }
}
