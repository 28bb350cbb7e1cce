//! One task on a session: its line sent, then followed to `done`, `error`, a crash, the
//! timeout or a cancel; a task that never reached the process is told apart (`Ran`).

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{recv_opt, Session};
use crate::process::describe_exit;
use crate::protocol::{Signal, TaskLine, WorkerEvent};
use crate::worker::TaskError;

/// How long a task may take, and how it is called off.
pub(in crate::worker) struct TaskLimits<'a> {
    pub(in crate::worker) timeout: Duration,
    pub(in crate::worker) cancel: &'a CancellationToken,
    pub(in crate::worker) cancel_grace: Duration,
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

/// How a task on the session ended.
pub(in crate::worker) enum Ran {
    /// It reached the process: its result, or how it failed.
    Answered(Result<Value, TaskError>),
    /// It never reached the process (the process was killed for it): another may take it.
    Undelivered(TaskError),
    /// The process answered out of step with its tasks; it was killed (a new one starts).
    OutOfStep(TaskError),
}

impl Ran {
    /// The outcome, a task that never reached the process as the crash it was.
    pub(in crate::worker) fn into_result(self) -> Result<Value, TaskError> {
        match self {
            Ran::Answered(outcome) => outcome,
            Ran::Undelivered(e) | Ran::OutOfStep(e) => Err(e),
        }
    }
}

impl Session {
    /// Sends one task and follows it to `done`, `error`, a crash or the timeout. When `cancel`
    /// fires, a worker that supports cancelling gets `SIGINT` and `cancel_grace` to give the task up.
    pub(in crate::worker) async fn run(
        &mut self,
        task: &serde_json::Map<String, Value>,
        output: &Path,
        events: &mpsc::Sender<WorkerEvent>,
        limits: TaskLimits<'_>,
    ) -> Ran {
        match self.follow(task, output, events, limits).await {
            // `done` with no result at all: a stray `done` (an earlier task's, said twice) or a
            // worker that lost track. Every answer after it would end the task after its own.
            // (A link it wrote, even one to nowhere, is something written: not followed here.)
            Ran::Answered(Err(TaskError::BadOutput { worker, reason }))
                if std::fs::symlink_metadata(output).is_err() =>
            {
                self.group.kill().await;
                Ran::OutOfStep(TaskError::BadOutput {
                    worker,
                    reason: format!(
                        "{reason}; it said `done` without writing its result, so its answers \
                         may no longer match its tasks: it was restarted"
                    ),
                })
            }
            ran => ran,
        }
    }

    async fn follow(
        &mut self,
        task: &serde_json::Map<String, Value>,
        output: &Path,
        events: &mpsc::Sender<WorkerEvent>,
        limits: TaskLimits<'_>,
    ) -> Ran {
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
        let deadline = Instant::now() + limits.timeout;
        let sent = tokio::select! {
            sent = self.send_line(&line) => Some(sent),
            _ = tokio::time::sleep_until(deadline) => None,
        };
        match sent {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                // It no longer reads its stdin: gone, or a library closed it. Either way the
                // task is not lost with it.
                self.group.kill().await;
                let exit = self.collect_exit().await;
                return Ran::Undelivered(self.crashed(format!(
                    "{exit}; it no longer read its stdin, so the task never reached it ({e})"
                )));
            }
            None => {
                tracing::warn!(worker = %self.name, "the worker did not read its task line within the task's timeout; killed");
                self.group.kill().await;
                return Ran::Answered(Err(TaskError::Timeout {
                    worker: self.name.clone(),
                    seconds: limits.timeout.as_secs_f64(),
                    unread: String::new(),
                }));
            }
        }
        Ran::Answered(
            self.answer(output, events, limits, &cancel_marker, deadline)
                .await,
        )
    }

    /// Follows a task sent to `done`, `error`, a crash, the timeout at `deadline`, or a cancel.
    async fn answer(
        &mut self,
        output: &Path,
        events: &mpsc::Sender<WorkerEvent>,
        limits: TaskLimits<'_>,
        cancel_marker: &Path,
        mut deadline: Instant,
    ) -> Result<Value, TaskError> {
        let mut phase = Phase::Running;
        // The last stdout line that was no signal, for a timeout's message.
        let mut last_other: Option<String> = None;
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
                    Some(_) => {
                        tracing::warn!(worker = %self.name, line = line.as_deref().unwrap_or(""),
                            "unexpected stdout line ignored (stdout is for signals only)");
                        last_other = line;
                    }
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
                        if let Err(e) = std::fs::write(cancel_marker, b"") {
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
                    return Err(TaskError::Timeout {
                        worker: self.name.clone(),
                        seconds: limits.timeout.as_secs_f64(),
                        unread: unread(last_other.as_deref()),
                    });
                }
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

    async fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await
    }
}

/// A timeout's note on the last stdout line that was no signal: a `DONE` or `done.` the host
/// could not take for `done` is the likeliest reason the task never ended.
fn unread(line: Option<&str>) -> String {
    let Some(line) = line else {
        return String::new();
    };
    let shown: String = line.chars().take(200).collect();
    format!(
        " (the last line it wrote on stdout, {shown:?}, was no signal: stdout is for `done` and \
         `error` alone)"
    )
}
