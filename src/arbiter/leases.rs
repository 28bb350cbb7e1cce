//! Leases: the GPU for any outside program (a notebook, a training run), granted through the same
//! queue as everything else, kept alive by renewals, and reclaimed when the TTL passes without one
//! (a holder that died without releasing cannot hold the GPU forever).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::queue::{GpuPermit, HolderKind, Ticket};
use super::Core;
use crate::protocol::GrantEvent;

/// `POST /gpu/lease`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who holds it (a user, a host, a program).
    pub holder: String,
    #[serde(default)]
    pub purpose: String,
    /// Memory the holder needs; room is made for it. Unknown: every idle worker is unloaded.
    #[serde(default)]
    pub vram_mib: Option<u64>,
    /// Seconds without a renewal after which the lease is reclaimed.
    #[serde(default)]
    pub ttl_s: Option<f64>,
    /// Wait in the queue (NDJSON progress) instead of failing when the GPU is taken.
    #[serde(default)]
    pub wait: bool,
    /// Higher goes first among waiters; nothing running is interrupted.
    #[serde(default)]
    pub priority: i32,
    /// A GPU index, or `"any"` (the one with the most free memory that fits); default: the
    /// server's `[gpu] device`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub device: Option<DeviceChoice>,
}

/// `device` in a lease request: an index or the word `any`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum DeviceChoice {
    Index(u32),
    Any(String),
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

struct Lease {
    view: LeaseView,
    ttl: Duration,
    granted: Instant,
    expires: Instant,
    /// Held until the lease ends: dropping it hands the GPU on.
    _permit: GpuPermit,
}

pub struct Leases {
    /// One per arbitrated GPU; `main` is `[gpu] device`'s.
    cores: Vec<Arc<Core>>,
    main: usize,
    /// std Mutex: short critical sections, never across `.await`.
    table: Mutex<BTreeMap<u64, Lease>>,
    next: AtomicU64,
}

impl Leases {
    pub fn new(cores: Vec<Arc<Core>>, main: usize) -> Leases {
        Leases {
            cores,
            main,
            table: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Lease>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The TTL a request gets: its own (bounded), else the default.
    pub fn ttl(&self, request: &LeaseRequest) -> Result<Duration, String> {
        let config = &self.cores[self.main].config;
        let ttl = request.ttl_s.unwrap_or(config.lease_ttl_s);
        if !(ttl.is_finite() && ttl > 0.0 && ttl <= config.max_lease_ttl_s) {
            return Err(format!(
                "ttl_s must be above 0 and at most {} (arbiter.max_lease_ttl_s)",
                config.max_lease_ttl_s
            ));
        }
        Ok(Duration::from_secs_f64(ttl))
    }

    /// The device a request gets: the one it names, else `[gpu] device`; with `"any"`, the
    /// device with the most free memory among those nobody holds or waits for (else among all).
    pub fn device_for(&self, request: &LeaseRequest) -> Result<u32, String> {
        let known = || {
            self.cores
                .iter()
                .map(|c| c.device.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &request.device {
            None => Ok(self.cores[self.main].device),
            Some(DeviceChoice::Index(d)) => self
                .cores
                .iter()
                .find(|c| c.device == *d)
                .map(|c| c.device)
                .ok_or_else(|| {
                    format!(
                        "GPU {d} is not arbitrated here; devices: {} ([gpu] devices)",
                        known()
                    )
                }),
            Some(DeviceChoice::Any(word)) if word == "any" => {
                let free = |c: &Arc<Core>| c.free_mib().unwrap_or(0);
                let quiet: Vec<&Arc<Core>> = self
                    .cores
                    .iter()
                    .filter(|c| c.queue.running() == 0 && c.queue.waiting() == 0)
                    .collect();
                let pool: Vec<&Arc<Core>> = if quiet.is_empty() {
                    self.cores.iter().collect()
                } else {
                    quiet
                };
                let fits: Vec<&&Arc<Core>> = pool
                    .iter()
                    .filter(|c| request.vram_mib.map_or(true, |need| free(c) >= need))
                    .collect();
                let best = if fits.is_empty() {
                    pool.iter().max_by_key(|c| free(c))
                } else {
                    fits.into_iter().max_by_key(|c| free(c))
                };
                Ok(best.map_or(self.cores[self.main].device, |c| c.device))
            }
            Some(DeviceChoice::Any(other)) => Err(format!(
                "device must be a GPU index or \"any\", not {other:?}; devices: {}",
                known()
            )),
        }
    }

    /// Waits for the GPU (reporting on `events`), makes room, and records the lease; the last
    /// event is `granted` or `error`. Dropping the future (the client left) leaves the queue.
    /// `wait = false` fails at once when the GPU is not free.
    pub async fn acquire(
        &self,
        request: LeaseRequest,
        device: u32,
        ttl: Duration,
        events: mpsc::Sender<GrantEvent>,
    ) {
        let core = Arc::clone(
            self.cores
                .iter()
                .find(|c| c.device == device)
                .unwrap_or(&self.cores[self.main]),
        );
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
        };
        let Some(mut waiter) = core.queue.try_enqueue(ticket, usize::MAX) else {
            return;
        };
        let mut last = None;
        let permit = loop {
            let position = waiter.position();
            if let Some(position) = position {
                if !request.wait {
                    let holders = core
                        .queue
                        .waiting_for()
                        .unwrap_or_else(|| "others waiting".into());
                    let _ = events
                        .send(GrantEvent::Error {
                            code: "gpu_busy".into(),
                            message: format!(
                                "the GPU is taken ({holders}); send \"wait\": true to queue for it"
                            ),
                        })
                        .await;
                    return;
                }
                if last != Some(position) {
                    last = Some(position);
                    let waiting_for = core.queue.waiting_for();
                    let _ = events
                        .send(GrantEvent::Queued {
                            position,
                            waiting_for,
                        })
                        .await;
                }
            }
            tokio::select! {
                next = waiter.next() => if let Some(permit) = next { break permit },
                _ = events.closed() => return,
            }
        };
        let progress = events.clone();
        let notify = move |e: GrantEvent| {
            let _ = progress.try_send(e);
        };
        if let Err(why) = core.make_room(request.vram_mib, &notify).await {
            let _ = events
                .send(GrantEvent::Error {
                    code: "no_room".into(),
                    message: why,
                })
                .await;
            return; // the permit drops: the GPU goes to the next
        }
        let now = Instant::now();
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
                _permit: permit,
            },
        );
        let _ = events
            .send(GrantEvent::Granted {
                lease_id: id,
                ttl_s: ttl.as_secs_f64(),
            })
            .await;
    }

    /// Extends the lease by its TTL; `None` when it does not exist (released or expired).
    pub fn renew(&self, id: u64) -> Option<LeaseView> {
        let mut table = self.lock();
        let lease = table.get_mut(&id)?;
        lease.expires = Instant::now() + lease.ttl;
        Some(view(lease))
    }

    /// Ends the lease: the GPU goes to the next waiter. `false` when it did not exist.
    pub fn release(&self, id: u64) -> bool {
        let removed = self.lock().remove(&id);
        if let Some(lease) = &removed {
            tracing::info!(lease = id, holder = %lease.view.holder, held_s = lease.granted.elapsed().as_secs_f64(), "lease released");
        }
        removed.is_some()
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
