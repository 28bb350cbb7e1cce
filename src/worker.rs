//! A supervised model worker: the handle the rest of the host uses, the control messages its
//! actor takes, the status it publishes, and the errors a task can end with.

mod actor;
pub mod lines;
mod session;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{Mode, WorkerSpec};
use crate::protocol::{ErrorCode, ReadyInfo, WorkerEvent};

/// What the actor is doing. Published through `/workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Process started, waiting for `ready`.
    Starting,
    /// Loaded and waiting for a task.
    Ready,
    /// Running a task.
    Busy,
    /// Not running: crashed or failed to load; restarts with backoff (resident) or on the next task.
    Exited,
    /// Oneshot worker between tasks: nothing running, nothing loaded.
    Idle,
    /// Resident worker unloaded to make room on the GPU (or by hand); loads again at the next
    /// task or when the arbiter reloads it.
    Unloaded,
    /// Shut down for good.
    Stopped,
}

/// A snapshot of one worker, cheap to clone and never behind the GPU lock.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub name: String,
    pub mode: Mode,
    pub state: WorkerState,
    pub pid: Option<u32>,
    /// What the worker said after `ready` (model, device, protocol).
    pub loaded: Option<ReadyInfo>,
    pub vram_mib: u64,
    /// The GPU it runs on.
    pub device: u32,
    pub tasks_done: u64,
    pub tasks_failed: u64,
    /// Tasks it declined for what they asked (`kind: "refused"`): not failures.
    pub tasks_refused: u64,
    /// Tasks given up because their client went away (not failures).
    pub tasks_cancelled: u64,
    pub restarts: u64,
    pub last_error: Option<String>,
    #[serde(skip)]
    pub state_since: Instant,
    #[serde(skip)]
    pub process_started: Option<Instant>,
}

impl WorkerStatus {
    /// Whether the worker said, when it last loaded, that it runs on the CPU (`ready`'s
    /// `device`): it holds no GPU memory. Its config, and so its device, stays the same.
    pub fn runs_on_cpu(&self) -> bool {
        self.loaded
            .as_ref()
            .is_some_and(crate::protocol::ReadyInfo::runs_on_cpu)
    }

    fn new(spec: &WorkerSpec) -> WorkerStatus {
        WorkerStatus {
            name: spec.name.clone(),
            mode: spec.mode,
            state: match spec.mode {
                Mode::Resident => WorkerState::Starting,
                Mode::Oneshot => WorkerState::Idle,
            },
            pid: None,
            loaded: None,
            vram_mib: spec.vram_mib,
            device: spec.device,
            tasks_done: 0,
            tasks_failed: 0,
            tasks_refused: 0,
            tasks_cancelled: 0,
            restarts: 0,
            last_error: None,
            state_since: Instant::now(),
            process_started: None,
        }
    }

    /// Seconds the current process has been up (0 when none runs).
    pub fn uptime_s(&self) -> f64 {
        self.process_started
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0)
    }
}

/// One task for one worker.
#[derive(Debug)]
pub struct TaskRequest {
    /// The task object. The worker's configured `options` are merged under it, and the host adds
    /// `_output_path` and `_protocol`.
    pub task: serde_json::Map<String, Value>,
    /// Where the worker must write its result.
    pub output_path: PathBuf,
    /// Progress and log events of this task (dropped when the receiver lags or is gone).
    pub events: mpsc::Sender<WorkerEvent>,
    /// Cancelled when nobody wants the result any more: a worker that supports it abandons
    /// the task (`SIGINT`), one that does not finishes it.
    pub cancel: CancellationToken,
}

/// Messages the worker actor takes.
#[derive(Debug)]
pub enum Control {
    Run {
        request: TaskRequest,
        reply: oneshot::Sender<Result<Value, TaskError>>,
    },
    /// Stop the process (signal → grace → kill) and end the actor.
    Stop { reply: oneshot::Sender<()> },
    /// Stop the process but keep the actor: the worker is `Unloaded` until a task or `Load`.
    /// The reply carries the pid that was stopped (for the teardown check), if one ran.
    Unload { reply: oneshot::Sender<Option<u32>> },
    /// Load an unloaded (or down) worker now.
    Load,
}

/// How a task ended when it did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TaskError {
    #[error("worker `{worker}` could not start: {reason}")]
    Unavailable { worker: String, reason: String },
    #[error("worker `{worker}` crashed during the task ({exit}); a new process takes the next task. Last stderr lines:\n{tail}")]
    Crashed {
        worker: String,
        exit: String,
        tail: String,
    },
    #[error("worker `{worker}` did not finish the task within {seconds:.0} s{unread}; it was killed, and a new process takes the next task")]
    Timeout {
        worker: String,
        seconds: f64,
        /// What it wrote on stdout that was no signal, last (`DONE`, `done.`): often why.
        unread: String,
    },
    #[error("worker `{worker}` {} the task: {message}", kind.verb())]
    Failed {
        worker: String,
        message: String,
        kind: FailureKind,
    },
    #[error("worker `{worker}` said done but its result is unusable: {reason}")]
    BadOutput { worker: String, reason: String },
    #[error("worker `{worker}` is shutting down")]
    ShuttingDown { worker: String },
    /// The task was abandoned because nobody wanted its result any more.
    #[error("worker `{worker}` abandoned the task: the client went away{}", if *.killed { " (it did not stop in time and was restarted)" } else { "" })]
    Cancelled { worker: String, killed: bool },
}

/// What a worker's `error` says of its cause (its `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// `refused`: the task asked what this input or model cannot do (too little speech for a
    /// voiceprint, a language the model lacks); the client's to change, not a failure.
    Refused,
    /// `no_space`: the worker's disk or quota was full (507, as the host's own full disk).
    NoSpace,
    /// Anything else (an exception's class name, or none).
    Other,
}

impl FailureKind {
    pub fn of(kind: Option<&str>) -> FailureKind {
        match kind {
            Some("refused") => FailureKind::Refused,
            Some("no_space") => FailureKind::NoSpace,
            _ => FailureKind::Other,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            FailureKind::Refused => "refused",
            FailureKind::NoSpace | FailureKind::Other => "failed",
        }
    }
}

impl TaskError {
    /// The task failed as the worker's `error` signal says.
    pub(crate) fn failed(worker: &str, failure: crate::protocol::TaskFailure) -> TaskError {
        TaskError::Failed {
            worker: worker.to_string(),
            kind: FailureKind::of(failure.kind.as_deref()),
            message: failure.message,
        }
    }

    /// The worker declined what the task asked: the client's to change, not a failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            TaskError::Failed {
                kind: FailureKind::Refused,
                ..
            }
        )
    }

    /// Machine-readable code for the NDJSON `error` event.
    pub fn code(&self) -> ErrorCode {
        match self {
            TaskError::Unavailable { .. } => ErrorCode::WorkerUnavailable,
            TaskError::Crashed { .. } => ErrorCode::WorkerCrashed,
            TaskError::Timeout { .. } => ErrorCode::WorkerTimeout,
            TaskError::Failed {
                kind: FailureKind::NoSpace,
                ..
            } => ErrorCode::InsufficientStorage,
            TaskError::Failed {
                kind: FailureKind::Refused,
                ..
            } => ErrorCode::Refused,
            TaskError::Failed { .. } => ErrorCode::JobFailed,
            TaskError::BadOutput { .. } => ErrorCode::BadOutput,
            TaskError::ShuttingDown { .. } => ErrorCode::ShuttingDown,
            TaskError::Cancelled { .. } => ErrorCode::Cancelled,
        }
    }
}

/// The rest of the host talks to a worker only through this handle.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    name: String,
    control: mpsc::Sender<Control>,
    status: watch::Receiver<WorkerStatus>,
}

impl WorkerHandle {
    /// Starts the actor; a resident worker begins loading at once.
    pub fn spawn(spec: WorkerSpec) -> (WorkerHandle, tokio::task::JoinHandle<()>) {
        let (control, rx) = mpsc::channel(64);
        let (status_tx, status) = watch::channel(WorkerStatus::new(&spec));
        let name = spec.name.clone();
        let task = tokio::spawn(actor::Actor::new(spec, rx, status_tx).run());
        (
            WorkerHandle {
                name,
                control,
                status,
            },
            task,
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The GPU it runs on (fixed by its config), without a copy of the whole status.
    pub fn device(&self) -> u32 {
        self.status.borrow().device
    }

    pub fn status(&self) -> WorkerStatus {
        self.status.borrow().clone()
    }

    /// Waits until the worker reaches a state for which `pred` holds.
    pub async fn wait_for_state(&self, pred: impl Fn(&WorkerStatus) -> bool) -> WorkerStatus {
        let mut rx = self.status.clone();
        let reached = rx.wait_for(|s| pred(s)).await.map(|s| s.clone());
        reached.unwrap_or_else(|_| self.status.borrow().clone())
    }

    /// Runs one task; resolves when the worker is done with it, however it ended.
    pub async fn run(&self, request: TaskRequest) -> Result<Value, TaskError> {
        let (reply, rx) = oneshot::channel();
        let gone = || TaskError::ShuttingDown {
            worker: self.name.clone(),
        };
        self.control
            .send(Control::Run { request, reply })
            .await
            .map_err(|_| gone())?;
        rx.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Unloads the worker (its process stops, the actor stays); returns the pid that was stopped.
    /// Waits for a task in progress to end first.
    pub async fn unload(&self) -> Option<u32> {
        let (reply, rx) = oneshot::channel();
        self.control.send(Control::Unload { reply }).await.ok()?;
        rx.await.ok().flatten()
    }

    /// Asks an unloaded worker to load now (does not wait for it).
    pub fn load(&self) {
        let _ = self.control.try_send(Control::Load);
    }

    /// Stops the worker and waits until its process is gone.
    pub async fn stop(&self) {
        let (reply, rx) = oneshot::channel();
        if self.control.send(Control::Stop { reply }).await.is_ok() {
            let _ = rx.await;
        }
    }
}
