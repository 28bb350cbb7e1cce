//! The actor that owns one on-demand service's process: waits for a GPU grant, spawns and
//! health-polls the service, holds the grant while it is healthy, and tears it down.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{mpsc, oneshot, watch};

use super::{footprint_key, Announcer, Control, ServiceState, ServiceStatus, TAIL_LINES};
use crate::arbiter::queue::{GpuPermit, HolderKind, Ticket, Turn};
use crate::arbiter::Core;
use crate::config::ServiceConfig;
use crate::process::{describe_exit, spawn_service, ProcessGroup};
use crate::protocol::GrantEvent;
use crate::worker::lines::{next_line_opt as next_line, LineReader};

mod checks;
mod stop;

pub(super) struct Actor {
    pub(super) spec: ServiceConfig,
    pub(super) cwd: std::path::PathBuf,
    pub(super) core: Arc<Core>,
    pub(super) rx: mpsc::Receiver<Control>,
    pub(super) status: watch::Sender<ServiceStatus>,
    pub(super) events: Announcer,
    pub(super) tail: VecDeque<String>,
    /// The queue blocked on memory this service's last stop (one asked for) left, and since
    /// when: told when it comes back, while nothing started since.
    pub(super) blocked: Option<(oneshot::Receiver<Instant>, Instant)>,
}

/// A running service process and what was known before it started.
struct Running {
    group: ProcessGroup,
    stdout: Option<LineReader<ChildStdout>>,
    stderr: Option<LineReader<ChildStderr>>,
    baseline_used_mib: Option<u64>,
    /// See [`crate::arbiter::teardown::Gone::listed_before`].
    listed_before: Option<Vec<u32>>,
    permit: GpuPermit,
}

impl Actor {
    pub(super) async fn run(mut self) {
        loop {
            let control = tokio::select! {
                control = self.rx.recv() => match control {
                    Some(control) => control,
                    None => return,
                },
                Some((failed, back)) = Self::freed(&mut self.blocked) => {
                    self.memory_back(failed, back);
                    continue;
                }
            };
            match control {
                // A caller that joined a start which has ended since (failed) has its answer.
                Control::Start { ticket } if !self.events.answered(ticket) => {
                    self.serve_once().await
                }
                // A stop asked of a service that failed and runs no more: stopped, as asked
                // (it stayed `failed`, and `gpuhost stop` said the stop had failed); its
                // `last_error` stays.
                Control::Stop { .. } if self.status.borrow().state == ServiceState::Failed => {
                    self.set(ServiceState::Stopped, |_| {})
                }
                _ => {}
            }
        }
    }

    /// Waits for a blocked teardown's memory to come back (forever without one); `None` when
    /// the block's watcher ended without (gpuhost stops).
    async fn freed(
        blocked: &mut Option<(oneshot::Receiver<Instant>, Instant)>,
    ) -> Option<(Instant, Instant)> {
        let Some((heard, failed)) = blocked else {
            return std::future::pending().await;
        };
        let back = heard.await.ok().map(|back| (*failed, back));
        *blocked = None;
        back
    }

    /// The code a stop before `healthy` gives the start's callers: `shutting_down` once the
    /// queue is closed (gpuhost stops), else `stopped`.
    fn stop_code(&self) -> &'static str {
        if self.core.queue.is_closed() {
            "shutting_down"
        } else {
            "stopped"
        }
    }

    fn emit(&self, event: GrantEvent) {
        self.events.send(event);
    }

    fn set(&self, state: ServiceState, also: impl FnOnce(&mut ServiceStatus)) {
        self.status.send_modify(|s| {
            s.state = state;
            s.since = Some(Instant::now());
            if matches!(state, ServiceState::Stopped | ServiceState::Failed) {
                s.ended += 1;
            }
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
        // A new life: whatever the last one left is no longer this service's state to mend.
        self.blocked = None;
        self.set(ServiceState::Queued, |s| s.last_error = None);
        // "Last lines" of this life only: an earlier start's lines are no explanation of it.
        self.tail.clear();
        // Found before the queue: making room unloads the resident workers, for nothing when
        // the program cannot run.
        if let Err(why) = self.runnable() {
            return self.fail("service_unavailable", why);
        }
        let Some(permit) = self.wait_for_grant().await else {
            return;
        };
        if self.already_served().await {
            // A copy started by hand (vLLM still on its port): it answered the health polls, a
            // second copy was started beside it and died on the port, and both were called
            // healthy; the one that lives holds GPU memory gpuhost does not know of.
            return self.fail(
                "service_failed",
                format!(
                    "something already answers {} before gpuhost started {}: a copy started \
                     outside gpuhost? Stop it; gpuhost starts a service only where nothing \
                     serves yet",
                    self.spec.health_url, self.spec.name
                ),
            );
        }
        let events = self.events.clone();
        let notify = move |e: GrantEvent| events.send(e);
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
        let listed_before = self.core.listed_before();
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
        self.core.service_pids.started(pid, &self.spec.name);
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
            listed_before,
            permit,
        };
        match self.until_healthy(&mut running, started).await {
            Ok(()) => {
                let seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
                tracing::info!(service = %self.spec.name, pid, seconds, "service healthy");
                // Healthy in the status before the event: a caller who joins between the two
                // reads it healthy and is answered at once. The other way round, one who joined
                // after the event read `starting` and waited for an event that never came.
                self.set(ServiceState::Healthy, |s| s.last_use = Some(Instant::now()));
                self.emit(GrantEvent::Healthy {
                    pid: Some(pid),
                    seconds,
                });
                let (reason, exited) = self.while_healthy(&mut running).await;
                // Ending by itself while healthy is a failure (a crash, an OOM), not a stop.
                let failure = exited.then_some("service_failed");
                self.stop(running, &reason, failure).await;
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
            on_cpu: false,
        };
        let mut waiter = self.core.queue.try_enqueue(ticket, usize::MAX)?;
        // Like a job or a lease, a start whose callers have all gone (a Ctrl-C, a client's
        // timeout) leaves the queue: it would otherwise start the service for nobody, later.
        let mut look = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = look.tick() => if self.events.end_if_unheard(GrantEvent::Error {
                    code: "stopped".into(),
                    message: "every caller left before the GPU was granted; not started".into(),
                }) {
                    tracing::info!(service = %self.spec.name, "every caller of the start left while it waited for the GPU: not started");
                    self.set(ServiceState::Stopped, |_| {});
                    return None;
                },
                turn = waiter.next() => match turn {
                    Turn::Granted(permit) => return Some(permit),
                    Turn::Waiting { position, waiting_for } => self.emit(GrantEvent::Queued {
                        position,
                        waiting_for,
                    }),
                    Turn::Closed => {
                        self.emit(GrantEvent::Error {
                            code: "shutting_down".into(),
                            message: "gpuhost is shutting down; the service was not started".into(),
                        });
                        self.set(ServiceState::Stopped, |_| {});
                        return None;
                    }
                },
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => {
                        self.emit(GrantEvent::Error { code: self.stop_code().into(), message: format!("stopped before it started: {reason}") });
                        self.set(ServiceState::Stopped, |_| {});
                        return None;
                    }
                    None => return None,
                    Some(_) => {}
                },
            }
        }
    }

    /// Serves until a stop or an exit; returns why it ends, and whether the service ended by
    /// itself.
    async fn while_healthy(&mut self, running: &mut Running) -> (String, bool) {
        // Its own clock: log lines and touches (many a second) must not postpone the measure.
        let mut measure = tokio::time::interval(Duration::from_secs(1));
        measure.tick().await;
        loop {
            tokio::select! {
                status = running.group.wait() => {
                    let exit = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
                    self.drain(running, false).await;
                    let why = format!("the service exited by itself while healthy ({exit}); last lines:\n{}", self.tail_text());
                    self.status.send_modify(|s| s.last_error = Some(why.clone()));
                    return (why, true);
                }
                Some(line) = next_line(&mut running.stdout) => self.log(line, false),
                Some(line) = next_line(&mut running.stderr) => self.log(line, false),
                _ = measure.tick() => self.measure(running.group.pid()),
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => return (reason, false),
                    Some(Control::Touch) | Some(Control::Start { .. }) => self.status.send_modify(|s| s.last_use = Some(Instant::now())),
                    None => return ("gpuhost is shutting down".into(), false),
                },
            }
        }
    }

    /// Logs the lines still in the pipes after the process ended: its dying words (an OOM's
    /// traceback) are often still there when the exit is seen. At most half a second: a
    /// process it left behind may hold a pipe open.
    async fn drain(&mut self, running: &mut Running, to_clients: bool) {
        let until = tokio::time::Instant::now() + Duration::from_millis(500);
        while running.stdout.is_some() || running.stderr.is_some() {
            let line = tokio::time::timeout_at(until, async {
                // (A closed pipe's branch is off, or its pending read would hold the other's
                // end from `else` until the timeout.)
                tokio::select! {
                    Some(line) = next_line(&mut running.stdout), if running.stdout.is_some() => Some(line),
                    Some(line) = next_line(&mut running.stderr), if running.stderr.is_some() => Some(line),
                    else => None,
                }
            });
            match line.await {
                Ok(Some(line)) => self.log(line, to_clients),
                _ => break,
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
        let owner = super::super::footprints::Owner::Service {
            pgid,
            name: &self.spec.name,
        };
        self.core
            .footprints
            .observe(&key, owner, self.core.device, &snap);
        let measured = self.core.footprints.measured(&key);
        self.status.send_modify(|s| s.measured_vram_mib = measured);
    }
}
