//! Runs a job through the configured stages, turning worker events into client events. A stage
//! starts once the stages it needs are done (every earlier one, but the others of its `parallel`
//! group, unless `needs` names fewer), beside the others running when all are resident; each
//! stage sees the audio path and the results of the stages done by then.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Mode;
pub use crate::protocol::JobOptions;
use crate::protocol::Task;
use crate::protocol::{ClientEvent, StageStatus, WorkerEvent};
use crate::supervisor::Supervisor;
use crate::worker::TaskRequest;

mod error;
mod order;
pub use error::PipelineError;
use order::first_to_refuse;

/// What a job gives the pipeline.
pub struct JobInput<'a> {
    /// The job folder.
    pub dir: &'a Path,
    /// The normalized audio in it.
    pub audio: &'a Path,
    pub duration: f64,
    pub options: &'a JobOptions,
    pub stages: &'a [String],
    /// Task fields for one stage only, by stage (the voiceprints for the diarizer; an
    /// enrolment's `action`).
    pub extra: &'a HashMap<String, Map<String, Value>>,
}

pub struct Pipeline {
    supervisor: Arc<Supervisor>,
    /// Groups of consecutive stages that may run at the same time (config `[pipeline] parallel`).
    parallel: Vec<Vec<String>>,
    /// The earlier stages a stage waits for, where not all of them (config `[pipeline] needs`).
    needs: BTreeMap<String, Vec<String>>,
}

/// Where a stage of a running job is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StageState {
    Waiting,
    Running,
    Done,
    /// Failed or called off: what needs it never starts.
    Ended,
}

impl Pipeline {
    pub fn new(
        supervisor: Arc<Supervisor>,
        parallel: Vec<Vec<String>>,
        needs: BTreeMap<String, Vec<String>>,
    ) -> Pipeline {
        Pipeline {
            supervisor,
            parallel,
            needs,
        }
    }

    /// For each of `stages`, the earlier ones it waits for (indices): those `needs` names, or
    /// else every earlier stage but the others of its parallel group.
    pub fn needs(&self, stages: &[String]) -> Vec<Vec<usize>> {
        let grouped = |a: &str, b: &str| {
            self.parallel
                .iter()
                .any(|g| g.iter().any(|s| s == a) && g.iter().any(|s| s == b))
        };
        stages
            .iter()
            .enumerate()
            .map(|(i, stage)| {
                let earlier = 0..i;
                match self.needs.get(stage) {
                    Some(named) => earlier.filter(|&j| named.contains(&stages[j])).collect(),
                    None => earlier.filter(|&j| !grouped(&stages[j], stage)).collect(),
                }
            })
            .collect()
    }

    fn resident(&self, stage: &str) -> bool {
        self.supervisor
            .get(stage)
            .is_some_and(|w| w.status().mode == Mode::Resident)
    }

    /// Runs the job's stages on its normalized audio. A stage starts once the stages it needs
    /// (see `needs`) are done, beside the others running if it and they are all resident
    /// (oneshot workers exist to hold one model at a time), and sees the results of every stage
    /// done by then. A stage that fails calls off the others running and ends the job. Of the
    /// stages ready at once, the ASR goes first when the request names a language or asks for a
    /// translation (its worker may refuse them; `pipeline/order.rs`).
    pub async fn run(
        &self,
        job: JobInput<'_>,
        events: &mpsc::Sender<ClientEvent>,
    ) -> Result<Value, PipelineError> {
        let JobInput {
            dir,
            audio,
            duration,
            options,
            stages,
            extra,
        } = job;
        let needs = self.needs(stages);
        let order = first_to_refuse(stages, options);
        let resident: Vec<bool> = stages.iter().map(|s| self.resident(s)).collect();
        let mut progress = vec![StageState::Waiting; stages.len()];
        let mut results = Map::new();
        let mut timings = Map::new();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let mut running = FuturesUnordered::new();
        // The failure that started it all, not the stages it called off.
        let mut failure: Option<PipelineError> = None;
        let mut called_off = Vec::new();
        loop {
            if events.is_closed() {
                cancel.cancel();
            }
            for &i in &order {
                let ready = progress[i] == StageState::Waiting
                    && needs[i].iter().all(|&j| progress[j] == StageState::Done);
                let running_now = (0..stages.len()).filter(|&j| progress[j] == StageState::Running);
                let beside = running_now.clone().all(|j| resident[j] && resident[i]);
                if !ready || !beside || failure.is_some() || cancel.is_cancelled() {
                    continue;
                }
                progress[i] = StageState::Running;
                let task = Task {
                    audio_path: audio.to_path_buf(),
                    wav_path: audio.to_path_buf(),
                    duration,
                    options: options.clone(),
                    results: results.clone(),
                    stage: String::new(),
                };
                let (stage, extra, cancel) = (&stages[i], extra.get(&stages[i]), cancel.clone());
                running.push(async move {
                    let outcome = self.stage(dir, stage, task, extra, events, &cancel).await;
                    if outcome.is_err() {
                        cancel.cancel(); // the job has failed: free the GPU from the others
                    }
                    (i, outcome)
                });
            }
            let Some((i, outcome)) = running.next().await else {
                break;
            };
            let stage = &stages[i];
            progress[i] = match outcome {
                Ok(_) => StageState::Done,
                Err(_) => StageState::Ended,
            };
            match outcome {
                Ok((result, seconds)) => {
                    timings.insert(stage.clone(), json!(round3(seconds)));
                    results.insert(stage.clone(), result);
                }
                Err(e) if e.cancelled() => called_off.push(stage.clone()),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if events.is_closed() {
            return Err(PipelineError::Cancelled);
        }
        if let Some(PipelineError::Stage { stage: by, .. }) = &failure {
            for stage in &called_off {
                let e = PipelineError::CalledOff {
                    stage: stage.clone(),
                    by: by.clone(),
                };
                tracing::info!(code = %e.code(), "{e}");
                tell(events, stage, StageStatus::CalledOff, None);
            }
        }
        if failure.is_none() && !called_off.is_empty() {
            failure = Some(PipelineError::Cancelled);
        }
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(json!({
            "duration": round3(duration),
            "stages": results,
            "timings": timings,
            "pipeline_seconds": round3(started.elapsed().as_secs_f64()),
        }))
    }

    /// One stage: its events go to the client; the client leaving or `cancel` calls it off.
    async fn stage(
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
fn tell(
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

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
