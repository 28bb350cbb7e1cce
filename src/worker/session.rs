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

use super::lines::{next_line_opt as recv_opt, LineReader};
use super::TaskError;
use crate::config::{Mode, WorkerSpec};
use crate::process::{describe_exit, spawn_worker, ProcessGroup};
use crate::protocol::{ReadyInfo, Signal, TaskLine, WorkerEvent};

mod output;

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
                        Signal::BadReady { line, error } => {
                            session.group.kill().await;
                            return Err(TaskError::Unavailable {
                                worker: session.name.clone(),
                                reason: format!("its `ready` line has metadata gpuhost cannot read ({error}); see protocol/PROTOCOL.md for the keys: {line}"),
                            });
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
                // The process itself, not only its stdout: a child of the worker may hold the
                // pipe open after the worker died, which would leave it `starting` until the
                // load timeout.
                status = session.group.wait() => {
                    let exit = status.as_ref().map(describe_exit).unwrap_or_else(|e| e.to_string());
                    session.drain_tail().await;
                    return Err(TaskError::Unavailable {
                        worker: session.name.clone(),
                        reason: format!("exited before ready ({exit}); last stderr lines:\n{}", session.tail_text()),
                    });
                }
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
        // "Last lines" of this task only: earlier tasks' lines (their inputs, their folders)
        // are other clients' business, and no explanation of this one's crash.
        self.tail.clear();
        // The task's time counts from here: a worker that stops reading its stdin (the line can
        // be megabytes: earlier stages' results) must not hold the GPU past it.
        let mut deadline = Instant::now() + limits.timeout;
        let sent = tokio::select! {
            sent = self.send_line(&line) => Some(sent),
            _ = tokio::time::sleep_until(deadline) => None,
        };
        match sent {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                let exit = self.collect_exit().await;
                return Err(self.crashed(format!("{exit}; writing the task failed: {e}")));
            }
            None => {
                tracing::warn!(worker = %self.name, "the worker did not read its task line within the task's timeout; killed");
                self.group.kill().await;
                return Err(TaskError::Timeout {
                    worker: self.name.clone(),
                    seconds: limits.timeout.as_secs_f64(),
                });
            }
        }
        let mut phase = Phase::Running;
        loop {
            tokio::select! {
                biased;
                Some(line) = recv_opt(&mut self.stderr) => self.log_line(&line, Some(events)),
                line = self.stdout.next_line() => match line.as_deref().map(Signal::parse) {
                    Some(Signal::Done) => {
                        self.drain_stderr(events);
                        return self.read_output(output).await;
                    }
                    Some(Signal::Error(failure)) => {
                        self.drain_stderr(events);
                        if phase == Phase::Cancelling {
                            return Err(TaskError::Cancelled { worker: self.name.clone(), killed: false });
                        }
                        return Err(TaskError::failed(&self.name, failure));
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
                    return self.read_output(output).await;
                }
                Signal::Error(failure) if phase != Phase::Cancelling => {
                    self.drain_stderr(events);
                    return Err(TaskError::failed(&self.name, failure));
                }
                _ => {}
            }
        }
        self.drain_tail().await;
        Err(self.crashed(exit))
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

    async fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await
    }
}
