//! One stage of a job on its worker: the task sent, the worker's events passed on to the client
//! (`tell`, `forward`: never waited for, so a client that stops reading cannot hold the GPU), and
//! the outcome; a stage whose job was called off while it ran is called off, whatever its worker
//! answered.

use std::path::Path;
use std::time::Instant;

use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineError};
use crate::protocol::Task;
use crate::protocol::{ClientEvent, StageStatus, WorkerEvent};
use crate::worker::{TaskError, TaskRequest};

impl Pipeline {
    /// One stage: its events go to the client; the client leaving or `cancel` calls it off.
    pub(super) async fn stage(
        &self,
        dir: &Path,
        stage: &str,
        mut task: Task,
        extra: Option<&Map<String, Value>>,
        events: &mpsc::Sender<ClientEvent>,
        cancel: &CancellationToken,
    ) -> Result<(Value, f64), PipelineError> {
        let worker = self
            .supervisor
            .get(stage)
            .ok_or_else(|| PipelineError::UnknownStage(stage.to_string()))?;
        task.stage = stage.to_string();
        tell(events, stage, StageStatus::Started, None);
        let started = Instant::now();
        let (tx, mut rx) = mpsc::channel(1024);
        let mut fields = task.into_fields();
        fields.extend(
            extra
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let request = TaskRequest {
            task: fields,
            output_path: dir.join(format!("{stage}.result.json")),
            events: tx,
            cancel: cancel.clone(),
        };
        let run = worker.run(request);
        tokio::pin!(run);
        let outcome = loop {
            tokio::select! {
                biased;
                Some(event) = rx.recv() => forward(stage, event, events, dir),
                outcome = &mut run => break outcome,
                // The client went away: free the GPU as soon as the worker allows.
                _ = events.closed(), if !cancel.is_cancelled() => cancel.cancel(),
            }
        };
        while let Ok(event) = rx.try_recv() {
            forward(stage, event, events, dir);
        }
        let seconds = started.elapsed().as_secs_f64();
        // Called off while it ran (another stage failed, or the client left) and finished all
        // the same by a worker that cannot cancel: its result is for nobody, and it is not
        // `done` (a failed job showed a stage done after its failure).
        let outcome = match outcome {
            Ok(_) if cancel.is_cancelled() => Err(TaskError::Cancelled {
                worker: stage.to_string(),
                killed: false,
            }),
            // A result the transcript cannot be built from is the worker's bad output, named
            // here, not an empty transcript later.
            Ok(result) => match crate::transcript::fault(stage, &result) {
                Some(reason) => Err(TaskError::BadOutput {
                    worker: stage.to_string(),
                    reason,
                }),
                None => Ok(result),
            },
            outcome => outcome,
        };
        let result = outcome.map_err(|source| PipelineError::Stage {
            stage: stage.to_string(),
            source,
        })?;
        tell(events, stage, StageStatus::Done, Some(seconds));
        Ok((result, seconds))
    }
}

/// Room in the client's channel kept for `stage` events: progress and log events are dropped
/// before it is touched, so a burst of them (a chatty worker outruns even a prompt reader) cannot
/// crowd out the `started` / `done` that clients and the CLI go by.
const STAGE_EVENT_ROOM: usize = 32;

/// A stage event to the client: into the room `forward` leaves, never waited for.
pub(super) fn tell(
    events: &mpsc::Sender<ClientEvent>,
    stage: &str,
    status: StageStatus,
    seconds: Option<f64>,
) {
    let stage = stage.to_string();
    let _ = events.try_send(ClientEvent::Stage {
        stage,
        status,
        seconds,
    });
}

/// Passes a worker's event on to the client, or drops it when the client is that far behind (256
/// events less `STAGE_EVENT_ROOM`): the job holds the GPU, and a client that stops reading must
/// not hold it too. Only the final event (sent after the GPU is let go) is waited for. A log
/// line names the job folder `<job>`, as the final error does.
fn forward(stage: &str, event: WorkerEvent, events: &mpsc::Sender<ClientEvent>, dir: &Path) {
    let event = match event {
        WorkerEvent::Progress {
            fraction,
            message,
            partial,
        } => ClientEvent::Progress {
            stage: stage.into(),
            fraction,
            message,
            partial,
        },
        WorkerEvent::Log { level, message } => ClientEvent::Log {
            stage: stage.into(),
            line: crate::job::redact(&message, dir),
            level,
        },
    };
    if events.capacity() > STAGE_EVENT_ROOM {
        let _ = events.try_send(event);
    }
}
