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
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::Mode;
pub use crate::protocol::JobOptions;
use crate::protocol::Task;
use crate::protocol::{ClientEvent, StageStatus};
use crate::supervisor::Supervisor;

mod error;
mod order;
mod stage;
pub use error::PipelineError;
use order::first_to_refuse;
use stage::tell;

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
    ///
    /// A failure while other stages still run is also sent on `failed` at once, their
    /// `called_off` told first: the client hears it then (a worker that cannot cancel may take
    /// its task's whole time), while the job keeps the GPU until they have ended.
    pub async fn run(
        &self,
        job: JobInput<'_>,
        events: &mpsc::Sender<ClientEvent>,
        failed: oneshot::Sender<PipelineError>,
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
        // Told `called_off` already, with the early failure.
        let mut told: Vec<String> = Vec::new();
        let mut failed = Some(failed);
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
                    let others = (0..stages.len()).filter(|&j| progress[j] == StageState::Running);
                    let others: Vec<&String> = others.map(|j| &stages[j]).collect();
                    if let (None, false, Some(early)) = (&failure, others.is_empty(), failed.take())
                    {
                        for stage in others {
                            call_off(events, stage, &e);
                            told.push(stage.clone());
                        }
                        let _ = early.send(e.clone());
                    }
                    failure.get_or_insert(e);
                }
            }
        }
        // The client left: cancelled, unless a stage failed of itself (a crash is counted as
        // one, whoever still listens).
        if events.is_closed() && failure.is_none() {
            return Err(PipelineError::Cancelled);
        }
        if let Some(failure) = &failure {
            for stage in called_off.iter().filter(|s| !told.contains(s)) {
                call_off(events, stage, failure);
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
}

/// Tells the client that `stage` is called off because of `failure` (another stage's).
fn call_off(events: &mpsc::Sender<ClientEvent>, stage: &str, failure: &PipelineError) {
    if let PipelineError::Stage { stage: by, .. } = failure {
        let e = PipelineError::CalledOff {
            stage: stage.to_string(),
            by: by.clone(),
        };
        tracing::info!(code = %e.code(), "{e}");
        tell(events, stage, StageStatus::CalledOff, None);
    }
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
