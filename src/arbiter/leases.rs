//! Leases: the GPU for any outside program (a notebook, a training run), granted through the same
//! queue as everything else, kept alive by renewals, and reclaimed when the TTL passes without one
//! (a holder that died without releasing cannot hold the GPU forever).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::queue::{GpuPermit, HolderKind, Ticket, Turn};
use super::teardown::Gone;
use super::Core;
use crate::protocol::GrantEvent;

mod request;
pub use request::{DeviceChoice, LeaseRequest};

/// Why a lease that does not wait is refused (`unloaded`: after idle residents were unloaded
/// for it, which did not make it fit: their memory did not come back, or a waiter before it
/// took the room).
fn taken(waiting_for: Option<String>, unloaded: bool) -> String {
    let holders = waiting_for.unwrap_or_else(|| "others waiting".into());
    let after = if unloaded {
        ", and the idle residents unloaded for it did not make room (their memory is not back, \
         or a request of higher priority came first; see /status)"
    } else {
        ""
    };
    format!("the GPU is taken ({holders}){after}; send \"wait\": true to queue for it")
}

/// A lease as `GET /gpu/leases` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LeaseView {
    pub id: u64,
    /// The GPU it holds.
    pub device: u32,
    pub holder: String,
    pub purpose: String,
    pub vram_mib: Option<u64>,
    pub ttl_s: f64,
    pub age_s: f64,
    pub expires_in_s: f64,
}

/// The header of a lease's release (`DELETE /gpu/lease/{id}`) that says how many milliseconds
/// ago the program under it exited: only a sample taken after that may show its memory back.
pub const PROGRAM_ENDED: &str = "gpuhost-program-ended-ms-ago";

struct Lease {
    view: LeaseView,
    ttl: Duration,
    granted: Instant,
    expires: Instant,
    /// Held until the lease ends and its memory is back (see [`Lease::end`]).
    permit: GpuPermit,
    core: Arc<Core>,
    /// Used memory of the device when it was granted, and (`share = "vram"`) the processes on it.
    baseline_used_mib: Option<u64>,
    listed_before: Option<Vec<u32>>,
}

impl Lease {
    /// Hands the GPU on once the lease's memory is back, as for every holder: its program is
    /// not gpuhost's to stop, so only the memory is checked; when it never comes back the
    /// queue is blocked until it does (a program that outlives its lease holds the memory the
    /// next holder was promised).
    fn end(self, program_ended: Option<Instant>) {
        let gone = Gone {
            what: match self.view.purpose.as_str() {
                "" => format!("the lease of {}", self.view.holder),
                purpose => format!("the lease of {} ({purpose})", self.view.holder),
            },
            pids: Vec::new(),
            pgid: None,
            baseline_used_mib: self.baseline_used_mib,
            listed_before: self.listed_before,
            watch: None,
            // Told when the program ended (`gpuhost lease` says), only a sample after that
            // shows its memory back: one before may predate memory it took, or handed to a
            // server, in its last moments. Not told, any sample since the grant does: mostly
            // the program ended before its lease, and the next holder need not wait.
            after: program_ended.unwrap_or(self.granted),
        };
        let (core, permit) = (self.core, self.permit);
        if core.seen_gone(&gone) {
            return drop(permit);
        }
        permit.ended();
        tokio::spawn(async move {
            if let Err(why) = core.verify_teardown(&gone).await {
                drop(core.block_until_freed(gone, why));
            }
            drop(permit);
        });
    }
}

pub struct Leases {
    /// One per arbitrated GPU; `main` is `[gpu] device`'s.
    cores: Vec<Arc<Core>>,
    main: usize,
    /// std Mutex: short critical sections, never across `.await`.
    table: Mutex<BTreeMap<u64, Lease>>,
    next: AtomicU64,
}

/// The first lease id of this run: the start time in milliseconds. Leases live in memory, so
/// ids counted from 1 again after a restart let a client of the old run renew (and release) a
/// new holder's lease as its own; these stay apart while the clock does not go back, and below
/// 2^53, so JavaScript clients read them exactly.
fn first_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
        .clamp(1, 1 << 52)
}

impl Leases {
    pub fn new(cores: Vec<Arc<Core>>, main: usize) -> Leases {
        Leases {
            cores,
            main,
            table: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(first_id()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Lease>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the GPU (reporting on `events`), makes room, and records the lease; the last
    /// event is `granted` or `error`. Dropping the future (the client left) leaves the queue.
    /// `wait = false` fails at once when the GPU is not free; a waiting lease takes a place in
    /// the queue only while fewer than `max_waiting` wait (checked under the queue's lock).
    pub async fn acquire(
        &self,
        request: LeaseRequest,
        device: u32,
        ttl: Duration,
        max_waiting: usize,
        events: mpsc::Sender<GrantEvent>,
    ) {
        let core = Arc::clone(self.core(device));
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let label = if request.purpose.is_empty() {
            format!("lease {id} ({})", request.holder)
        } else {
            format!("lease {id} ({}: {})", request.holder, request.purpose)
        };
        let ticket = Ticket {
            kind: HolderKind::Lease,
            label: label.clone(),
            priority: request.priority,
            need_mib: request.vram_mib,
            on_cpu: false,
        };
        // More than the whole GPU can never fit: refused before anything is unloaded for it.
        if let Some(total) = core.total_mib().filter(|&t| request.vram_mib > Some(t)) {
            let asked = request.vram_mib.unwrap_or(0);
            let why = format!(
                "the lease asks for {asked} MiB, more than GPU {device} has in all ({total} MiB)"
            );
            return refuse(&events, "no_room", why).await;
        }
        let max_waiting = if request.wait {
            max_waiting
        } else {
            usize::MAX
        };
        let Some(mut waiter) = core.queue.try_enqueue(ticket, max_waiting) else {
            let why = format!(
                "{} for this GPU (limits.max_queue); try again later",
                super::queue::already_waiting(max_waiting)
            );
            return refuse(&events, "queue_full", why).await;
        };
        // `share = "vram"`: a lease that does not wait for other holders still waits while idle
        // residents are unloaded for it and their memory is seen back (what `make_room` does for
        // a lease granted alone).
        let mut unloading = false;
        let permit = loop {
            tokio::select! {
                turn = waiter.next() => match turn {
                    Turn::Granted(permit) => break permit,
                    Turn::Waiting { waiting_for, .. } if !request.wait => {
                        if waiter.first_for_the_gpu() && core.unload_for_head() {
                            unloading = true;
                            continue;
                        }
                        let why = taken(waiting_for, unloading);
                        return refuse(&events, "gpu_busy", why).await;
                    }
                    // Not waited for: a client that does not read must not keep its turn
                    // from coming.
                    Turn::Waiting { position, waiting_for } => {
                        let _ = events.try_send(GrantEvent::Queued {
                            position,
                            waiting_for,
                        });
                    }
                    Turn::Closed => {
                        let why = "gpuhost is shutting down; no lease was granted".to_string();
                        return refuse(&events, "shutting_down", why).await;
                    }
                },
                // The unload ends with a redispatch, which grants it or not.
                _ = tokio::time::sleep(Duration::from_millis(100)), if unloading => {
                    if waiter.first_for_the_gpu() && core.unload_for_head() {
                        continue;
                    }
                    match tokio::time::timeout(Duration::ZERO, waiter.next()).await {
                        Ok(Turn::Granted(permit)) => break permit,
                        _ => {
                            let why = taken(core.queue.waiting_for(), true);
                            return refuse(&events, "gpu_busy", why).await;
                        }
                    }
                }
                _ = events.closed() => return,
            }
        };
        let progress = events.clone();
        let notify = move |e: GrantEvent| {
            let _ = progress.try_send(e);
        };
        if let Err(why) = core.make_room(request.vram_mib, &notify).await {
            drop(permit); // the GPU goes to the next before the client is told
            return refuse(&events, "no_room", why).await;
        }
        if events.is_closed() {
            return; // the client left while room was made: no lease for nobody
        }
        let now = Instant::now();
        let baseline_used_mib = core.used_mib();
        let listed_before = core.listed_before();
        let view = LeaseView {
            id,
            device: core.device,
            holder: request.holder,
            purpose: request.purpose,
            vram_mib: request.vram_mib,
            ttl_s: ttl.as_secs_f64(),
            age_s: 0.0,
            expires_in_s: ttl.as_secs_f64(),
        };
        tracing::info!(lease = id, holder = %view.holder, purpose = %view.purpose, "GPU leased");
        self.lock().insert(
            id,
            Lease {
                view,
                ttl,
                granted: now,
                expires: now + ttl,
                permit,
                core: Arc::clone(&core),
                baseline_used_mib,
                listed_before,
            },
        );
        let granted = GrantEvent::Granted {
            lease_id: id,
            ttl_s: ttl.as_secs_f64(),
        };
        if events.send(granted).await.is_err() {
            // The client left before it heard of its lease: nobody would release it.
            tracing::info!(lease = id, "the lease's client left before the grant");
            self.release(id, None);
        }
    }

    /// Extends the lease by its TTL; `None` when it does not exist (released or expired).
    pub fn renew(&self, id: u64) -> Option<LeaseView> {
        let mut table = self.lock();
        let lease = table.get_mut(&id)?;
        lease.expires = Instant::now() + lease.ttl;
        Some(view(lease))
    }

    /// Ends the lease: the GPU goes to the next waiter. `false` when it did not exist.
    /// Ends lease `id`; `program_ended`: when the program under it exited, when the client
    /// says (`gpuhost lease` does): only a sample taken after that may show its memory back.
    pub fn release(&self, id: u64, program_ended: Option<Instant>) -> bool {
        let removed = self.lock().remove(&id);
        let Some(lease) = removed else {
            return false;
        };
        tracing::info!(lease = id, holder = %lease.view.holder, held_s = lease.granted.elapsed().as_secs_f64(), "lease released");
        lease.end(program_ended);
        true
    }

    /// Reclaims every lease whose TTL passed without a renewal.
    pub fn expire(&self) {
        let now = Instant::now();
        let expired: Vec<Lease> = {
            let mut table = self.lock();
            let ids: Vec<u64> = table
                .iter()
                .filter(|(_, l)| l.expires <= now)
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| table.remove(id)).collect()
        };
        for lease in expired {
            tracing::warn!(lease = lease.view.id, holder = %lease.view.holder, "lease expired without a renewal; GPU reclaimed");
            lease.end(None);
        }
    }

    pub fn list(&self) -> Vec<LeaseView> {
        self.lock().values().map(view).collect()
    }
}

fn view(lease: &Lease) -> LeaseView {
    let round = |d: f64| (d * 1000.0).round() / 1000.0;
    LeaseView {
        age_s: round(lease.granted.elapsed().as_secs_f64()),
        expires_in_s: round(
            lease
                .expires
                .saturating_duration_since(Instant::now())
                .as_secs_f64(),
        ),
        ..lease.view.clone()
    }
}

/// A lease's last event when it is not granted: `code` and a message saying why.
async fn refuse(events: &mpsc::Sender<GrantEvent>, code: &str, message: String) {
    let code = code.to_string();
    let _ = events.send(GrantEvent::Error { code, message }).await;
}
