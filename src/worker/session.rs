//! One live worker process: start it and wait for `ready`, run a task over its three channels
//! (task on stdin, signals on stdout, logs and events on stderr), and stop it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::time::Instant;

use super::lines::{next_line_opt as recv_opt, LineReader};
use super::TaskError;
use crate::config::{Mode, WorkerSpec};
use crate::process::{describe_exit, spawn_worker, ProcessGroup};
use crate::protocol::{ReadyInfo, Signal};

mod output;
mod task;

pub(in crate::worker) use task::{Ran, TaskLimits};

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

/// Something that happened while the worker sat idle.
pub(super) enum IdleEvent {
    Exited(String),
    Quiet,
}

impl Session {
    /// Spawns the worker; it loads its model next (`wait_ready`).
    pub(super) fn spawn(spec: &WorkerSpec) -> Result<Session, TaskError> {
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
        Ok(Session {
            name: spec.name.clone(),
            group,
            stdin: Some(pipes.stdin),
            stdout: LineReader::new(pipes.stdout),
            stderr: Some(LineReader::new(pipes.stderr)),
            tail: VecDeque::with_capacity(TAIL_LINES),
            ready: ReadyInfo::default(),
        })
    }

    /// Waits for `ready` within `load_timeout` (its metadata in `self.ready`). On an error the
    /// process has ended or been killed, and the error says why.
    pub(super) async fn wait_ready(&mut self, load_timeout: Duration) -> Result<(), TaskError> {
        let session = self;
        let deadline = Instant::now() + load_timeout;
        loop {
            tokio::select! {
                line = session.stdout.next_line() => match line {
                    Some(line) => match Signal::parse(&line) {
                        Signal::Ready(info) => {
                            session.ready = info;
                            return Ok(());
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
                            load_timeout.as_secs_f64(), session.tail_text()),
                    });
                }
            }
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.group.pid()
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
}
