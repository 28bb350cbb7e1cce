//! On-demand services (vLLM, ComfyUI): each is an actor that owns its process. A start is a
//! request to the GPU queue — single flight however many callers ask — then room is made, the
//! process is spawned and health-polled. A healthy service holds its grant until it is stopped
//! (by hand, when idle, or to make room for the queue's head once unused for `busy_grace_s`):
//! `release_url` first, then signal → grace → kill of its group, then verified teardown.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use super::Core;
use crate::config::{Config, ServiceConfig};

mod actor;
mod events;
use actor::Actor;
use events::{Announcer, Joined};

/// Log lines kept to explain a failure.
const TAIL_LINES: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServiceState {
    Stopped,
    Queued,
    Starting,
    Healthy,
    Stopping,
    Failed,
}

/// What `GET /services` shows of one service.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ServiceStatus {
    pub name: String,
    pub state: ServiceState,
    pub pid: Option<u32>,
    pub vram_mib: Option<u64>,
    /// The GPU it runs on.
    pub device: u32,
    /// Peak memory measured for its processes while it ran.
    pub measured_vram_mib: Option<u64>,
    pub starts: u64,
    pub last_error: Option<String>,
    #[serde(skip)]
    pub since: Option<Instant>,
    #[serde(skip)]
    pub last_use: Option<Instant>,
    /// Lives ended (stopped or failed) so far: a stop waits for this to move, as the state
    /// itself may pass through `stopped` to `queued` (a start waiting) between two looks.
    #[serde(skip)]
    pub ended: u64,
}

enum Control {
    /// `ticket`: see [`Joined::ticket`].
    Start {
        ticket: u64,
    },
    Stop {
        reason: String,
    },
    Touch,
}

/// The rest of the host talks to a service through this handle.
#[derive(Clone)]
pub struct ServiceHandle {
    control: mpsc::Sender<Control>,
    status: watch::Receiver<ServiceStatus>,
    events: Announcer,
}

impl ServiceHandle {
    pub fn status(&self) -> ServiceStatus {
        self.status.borrow().clone()
    }

    /// Subscribes to the events of the current or next start, then asks for a start (a no-op
    /// when one is queued or starting already). Also says where a start already under way is
    /// now, for the caller to say first.
    pub(crate) fn start(&self) -> Joined {
        let joined = self.events.subscribe();
        let start = Control::Start {
            ticket: joined.ticket,
        };
        // Never lost, as a stop is not: a channel full of touches (the actor busy stopping)
        // would otherwise drop it and leave the caller waiting on events that never come.
        if let Err(mpsc::error::TrySendError::Full(start)) = self.control.try_send(start) {
            let control = self.control.clone();
            tokio::spawn(async move {
                let _ = control.send(start).await;
            });
        }
        joined
    }

    /// Asks for a stop. Never lost: when starts and touches have filled the channel while the
    /// actor was busy (making room, tearing down), the stop waits for room on its own task.
    pub fn stop(&self, reason: &str) {
        let stop = Control::Stop {
            reason: reason.to_string(),
        };
        if let Err(mpsc::error::TrySendError::Full(stop)) = self.control.try_send(stop) {
            let control = self.control.clone();
            tokio::spawn(async move {
                let _ = control.send(stop).await;
            });
        }
    }

    pub fn touch(&self) {
        let _ = self.control.try_send(Control::Touch);
    }

    /// Stops the service and waits until the life it is in (queued, starting, healthy or
    /// stopping) has ended; at once when none is.
    pub async fn stop_and_wait(&self, reason: &str) -> ServiceStatus {
        let before = self.status();
        self.stop(reason);
        if before.state == ServiceState::Stopped {
            return before;
        }
        // (A failed one is marked stopped by its actor: that ends it too.)
        self.wait_for(|s| s.ended > before.ended).await
    }

    /// Waits until the service reaches a state for which `pred` holds.
    pub async fn wait_for(&self, pred: impl Fn(&ServiceStatus) -> bool) -> ServiceStatus {
        let mut rx = self.status.clone();
        let reached = rx.wait_for(|s| pred(s)).await.map(|s| s.clone());
        reached.unwrap_or_else(|_| self.status.borrow().clone())
    }
}

pub struct Services {
    map: BTreeMap<String, (ServiceConfig, ServiceHandle)>,
}

impl Services {
    /// One actor per `[[services]]` entry, on the core of its device (`cores` holds one for
    /// every arbitrated device; `main` is `[gpu] device`'s).
    pub fn start(config: &Config, cores: &[Arc<Core>], main: &Arc<Core>) -> Services {
        let map = config
            .services
            .iter()
            .map(|spec| {
                let core = spec
                    .device
                    .and_then(|d| cores.iter().find(|c| c.device == d))
                    .unwrap_or(main);
                let mut spec = spec.clone();
                if let Some(device) = spec.device {
                    crate::config::pin_device(&mut spec.env, device);
                }
                let spec = &spec;
                let (control, rx) = mpsc::channel(64);
                let (status_tx, status) = watch::channel(ServiceStatus {
                    name: spec.name.clone(),
                    state: ServiceState::Stopped,
                    pid: None,
                    vram_mib: spec.vram_mib,
                    device: core.device,
                    measured_vram_mib: core.footprints.measured(&footprint_key(&spec.name)),
                    starts: 0,
                    last_error: None,
                    since: None,
                    last_use: None,
                    ended: 0,
                });
                let events = Announcer::new();
                let actor = Actor {
                    spec: spec.clone(),
                    cwd: spec
                        .cwd
                        .as_ref()
                        .map(|c| config.resolve(c))
                        .unwrap_or_else(|| config.base_dir.clone()),
                    core: Arc::clone(core),
                    rx,
                    status: status_tx,
                    events: events.clone(),
                    blocked: None,
                    tail: VecDeque::new(),
                };
                tokio::spawn(actor.run());
                (
                    spec.name.clone(),
                    (
                        spec.clone(),
                        ServiceHandle {
                            control,
                            status,
                            events,
                        },
                    ),
                )
            })
            .collect();
        Services { map }
    }

    pub fn get(&self, name: &str) -> Option<&ServiceHandle> {
        self.map.get(name).map(|(_, h)| h)
    }

    pub fn statuses(&self) -> Vec<ServiceStatus> {
        self.map.values().map(|(_, h)| h.status()).collect()
    }

    /// Stops services unused for their `idle_stop_after_s`.
    pub fn stop_idle(&self) {
        for (spec, handle) in self.map.values() {
            let s = handle.status();
            let idle = s.last_use.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
            if s.state == ServiceState::Healthy
                && spec.idle_stop_after_s > 0.0
                && idle >= spec.idle_stop_after_s
            {
                handle.stop(&format!("unused for {idle:.0} s (idle_stop_after_s)"));
            }
        }
    }

    /// A request waits at the head of `device`'s queue: a healthy service there unused for `busy_grace_s`
    /// stops to make room; one in use keeps the GPU and the request keeps waiting.
    pub fn yield_to(&self, device: u32, waiting: &str) {
        for (spec, handle) in self.map.values() {
            let s = handle.status();
            if s.device != device {
                continue;
            }
            let idle = s
                .last_use
                .map(|t| t.elapsed().as_secs_f64())
                .unwrap_or(f64::MAX);
            if s.state == ServiceState::Healthy && idle >= spec.busy_grace_s {
                handle.stop(&format!("making room for {waiting}"));
            }
        }
    }

    pub async fn stop_all(&self) {
        for (_, handle) in self.map.values() {
            handle.stop("gpuhost is shutting down");
        }
        for (_, handle) in self.map.values() {
            handle
                .wait_for(|s| matches!(s.state, ServiceState::Stopped | ServiceState::Failed))
                .await;
        }
    }
}

/// The footprint file's key for a service.
pub fn footprint_key(name: &str) -> String {
    format!("service {name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> ServiceStatus {
        ServiceStatus {
            name: "s".into(),
            state: ServiceState::Healthy,
            pid: None,
            vram_mib: None,
            device: 0,
            measured_vram_mib: None,
            starts: 0,
            last_error: None,
            since: None,
            last_use: None,
            ended: 0,
        }
    }

    #[tokio::test]
    async fn a_stop_is_not_lost_behind_a_full_channel() {
        let (control, mut rx) = mpsc::channel(2);
        let handle = ServiceHandle {
            control,
            status: watch::channel(healthy()).1,
            events: Announcer::new(),
        };
        // The actor is busy: touches fill its channel, then the stop comes.
        handle.touch();
        handle.touch();
        handle.touch(); // dropped: touches say nothing the first two did not
        handle.stop("shutting down");
        assert!(matches!(rx.recv().await, Some(Control::Touch)));
        assert!(matches!(rx.recv().await, Some(Control::Touch)));
        match rx.recv().await {
            Some(Control::Stop { reason }) => assert_eq!(reason, "shutting down"),
            _ => panic!("the stop was lost"),
        }
    }

    #[tokio::test]
    async fn a_stop_returns_when_a_waiting_start_follows_it_at_once() {
        let (control, mut rx) = mpsc::channel(8);
        let (status_tx, status) = watch::channel(healthy());
        let handle = ServiceHandle {
            control,
            status,
            events: Announcer::new(),
        };
        let stop = tokio::spawn(async move { handle.stop_and_wait("by request").await });
        assert!(matches!(rx.recv().await, Some(Control::Stop { .. })));
        // The actor stops the service, then takes the start that waited behind the stop,
        // before the caller looks again: it never sees `stopped`.
        status_tx.send_modify(|s| {
            s.state = ServiceState::Stopped;
            s.ended += 1;
        });
        status_tx.send_modify(|s| s.state = ServiceState::Queued);
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), stop)
            .await
            .expect("the stop waited for a state it had missed")
            .unwrap();
        assert_eq!(seen.ended, 1);
    }
}
