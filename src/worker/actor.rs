//! The worker actor: one task owns the worker process, takes `Control` messages, restarts the
//! worker after a crash or hang (with backoff), and publishes its state.

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::session::{IdleEvent, Session};
use super::{Control, TaskError, TaskRequest, WorkerState, WorkerStatus};
use crate::config::{Mode, WorkerSpec};

mod backoff;
mod task;

use backoff::{backoff, STABLE_UP};

type Reply = oneshot::Sender<Result<Value, TaskError>>;

/// Where the worker process is in its life.
enum Life {
    /// A loaded process waiting for tasks.
    Up(Box<Session>),
    /// No process. A resident worker retries at `retry_at`.
    Down { retry_at: Option<Instant> },
}

pub(super) struct Actor {
    spec: WorkerSpec,
    rx: mpsc::Receiver<Control>,
    status: watch::Sender<WorkerStatus>,
    life: Life,
    /// Tasks that arrived while the worker was loading.
    pending: VecDeque<(TaskRequest, Reply)>,
    /// Failures in a row: loads that failed, and processes that went down before they had
    /// answered a task or stayed up [`STABLE_UP`]; drives the backoff. (Reset by `ready` alone,
    /// a worker that exits right after it restarted 25 times a second.)
    failures: u32,
    /// When the process said `ready`, while it is up.
    up_since: Option<Instant>,
    /// Tasks the process answered (`done` or `error`) since `ready`.
    answered: u32,
    /// Why the last load failed, for tasks that find the worker down.
    load_error: Option<TaskError>,
    /// The `Unload`s that arrived while a load or task was in progress: done right after it,
    /// each caller told the same.
    unload_after: Vec<oneshot::Sender<Option<u32>>>,
    /// The load under way follows a failure (the worker read `exited`): stopped before it is
    /// ready, the worker is still the failing one.
    retrying: bool,
    /// The last process an unload stopped, and when: an unload that comes while (or just
    /// after) another stops it is told the same pid, not that nothing was stopped (make room
    /// checks that pid's memory back).
    last_stopped: Option<(u32, Instant)>,
}

/// What interrupted a load.
enum Interrupted {
    Stop(oneshot::Sender<()>),
}

/// How long after an unload stopped a process another unload is told that pid.
const JUST_STOPPED: Duration = Duration::from_secs(5);

/// How waiting for `ready` ended.
enum Loading {
    Ended(Result<(), TaskError>),
    Stop(oneshot::Sender<()>),
    /// Unloaded before it was ready: stopped right after (`unload_after`).
    Unload(oneshot::Sender<Option<u32>>),
}

impl Actor {
    pub(super) fn new(
        spec: WorkerSpec,
        rx: mpsc::Receiver<Control>,
        status: watch::Sender<WorkerStatus>,
    ) -> Actor {
        let retry_at = (spec.mode == Mode::Resident).then(Instant::now);
        Actor {
            spec,
            rx,
            status,
            life: Life::Down { retry_at },
            pending: VecDeque::new(),
            failures: 0,
            up_since: None,
            answered: 0,
            load_error: None,
            unload_after: Vec::new(),
            retrying: false,
            last_stopped: None,
        }
    }

    pub(super) async fn run(mut self) {
        loop {
            if !self.unload_after.is_empty() {
                let replies = std::mem::take(&mut self.unload_after);
                self.unload(replies).await;
                continue;
            }
            if let Some((request, reply)) = self.pending.pop_front() {
                if let Err(Interrupted::Stop(stop)) = self.handle_task(request, reply).await {
                    return self.finish(stop).await;
                }
                continue;
            }
            let control = match &mut self.life {
                Life::Up(session) => tokio::select! {
                    control = self.rx.recv() => control,
                    event = session.idle() => {
                        if let IdleEvent::Exited(exit) = event {
                            tracing::warn!(worker = %self.spec.name, %exit, "idle worker exited; restarting");
                            let tail = session.tail_text();
                            self.went_down(format!("exited while idle ({exit}); last stderr lines:\n{tail}"));
                        }
                        continue;
                    }
                },
                Life::Down { retry_at: Some(at) } => {
                    let at = *at;
                    tokio::select! {
                        control = self.rx.recv() => control,
                        _ = tokio::time::sleep_until(at) => {
                            if let Err(Interrupted::Stop(reply)) = self.load(false).await {
                                return self.finish(reply).await;
                            }
                            continue;
                        }
                    }
                }
                Life::Down { retry_at: None } => self.rx.recv().await,
            };
            match control {
                Some(Control::Run { request, reply }) => {
                    if let Err(Interrupted::Stop(stop)) = self.handle_task(request, reply).await {
                        return self.finish(stop).await;
                    }
                }
                Some(Control::Stop { reply }) => return self.finish(reply).await,
                Some(Control::Unload { reply }) => self.unload(vec![reply]).await,
                Some(Control::Load) => {
                    if matches!(self.life, Life::Down { .. }) {
                        if let Err(Interrupted::Stop(reply)) = self.load(false).await {
                            return self.finish(reply).await;
                        }
                    }
                }
                None => {
                    let (reply, _) = oneshot::channel();
                    return self.finish(reply).await;
                }
            }
        }
    }

    /// See [`defer`].
    fn defer(&mut self, control: Option<Control>) -> Option<oneshot::Sender<()>> {
        defer(control, &mut self.pending, &mut self.unload_after)
    }

    /// Stops the process and stays `Unloaded` until a task or `Load` comes; tells each of
    /// `replies` the pid it stopped.
    async fn unload(&mut self, replies: Vec<oneshot::Sender<Option<u32>>>) {
        let pid = match std::mem::replace(&mut self.life, Life::Down { retry_at: None }) {
            Life::Up(session) => {
                let pid = session.pid();
                session.stop(self.spec.stop_grace).await;
                tracing::info!(worker = %self.spec.name, pid, "worker unloaded");
                self.last_stopped = Some((pid, Instant::now()));
                Some(pid)
            }
            Life::Down { .. } => self
                .last_stopped
                .filter(|(_, at)| at.elapsed() < JUST_STOPPED)
                .map(|(pid, _)| pid),
        };
        // A worker that was down after failing stays `exited` (with its error): called
        // `unloaded`, it looked ready to take jobs it cannot load for. Either way it loads
        // again at the next task or `Load`, not on its own.
        // A one-shot worker has no model loaded between tasks: it is idle, as ever. One stopped
        // while it loaded again after failing is still the failing one.
        let state = match (self.status.borrow().state, self.spec.mode) {
            (WorkerState::Exited, _) => WorkerState::Exited,
            (WorkerState::Starting, Mode::Resident) if self.retrying => WorkerState::Exited,
            (_, Mode::Oneshot) => WorkerState::Idle,
            _ => WorkerState::Unloaded,
        };
        self.set_state(state, |s| {
            s.pid = None;
            s.process_started = None;
        });
        for reply in replies {
            let _ = reply.send(pid);
        }
    }

    /// Starts the process and waits for `ready`, still answering `Stop` meanwhile, and `Unload`
    /// when no task waits for the load (`for_task`, `pending`): a load that hangs then holds
    /// nobody up to its timeout. A load for a task (`for_task`) is unloaded after that task;
    /// otherwise the unload comes once the load ends, before the tasks that came meanwhile
    /// (which load the worker again).
    async fn load(&mut self, for_task: bool) -> Result<(), Interrupted> {
        // A load that fails is judged by itself, not by a process before it (unloaded or
        // ended since, perhaps long up).
        (self.up_since, self.answered) = (None, 0);
        self.retrying = self.status.borrow().state == WorkerState::Exited;
        let spawned = Session::spawn(&self.spec);
        // A new process: an unload from now on stops it or nothing.
        self.last_stopped = None;
        let pid = spawned.as_ref().ok().map(Session::pid);
        self.set_state(WorkerState::Starting, |s| {
            // Known while it loads: /status names its GPU process, its footprint is measured.
            s.pid = pid;
            s.process_started = Some(std::time::Instant::now());
        });
        let outcome = match spawned {
            Ok(mut session) => {
                let loaded = {
                    let ready = session.wait_ready(self.spec.load_timeout);
                    tokio::pin!(ready);
                    loop {
                        tokio::select! {
                            outcome = &mut ready => break Loading::Ended(outcome),
                            control = self.rx.recv() => match control {
                                Some(Control::Unload { reply }) if !for_task && self.pending.is_empty() => {
                                    break Loading::Unload(reply);
                                }
                                control => if let Some(stop) = self.defer(control) {
                                    break Loading::Stop(stop);
                                },
                            },
                        }
                    }
                };
                match loaded {
                    Loading::Ended(outcome) => outcome.map(|()| session),
                    Loading::Stop(stop) => return Err(Interrupted::Stop(stop)),
                    Loading::Unload(reply) => {
                        // Stopped next, before anything else (`run`), by `unload`.
                        self.unload_after.push(reply);
                        self.life = Life::Up(Box::new(session));
                        return Ok(());
                    }
                }
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(session) => {
                tracing::info!(worker = %self.spec.name, pid = session.pid(), ready = %serde_json::to_string(&session.ready).unwrap_or_default(), "worker ready");
                (self.up_since, self.answered) = (Some(Instant::now()), 0);
                let (pid, ready) = (session.pid(), session.ready.clone());
                self.life = Life::Up(Box::new(session));
                self.set_state(WorkerState::Ready, |s| {
                    s.pid = Some(pid);
                    s.loaded = Some(ready);
                });
            }
            Err(e) => {
                // Its own target: `gpuhost transcribe` leaves it out, the job's error says it.
                tracing::error!(target: "gpuhost::worker::load", worker = %self.spec.name, error = %e, "worker failed to load");
                self.went_down(e.to_string());
                self.load_error = Some(e.clone());
                // Whoever was waiting for this load hears why it failed.
                for (_, reply) in self.pending.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        Ok(())
    }

    /// Records that the process is gone and schedules the restart.
    fn went_down(&mut self, error: String) {
        let (up_since, answered) = (self.up_since.take(), std::mem::take(&mut self.answered));
        let proven = up_since.is_some_and(|t| t.elapsed() >= STABLE_UP) || answered > 0;
        if proven {
            self.failures = 0;
        }
        self.failures += 1;
        let retry_at = match self.spec.mode {
            Mode::Resident => Some(Instant::now() + backoff(self.failures)),
            Mode::Oneshot => None,
        };
        self.life = Life::Down { retry_at };
        let state = match self.spec.mode {
            Mode::Resident => WorkerState::Exited,
            Mode::Oneshot => WorkerState::Idle,
        };
        self.set_state(state, |s| {
            s.pid = None;
            s.process_started = None;
            s.last_error = Some(error);
            if s.mode == Mode::Resident {
                s.restarts += 1;
            }
        });
    }

    async fn finish(mut self, reply: oneshot::Sender<()>) {
        if let Life::Up(session) = std::mem::replace(&mut self.life, Life::Down { retry_at: None })
        {
            session.stop(self.spec.stop_grace).await;
        }
        for (_, waiting) in self.pending.drain(..) {
            let _ = waiting.send(Err(TaskError::ShuttingDown {
                worker: self.spec.name.clone(),
            }));
        }
        self.rx.close();
        while let Ok(control) = self.rx.try_recv() {
            match control {
                Control::Run { reply, .. } => {
                    let _ = reply.send(Err(TaskError::ShuttingDown {
                        worker: self.spec.name.clone(),
                    }));
                }
                Control::Stop { reply } => {
                    let _ = reply.send(());
                }
                Control::Unload { reply } => {
                    let _ = reply.send(None);
                }
                Control::Load => {}
            }
        }
        self.set_state(WorkerState::Stopped, |s| {
            s.pid = None;
            s.process_started = None;
        });
        let _ = reply.send(());
    }

    fn set_state(&self, state: WorkerState, also: impl FnOnce(&mut WorkerStatus)) {
        self.status.send_modify(|s| {
            s.state = state;
            s.state_since = std::time::Instant::now();
            also(s);
        });
    }
}

/// A control message that arrived while a load or a task was in progress: tasks wait their turn,
/// an unload happens right after, `Stop` (or every handle gone) interrupts and is returned.
fn defer(
    control: Option<Control>,
    pending: &mut VecDeque<(TaskRequest, Reply)>,
    unload_after: &mut Vec<oneshot::Sender<Option<u32>>>,
) -> Option<oneshot::Sender<()>> {
    match control {
        Some(Control::Run { request, reply }) => pending.push_back((request, reply)),
        Some(Control::Stop { reply }) => return Some(reply),
        Some(Control::Unload { reply }) => unload_after.push(reply),
        Some(Control::Load) => {}
        None => return Some(oneshot::channel().0),
    }
    None
}
