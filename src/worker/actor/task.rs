//! One task through the actor: load first when needed (or serve an unloaded resident one-shot),
//! run it on the session, and turn the outcome into the worker's next state.

use super::{defer, Actor, Interrupted, Life, Reply};
use crate::config::{Fallback, Mode};
use crate::worker::session::{Ran, TaskLimits};
use crate::worker::{TaskError, TaskRequest, WorkerState};

impl Actor {
    /// Runs one task, loading the worker first when needed. `Err` means a `Stop` came meanwhile.
    pub(super) async fn handle_task(
        &mut self,
        request: TaskRequest,
        reply: Reply,
    ) -> Result<(), Interrupted> {
        // An unloaded resident with `fallback = "oneshot"` serves this task and unloads again.
        let oneshot_fallback = self.spec.mode == Mode::Resident
            && self.spec.unloaded_fallback == Fallback::Oneshot
            && self.status.borrow().state == WorkerState::Unloaded;
        // Its client left while it waited (behind another task, or for a load): nobody wants
        // it, so it is not loaded for, nor sent (a worker that cannot cancel ran it in full).
        if let Some(cancelled) = self.called_off(&request) {
            let _ = reply.send(Err(cancelled));
            return Ok(());
        }
        if let Err(instead) = self.up_for(&request, oneshot_fallback).await {
            return instead.answer(reply, &self.spec.name);
        }
        let (mut ran, mut stop) = self.run_loaded(&request).await;
        if let (Ran::Undelivered(e), None) = (&ran, &stop) {
            // Nothing reached the process (it closed its stdin while idle, and stays up): a new
            // one takes the task, which was no one's fault but the worker's.
            tracing::warn!(worker = %self.spec.name, error = %e, "the task did not reach the worker; restarting it and sending the task again");
            self.went_down(e.to_string());
            if let Err(instead) = self.up_for(&request, oneshot_fallback).await {
                return instead.answer(reply, &self.spec.name);
            }
            (ran, stop) = self.run_loaded(&request).await;
        }
        let out_of_step = matches!(ran, Ran::OutOfStep(_));
        let outcome = ran.into_result();
        if let Some(stop) = stop {
            let _ = reply.send(outcome);
            return Err(Interrupted::Stop(stop));
        }
        let broken = out_of_step
            || matches!(
                outcome,
                Err(TaskError::Crashed { .. }
                    | TaskError::Timeout { .. }
                    | TaskError::Cancelled { killed: true, .. })
            );
        self.status.send_modify(|s| match &outcome {
            Ok(_) => s.tasks_done += 1,
            Err(TaskError::Cancelled { .. }) => s.tasks_cancelled += 1,
            // The client's to change: no failure of the worker, and no `last_error` of its.
            Err(e) if e.is_refusal() => s.tasks_refused += 1,
            Err(e) => {
                s.tasks_failed += 1;
                s.last_error = Some(e.to_string());
            }
        });
        // The process answered: it works (a result it got wrong is still an answer; one that
        // was killed for a client that left is no failure of its own).
        if matches!(
            outcome,
            Ok(_)
                | Err(TaskError::Failed { .. }
                    | TaskError::BadOutput { .. }
                    | TaskError::Cancelled { .. })
        ) {
            self.answered += 1;
        }
        if broken {
            let error = outcome
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            self.went_down(error);
            if oneshot_fallback {
                // It was unloaded on purpose (for a lease or a service): it stays so, and is not
                // loaded again beside that holder on its own.
                self.life = Life::Down { retry_at: None };
                self.set_state(WorkerState::Unloaded, |_| {});
            }
        } else {
            self.task_ended(oneshot_fallback).await;
        }
        let _ = reply.send(outcome);
        Ok(())
    }

    /// A process up for `request`: loaded now if it is down (someone is waiting: not at the
    /// backoff deadline); `Err` with what the task gets instead when the load failed, a `Stop`
    /// came, or its client left meanwhile (a oneshot process loaded for it then ends unused:
    /// left up, it held the GPU with no permit, beside the next job's other model).
    async fn up_for(
        &mut self,
        request: &TaskRequest,
        oneshot_fallback: bool,
    ) -> Result<(), Instead> {
        if matches!(self.life, Life::Down { .. }) {
            self.load(true).await.map_err(Instead::Stop)?;
            if let Life::Down { .. } = self.life {
                let error = self
                    .load_error
                    .clone()
                    .unwrap_or_else(|| TaskError::Unavailable {
                        worker: self.spec.name.clone(),
                        reason: "it is not running".into(),
                    });
                return Err(Instead::Answer(error));
            }
        }
        if let Some(cancelled) = self.called_off(request) {
            self.task_ended(oneshot_fallback).await;
            return Err(Instead::Answer(cancelled));
        }
        Ok(())
    }

    /// Runs `request` on the loaded process, answering control messages meanwhile; the stop
    /// that came, if one did.
    async fn run_loaded(
        &mut self,
        request: &TaskRequest,
    ) -> (Ran, Option<tokio::sync::oneshot::Sender<()>>) {
        self.status.send_modify(|s| {
            s.state = WorkerState::Busy;
            s.state_since = std::time::Instant::now();
        });
        let Actor {
            life,
            rx,
            pending,
            spec,
            unload_after,
            ..
        } = self;
        let Life::Up(session) = life else {
            unreachable!("loaded above")
        };
        // Configured options first; the task's own fields win.
        let mut task = spec.options.clone();
        task.extend(request.task.clone());
        let limits = TaskLimits {
            timeout: spec.task_timeout,
            cancel: &request.cancel,
            cancel_grace: spec.cancel_grace,
        };
        let run = session.run(&task, &request.output_path, &request.events, limits);
        tokio::pin!(run);
        // Keep answering control messages while the task runs: a Stop must not wait for it.
        let mut stop = None;
        let ran = loop {
            tokio::select! {
                ran = &mut run => break ran,
                control = rx.recv(), if stop.is_none() => {
                    stop = defer(control, pending, unload_after);
                }
            }
            if stop.is_some() {
                break Ran::Answered(Err(TaskError::ShuttingDown {
                    worker: spec.name.clone(),
                }));
            }
        };
        (ran, stop)
    }

    /// After a task (run, or called off once loaded): a oneshot process ends with it (the
    /// worker idle until the next one; a resident that fell back to oneshot unloaded), a
    /// resident one is ready for the next.
    async fn task_ended(&mut self, oneshot_fallback: bool) {
        if !(oneshot_fallback || self.spec.mode == Mode::Oneshot) {
            return self.set_state(WorkerState::Ready, |_| {});
        }
        if let Life::Up(session) = std::mem::replace(&mut self.life, Life::Down { retry_at: None })
        {
            session.finish(self.spec.stop_grace).await;
        }
        let state = if oneshot_fallback {
            WorkerState::Unloaded
        } else {
            WorkerState::Idle
        };
        self.set_state(state, |s| {
            s.pid = None;
            s.process_started = None;
        });
    }
}

impl Actor {
    /// A task whose job was called off before it was sent: counted as cancelled, never run.
    fn called_off(&mut self, request: &TaskRequest) -> Option<TaskError> {
        if !request.cancel.is_cancelled() {
            return None;
        }
        tracing::info!(worker = %self.spec.name, "task called off before it was sent; not run");
        self.status.send_modify(|s| s.tasks_cancelled += 1);
        Some(TaskError::Cancelled {
            worker: self.spec.name.clone(),
            killed: false,
        })
    }
}

/// What a task gets instead of a run.
enum Instead {
    /// This answer (the load's failure, or the client gone).
    Answer(TaskError),
    /// A `Stop` came: the task is answered that the worker is shutting down.
    Stop(Interrupted),
}

impl Instead {
    fn answer(self, reply: Reply, worker: &str) -> Result<(), Interrupted> {
        match self {
            Instead::Answer(error) => {
                let _ = reply.send(Err(error));
                Ok(())
            }
            Instead::Stop(stop) => {
                let _ = reply.send(Err(TaskError::ShuttingDown {
                    worker: worker.to_string(),
                }));
                Err(stop)
            }
        }
    }
}
