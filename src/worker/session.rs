//! One live worker process: start it and wait for `ready`, run a task over its three channels
//! (task on stdin, signals on stdout, logs and events on stderr), and stop it.

use std::collections::VecDeque;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lines::LineReader;
use super::TaskError;
use crate::config::{Mode, WorkerSpec};
use crate::process::{describe_exit, spawn_worker, ProcessGroup};
use crate::protocol::{ReadyInfo, Signal, TaskLine, WorkerEvent};

/// Stderr lines kept to explain a crash.
const TAIL_LINES: usize = 20;
/// How long a worker whose stdout closed gets to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

pub(super) struct Session {
    name: String,
    group: ProcessGroup,
    stdin: Option<ChildStdin>,
    stdout: LineReader<ChildStdout>,
    /// `None` once the worker closed stderr.
    stderr: Option<LineReader<ChildStderr>>,
    tail: VecDeque<String>,
    pub ready: ReadyInfo,
}

/// How long a task may take, and how it is called off.
pub(super) struct TaskLimits<'a> {
    pub timeout: Duration,
    pub cancel: &'a CancellationToken,
    pub cancel_grace: Duration,
}

/// Where a running task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Someone waits for the result.
    Running,
    /// Nobody does, and the worker was interrupted: it has `cancel_grace` to answer.
    Cancelling,
    /// Nobody does, but the worker cannot cancel: it runs to the end (or the task timeout).
    Finishing,
}

/// Something that happened while the worker sat idle.
pub(super) enum IdleEvent {
    Exited(String),
    Quiet,
}

impl Session {
    /// Spawns the worker and waits for `ready` within the load timeout.
    pub(super) async fn start(spec: &WorkerSpec) -> Result<Session, TaskError> {
        let mut env = spec.env.clone();
        env.insert("GPUHOST_WORKER".into(), spec.name.clone());
        if spec.mode == Mode::Oneshot {
            env.insert("GPUHOST_MODE".into(), "oneshot".into());
        }
        let (group, pipes) =
            spawn_worker(&spec.argv, &spec.cwd, &env).map_err(|e| TaskError::Unavailable {
                worker: spec.name.clone(),
                reason: format!("cannot run {:?} in {}: {e}", spec.argv, spec.cwd.display()),
            })?;
        tracing::info!(worker = %spec.name, pid = group.pid(), "worker process started");
        let mut session = Session {
            name: spec.name.clone(),
            group,
            stdin: Some(pipes.stdin),
            stdout: LineReader::new(pipes.stdout),
            stderr: Some(LineReader::new(pipes.stderr)),
            tail: VecDeque::with_capacity(TAIL_LINES),
            ready: ReadyInfo::default(),
        };
        let deadline = Instant::now() + spec.load_timeout;
        loop {
            tokio::select! {
                line = session.stdout.next_line() => match line {
                    Some(line) => match Signal::parse(&line) {
                        Signal::Ready(info) => {
                            session.ready = info;
                            return Ok(session);
                        }
                        _ => tracing::warn!(worker = %session.name, %line, "stdout line before ready ignored"),
                    },
                    None => {
                        let exit = session.collect_exit().await;
                        return Err(TaskError::Unavailable {
                            worker: session.name.clone(),
                            reason: format!("exited before ready ({exit}); last stderr lines:\n{}", session.tail_text()),
                        });
                    }
                },
                Some(line) = recv_opt(&mut session.stderr) => session.log_line(&line, None),
                _ = tokio::time::sleep_until(deadline) => {
                    session.group.kill().await;
                    return Err(TaskError::Unavailable {
                        worker: session.name.clone(),
                        reason: format!(
                            "not ready within load_timeout_s = {} s; killed. Last stderr lines:\n{}",
                            spec.load_timeout.as_secs_f64(), session.tail_text()),
                    });
                }
            }
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.group.pid()
    }

    /// Sends one task and follows it to `done`, `error`, a crash or the timeout. When `cancel`
    /// fires, a worker that supports cancelling gets `SIGINT` and `cancel_grace` to give the task up.
    pub(super) async fn run(
        &mut self,
        task: &serde_json::Map<String, Value>,
        output: &Path,
        events: &mpsc::Sender<WorkerEvent>,
        limits: TaskLimits<'_>,
    ) -> Result<Value, TaskError> {
        // The cancel marker: SIGINT alone can land before the worker has read the task line.
        let cancel_marker = output.with_extension("cancel");
        let cancel_path = self.ready.cancel.then(|| {
            let _ = std::fs::remove_file(&cancel_marker);
            cancel_marker.clone()
        });
        let line = TaskLine::new(task.clone(), output.to_path_buf(), cancel_path).to_line();
        let _ = std::fs::remove_file(output);
        if let Err(e) = self.send_line(&line).await {
            let exit = self.collect_exit().await;
            return Err(self.crashed(format!("{exit}; writing the task failed: {e}")));
        }
        let mut deadline = Instant::now() + limits.timeout;
        let mut phase = Phase::Running;
        loop {
            tokio::select! {
                biased;
                Some(line) = recv_opt(&mut self.stderr) => self.log_line(&line, Some(events)),
                line = self.stdout.next_line() => match line.as_deref().map(Signal::parse) {
                    Some(Signal::Done) => {
                        self.drain_stderr(events);
                        return self.read_output(output);
                    }
                    Some(Signal::Error(failure)) => {
                        self.drain_stderr(events);
                        if phase == Phase::Cancelling {
                            return Err(TaskError::Cancelled { worker: self.name.clone(), killed: false });
                        }
                        return Err(TaskError::Failed { worker: self.name.clone(), message: failure.message });
                    }
                    Some(_) => tracing::warn!(worker = %self.name, line = line.as_deref().unwrap_or(""),
                        "unexpected stdout line ignored (stdout is for signals only)"),
                    None => {
                        let exit = self.collect_exit().await;
                        return Err(self.crashed(exit));
                    }
                },
                // The process itself, not only its stdout: a child of the worker may hold the
                // pipe open after the worker died.
                status = self.group.wait() => {
                    return self.exited_during_task(status, output, events, phase).await;
                }
                _ = limits.cancel.cancelled(), if phase == Phase::Running => {
                    phase = Phase::Finishing;
                    if self.ready.cancel {
                        tracing::info!(worker = %self.name, "nobody wants the result any more: interrupting the task");
                        // Marker first: a worker that has not read the task yet sees it at the start.
                        if let Err(e) = std::fs::write(&cancel_marker, b"") {
                            tracing::warn!(worker = %self.name, error = %e, "cannot write the cancel marker");
                        }
                        self.group.signal_leader(libc::SIGINT);
                        phase = Phase::Cancelling;
                        deadline = deadline.min(Instant::now() + limits.cancel_grace);
                    } else {
                        tracing::info!(worker = %self.name, "nobody wants the result any more, but the worker cannot cancel: letting the task finish");
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    self.group.kill().await;
                    if phase == Phase::Cancelling {
                        tracing::warn!(worker = %self.name, grace_s = limits.cancel_grace.as_secs_f64(),
                            "the worker did not give the task up in time; killed");
                        return Err(TaskError::Cancelled { worker: self.name.clone(), killed: true });
                    }
                    return Err(TaskError::Timeout { worker: self.name.clone(), seconds: limits.timeout.as_secs_f64() });
                }
            }
        }
    }

    /// Waits for something to happen while no task runs: a log line (logged) or the exit.
    pub(super) async fn idle(&mut self) -> IdleEvent {
        tokio::select! {
            Some(line) = recv_opt(&mut self.stderr) => {
                self.log_line(&line, None);
                IdleEvent::Quiet
            }
            line = self.stdout.next_line() => match line {
                Some(line) => {
                    tracing::warn!(worker = %self.name, %line, "stdout line while idle ignored");
                    IdleEvent::Quiet
                }
                None => IdleEvent::Exited(self.collect_exit().await),
            },
            status = self.group.wait() => {
                // `wait` took the rest of the group down with the worker.
                let exit = status.as_ref().map(describe_exit).unwrap_or_else(|e| e.to_string());
                self.drain_tail().await;
                IdleEvent::Exited(exit)
            }
        }
    }

    /// The worker process ended while a task ran. Its last words may still sit in the stdout
    /// pipe (`done` right before exiting is how a oneshot worker ends), so read what is left.
    async fn exited_during_task(
        &mut self,
        status: std::io::Result<ExitStatus>,
        output: &Path,
        events: &mpsc::Sender<WorkerEvent>,
        phase: Phase,
    ) -> Result<Value, TaskError> {
        let exit = status
            .as_ref()
            .map(describe_exit)
            .unwrap_or_else(|e| e.to_string());
        let until = Instant::now() + Duration::from_millis(500);
        while let Ok(Some(line)) = tokio::time::timeout_at(until, self.stdout.next_line()).await {
            match Signal::parse(&line) {
                Signal::Done => {
                    self.drain_stderr(events);
                    return self.read_output(output);
                }
                Signal::Error(failure) if phase != Phase::Cancelling => {
                    self.drain_stderr(events);
                    return Err(TaskError::Failed {
                        worker: self.name.clone(),
                        message: failure.message,
                    });
                }
                _ => {}
            }
        }
        self.drain_tail().await;
        Err(self.crashed(exit))
    }

    /// Logs the stderr lines still in the pipe after the process ended.
    async fn drain_tail(&mut self) {
        if let Some(mut rx) = self.stderr.take() {
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(Some(line)) = tokio::time::timeout_at(until, rx.next_line()).await {
                self.log_line(&line, None);
            }
        }
    }

    /// Oneshot end: close stdin (EOF ends an original-protocol worker), then stop.
    pub(super) async fn finish(mut self, grace: Duration) {
        self.stdin = None;
        if self.group.wait_timeout(grace).await.is_none() {
            self.stop(grace).await;
        }
    }

    /// Signal → grace → kill, then reap.
    pub(super) async fn stop(mut self, grace: Duration) {
        self.stdin = None;
        let status = self.group.terminate(grace).await;
        tracing::info!(worker = %self.name, exit = %status.as_ref().map(describe_exit).unwrap_or_default(), "worker stopped");
    }

    pub(super) fn tail_text(&self) -> String {
        if self.tail.is_empty() {
            return "(no stderr output)".into();
        }
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    async fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await
    }

    fn crashed(&self, exit: String) -> TaskError {
        TaskError::Crashed {
            worker: self.name.clone(),
            exit,
            tail: self.tail_text(),
        }
    }

    fn read_output(&self, output: &Path) -> Result<Value, TaskError> {
        let bad = |reason: String| TaskError::BadOutput {
            worker: self.name.clone(),
            reason,
        };
        let text = std::fs::read(output)
            .map_err(|e| bad(format!("cannot read {}: {e}", output.display())))?;
        serde_json::from_slice(&text)
            .map_err(|e| bad(format!("{} is not valid JSON: {e}", output.display())))
    }

    /// After stdout closed: the exit status (killing a process that lingers), with the last
    /// stderr lines collected for the error message.
    async fn collect_exit(&mut self) -> String {
        let status: Option<ExitStatus> = match self.group.wait_timeout(EXIT_GRACE).await {
            Some(status) => Some(status),
            None => self.group.kill().await,
        };
        self.drain_tail().await;
        status
            .as_ref()
            .map(describe_exit)
            .unwrap_or_else(|| "unknown exit".into())
    }

    fn drain_stderr(&mut self, events: &mpsc::Sender<WorkerEvent>) {
        // The worker flushed these before its signal: they are in the pipe already.
        let Some(mut rx) = self.stderr.take() else {
            return;
        };
        while let Some(line) = rx.ready_line() {
            self.log_line(&line, Some(events));
        }
        self.stderr = Some(rx);
    }

    fn log_line(&mut self, line: &str, events: Option<&mpsc::Sender<WorkerEvent>>) {
        let event = WorkerEvent::parse(line);
        if let WorkerEvent::Log { message, .. } = &event {
            if self.tail.len() == TAIL_LINES {
                self.tail.pop_front();
            }
            self.tail.push_back(message.clone());
            tracing::debug!(worker = %self.name, "{message}");
        }
        if let Some(events) = events {
            // A slow or vanished client must never stall the worker: drop instead of waiting.
            let _ = events.try_send(event);
        }
    }
}

/// Reads from an optional pipe; once it closes it is set to `None` and never polled again.
async fn recv_opt(rx: &mut Option<LineReader<ChildStderr>>) -> Option<String> {
    match rx {
        Some(inner) => match inner.next_line().await {
            Some(line) => Some(line),
            None => {
                *rx = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}
