//! On-demand services (vLLM, ComfyUI): each is an actor that owns its process. A start is a
//! request to the GPU queue — single flight however many callers ask — then room is made, the
//! process is spawned and health-polled. A healthy service holds its grant until it is stopped
//! (by hand, when idle, or to make room for the queue's head once unused for `busy_grace_s`):
//! `release_url` first, then signal → grace → kill of its group, then verified teardown.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{broadcast, mpsc, watch};

use super::queue::{GpuPermit, HolderKind, Ticket};
use super::teardown::Gone;
use super::Core;
use crate::config::{Config, ServiceConfig};
use crate::process::{describe_exit, spawn_service, ProcessGroup};
use crate::protocol::GrantEvent;
use crate::worker::lines::{next_line_opt as next_line, LineReader};

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
}

enum Control {
    Start,
    Stop { reason: String },
    Touch,
}

/// The rest of the host talks to a service through this handle.
#[derive(Clone)]
pub struct ServiceHandle {
    control: mpsc::Sender<Control>,
    status: watch::Receiver<ServiceStatus>,
    events: broadcast::Sender<GrantEvent>,
}

impl ServiceHandle {
    pub fn status(&self) -> ServiceStatus {
        self.status.borrow().clone()
    }

    /// Subscribes to the events of the current or next start, then asks for a start (a no-op
    /// when one is queued or starting already).
    pub fn start(&self) -> broadcast::Receiver<GrantEvent> {
        let events = self.events.subscribe();
        let _ = self.control.try_send(Control::Start);
        events
    }

    pub fn stop(&self, reason: &str) {
        let _ = self.control.try_send(Control::Stop {
            reason: reason.to_string(),
        });
    }

    pub fn touch(&self) {
        let _ = self.control.try_send(Control::Touch);
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
                });
                let (events, _) = broadcast::channel(256);
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

struct Actor {
    spec: ServiceConfig,
    cwd: std::path::PathBuf,
    core: Arc<Core>,
    rx: mpsc::Receiver<Control>,
    status: watch::Sender<ServiceStatus>,
    events: broadcast::Sender<GrantEvent>,
    tail: VecDeque<String>,
}

/// A running service process and what was known before it started.
struct Running {
    group: ProcessGroup,
    stdout: Option<LineReader<ChildStdout>>,
    stderr: Option<LineReader<ChildStderr>>,
    baseline_used_mib: Option<u64>,
    permit: GpuPermit,
}

impl Actor {
    async fn run(mut self) {
        while let Some(control) = self.rx.recv().await {
            if let Control::Start = control {
                self.serve_once().await;
            }
        }
    }

    fn emit(&self, event: GrantEvent) {
        let _ = self.events.send(event);
    }

    fn set(&self, state: ServiceState, also: impl FnOnce(&mut ServiceStatus)) {
        self.status.send_modify(|s| {
            s.state = state;
            s.since = Some(Instant::now());
            also(s);
        });
    }

    fn fail(&self, code: &str, message: String) {
        tracing::warn!(service = %self.spec.name, %message, "service failed");
        self.emit(GrantEvent::Error {
            code: code.into(),
            message: message.clone(),
        });
        self.set(ServiceState::Failed, |s| {
            s.pid = None;
            s.last_error = Some(message);
        });
    }

    /// One life: queued → starting → healthy → stopped (or failed at any step).
    async fn serve_once(&mut self) {
        self.set(ServiceState::Queued, |s| s.last_error = None);
        let Some(permit) = self.wait_for_grant().await else {
            return;
        };
        let events = self.events.clone();
        let notify = move |e: GrantEvent| {
            let _ = events.send(e);
        };
        if let Err(why) = self
            .core
            .make_room(
                self.core.footprints.need(
                    &footprint_key(&self.spec.name),
                    self.spec.vram_mib.unwrap_or(0),
                ),
                &notify,
            )
            .await
        {
            return self.fail("no_room", why);
        }
        let started = Instant::now();
        let baseline_used_mib = self.core.used_mib();
        let (group, stdout, stderr) =
            match spawn_service(&self.spec.command, &self.cwd, &self.spec.env) {
                Ok(spawned) => spawned,
                Err(e) => {
                    return self.fail(
                        "service_unavailable",
                        format!(
                            "cannot run {:?} in {}: {e}",
                            self.spec.command,
                            self.cwd.display()
                        ),
                    );
                }
            };
        let pid = group.pid();
        tracing::info!(service = %self.spec.name, pid, "service started");
        self.emit(GrantEvent::Starting { pid });
        self.set(ServiceState::Starting, |s| {
            s.pid = Some(pid);
            s.starts += 1;
        });
        let mut running = Running {
            group,
            stdout: Some(LineReader::new(stdout)),
            stderr: Some(LineReader::new(stderr)),
            baseline_used_mib,
            permit,
        };
        match self.until_healthy(&mut running, started).await {
            Ok(()) => {
                let seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
                tracing::info!(service = %self.spec.name, pid, seconds, "service healthy");
                self.emit(GrantEvent::Healthy {
                    pid: Some(pid),
                    seconds,
                });
                self.set(ServiceState::Healthy, |s| s.last_use = Some(Instant::now()));
                let reason = self.while_healthy(&mut running).await;
                self.stop(running, &reason, None).await;
            }
            Err((code, why)) => self.stop(running, &why, Some(code)).await,
        }
    }

    /// Waits in the queue, broadcasting the position; `None` when stopped meanwhile.
    async fn wait_for_grant(&mut self) -> Option<GpuPermit> {
        let ticket = Ticket {
            kind: HolderKind::Service,
            label: format!("service {}", self.spec.name),
            priority: 0,
            need_mib: self.core.footprints.need(
                &footprint_key(&self.spec.name),
                self.spec.vram_mib.unwrap_or(0),
            ),
        };
        let mut waiter = self.core.queue.try_enqueue(ticket, usize::MAX)?;
        let mut last = None;
        loop {
            let position = waiter.position();
            if position.is_some() && position != last {
                last = position;
                self.emit(GrantEvent::Queued {
                    position: position.unwrap_or(0),
                    waiting_for: self.core.queue.waiting_for(),
                });
            }
            tokio::select! {
                next = waiter.next() => if let Some(permit) = next { return Some(permit) },
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => {
                        self.emit(GrantEvent::Error { code: "stopped".into(), message: format!("stopped before it started: {reason}") });
                        self.set(ServiceState::Stopped, |_| {});
                        return None;
                    }
                    None => return None,
                    Some(_) => {}
                },
            }
        }
    }

    /// Polls the health URL until it answers 2xx; `Err` on exit, timeout or a stop.
    async fn until_healthy(
        &mut self,
        running: &mut Running,
        started: Instant,
    ) -> Result<(), (&'static str, String)> {
        let deadline = tokio::time::Instant::from_std(started)
            + Duration::from_secs_f64(self.spec.start_timeout_s);
        let interval = Duration::from_secs_f64(self.spec.poll_interval_s);
        let mut next_poll = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_poll) => {
                    next_poll += interval;
                    let healthy = self.core.http.get(&self.spec.health_url).timeout(interval.max(Duration::from_secs(2))).send().await
                        .is_ok_and(|r| r.status().is_success());
                    if healthy {
                        return Ok(());
                    }
                }
                status = running.group.wait() => {
                    let exit = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
                    return Err(("service_failed", format!("exited before it was healthy ({exit}); last lines:\n{}", self.tail_text())));
                }
                Some(line) = next_line(&mut running.stdout) => self.log(line, true),
                Some(line) = next_line(&mut running.stderr) => self.log(line, true),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(("service_timeout", format!(
                        "not healthy at {} within start_timeout_s = {:.0} s; stopped. Last lines:\n{}",
                        self.spec.health_url, self.spec.start_timeout_s, self.tail_text())));
                }
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => return Err(("stopped", format!("stopped while starting: {reason}"))),
                    None => return Err(("stopped", "gpuhost is shutting down".into())),
                    Some(_) => {}
                },
            }
        }
    }

    /// Serves until a stop or an exit; returns why it ends.
    async fn while_healthy(&mut self, running: &mut Running) -> String {
        loop {
            tokio::select! {
                status = running.group.wait() => {
                    let exit = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
                    let why = format!("the service exited ({exit})");
                    self.status.send_modify(|s| s.last_error = Some(format!("{why}; last lines:\n{}", self.tail_text())));
                    return why;
                }
                Some(line) = next_line(&mut running.stdout) => self.log(line, false),
                Some(line) = next_line(&mut running.stderr) => self.log(line, false),
                _ = tokio::time::sleep(Duration::from_secs(1)) => self.measure(running.group.pid()),
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => return reason,
                    Some(Control::Touch) | Some(Control::Start) => self.status.send_modify(|s| s.last_use = Some(Instant::now())),
                    None => return "gpuhost is shutting down".into(),
                },
            }
        }
    }

    /// Release call, signal → grace → kill, verified teardown, then the GPU goes on.
    async fn stop(&mut self, mut running: Running, reason: &str, failure: Option<&str>) {
        let pid = running.group.pid();
        tracing::info!(service = %self.spec.name, pid, %reason, "stopping service");
        self.set(ServiceState::Stopping, |_| {});
        if let Some(url) = &self.spec.release_url {
            let method = reqwest::Method::from_bytes(self.spec.release_method.as_bytes())
                .unwrap_or(reqwest::Method::POST);
            let body = self.spec.release_body.clone().unwrap_or_default();
            match self.core.http.request(method, url).body(body).send().await {
                Ok(r) => {
                    tracing::info!(service = %self.spec.name, status = r.status().as_u16(), "release call made")
                }
                Err(e) => {
                    tracing::warn!(service = %self.spec.name, error = %e, "release call failed")
                }
            }
        }
        let stopped_at = Instant::now();
        running.group.signal(self.spec.signal());
        if running
            .group
            .wait_timeout(Duration::from_secs_f64(self.spec.stop_grace_s))
            .await
            .is_none()
        {
            tracing::warn!(service = %self.spec.name, pid, "service ignored its stop signal; killing its group");
            running.group.kill().await;
        }
        let gone = Gone {
            what: format!("service {}", self.spec.name),
            pids: vec![pid],
            pgid: Some(pid),
            baseline_used_mib: running.baseline_used_mib,
            watch: None,
            after: stopped_at,
        };
        let verified = self.core.verify_teardown(&gone).await;
        let Running { permit, .. } = running;
        match verified {
            Ok(()) => {
                drop(permit);
                match failure {
                    Some(code) => self.fail(code, reason.to_string()),
                    None => self.set(ServiceState::Stopped, |s| s.pid = None),
                }
            }
            Err(why) => {
                self.core.block_until_freed(gone, why.clone());
                drop(permit);
                self.fail("teardown_failed", why);
            }
        }
    }

    fn log(&mut self, line: String, to_clients: bool) {
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.clone());
        tracing::debug!(service = %self.spec.name, "{line}");
        if to_clients {
            self.emit(GrantEvent::Log { line });
        }
    }

    fn tail_text(&self) -> String {
        if self.tail.is_empty() {
            return "(no output)".into();
        }
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Records the peak memory seen for the service's processes (kept across restarts).
    fn measure(&self, pgid: u32) {
        let key = footprint_key(&self.spec.name);
        let snap = self.core.snapshot();
        self.core
            .footprints
            .observe(&key, pgid, self.core.device, &snap);
        let measured = self.core.footprints.measured(&key);
        self.status.send_modify(|s| s.measured_vram_mib = measured);
    }
}

/// The footprint file's key for a service.
pub fn footprint_key(name: &str) -> String {
    format!("service {name}")
}
