//! Runs a job through the configured stages, turning worker events into client events. Stages
//! run one after another, except that a `parallel` group of resident workers runs together; each
//! stage sees the audio path and the result of every stage before its group.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Mode;
use crate::protocol::ErrorCode;
pub use crate::protocol::JobOptions;
use crate::protocol::Task;
use crate::protocol::{ClientEvent, StageStatus, WorkerEvent};
use crate::supervisor::Supervisor;
use crate::worker::{TaskError, TaskRequest};

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("stage `{stage}`: {source}")]
    Stage { stage: String, source: TaskError },
    #[error("unknown stage `{0}`")]
    UnknownStage(String),
    #[error("the client went away; the job was abandoned")]
    Cancelled,
    /// Given up because the stage `by`, running beside it, failed (not the client's doing).
    #[error("stage `{stage}` was called off because stage `{by}` failed")]
    CalledOff { stage: String, by: String },
}

impl PipelineError {
    /// A stage given up because the job's cancel token fired (a sibling failed, or the client).
    fn cancelled(&self) -> bool {
        matches!(
            self,
            PipelineError::Stage {
                source: TaskError::Cancelled { .. },
                ..
            } | PipelineError::CalledOff { .. }
        )
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            PipelineError::Stage { source, .. } => source.code(),
            PipelineError::UnknownStage(_) => ErrorCode::UnknownStage,
            PipelineError::Cancelled => ErrorCode::Cancelled,
            PipelineError::CalledOff { .. } => ErrorCode::CalledOff,
        }
    }
}

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
}

impl Pipeline {
    pub fn new(supervisor: Arc<Supervisor>, parallel: Vec<Vec<String>>) -> Pipeline {
        Pipeline {
            supervisor,
            parallel,
        }
    }

    /// `stages` cut into steps: consecutive stages of one parallel group run together when all
    /// their workers are resident (oneshot workers exist to hold one model at a time).
    pub fn plan(&self, stages: &[String]) -> Vec<Vec<String>> {
        let resident = |stage: &str| {
            self.supervisor
                .get(stage)
                .is_some_and(|w| w.status().mode == Mode::Resident)
        };
        let grouped = |a: &str, b: &str| {
            self.parallel
                .iter()
                .any(|g| g.iter().any(|s| s == a) && g.iter().any(|s| s == b))
        };
        let mut steps: Vec<Vec<String>> = Vec::new();
        for stage in stages {
            match steps.last_mut() {
                Some(step)
                    if resident(stage) && step.iter().all(|s| grouped(s, stage) && resident(s)) =>
                {
                    step.push(stage.clone())
                }
                _ => steps.push(vec![stage.clone()]),
            }
        }
        steps
    }

    /// Runs the job's stages on its normalized audio, step by step (see `plan`). A stage that
    /// fails calls off the others of its step.
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
        let mut results = Map::new();
        let mut timings = Map::new();
        let started = Instant::now();
        for step in self.plan(stages) {
            if events.is_closed() {
                return Err(PipelineError::Cancelled);
            }
            let task = Task {
                audio_path: audio.to_path_buf(),
                wav_path: audio.to_path_buf(),
                duration,
                options: options.clone(),
                results: results.clone(),
                stage: String::new(),
            };

            let cancel = CancellationToken::new();
            let runs = step.iter().map(|stage| {
                let (task, cancel) = (task.clone(), cancel.clone());
                let extra = extra.get(stage);
                async move {
                    let outcome = self.stage(dir, stage, task, extra, events, &cancel).await;
                    if outcome.is_err() {
                        cancel.cancel(); // the step has failed: free the GPU from the others
                    }
                    outcome
                }
            });
            let outcomes = futures_util::future::join_all(runs).await;
            if events.is_closed() {
                return Err(PipelineError::Cancelled);
            }
            // Report the failure that started it all, not the stages it called off.
            let mut failure: Option<PipelineError> = None;
            let mut called_off = Vec::new();
            for (stage, outcome) in step.iter().zip(outcomes) {
                match outcome {
                    Ok((result, seconds)) => {
                        timings.insert(stage.clone(), json!(round3(seconds)));
                        results.insert(stage.clone(), result);
                    }
                    Err(e) if e.cancelled() => called_off.push(stage.clone()),
                    Err(e) => {
                        if failure.is_none() {
                            failure = Some(e);
                        }
                    }
                }
            }
            if let Some(PipelineError::Stage { stage: by, .. }) = &failure {
                for stage in &called_off {
                    let e = PipelineError::CalledOff {
                        stage: stage.clone(),
                        by: by.clone(),
                    };
                    tracing::info!(code = %e.code(), "{e}");
                    let _ = events
                        .send(ClientEvent::Stage {
                            stage: stage.clone(),
                            status: StageStatus::CalledOff,
                            seconds: None,
                        })
                        .await;
                }
            }
            if failure.is_none() && !called_off.is_empty() {
                failure = Some(PipelineError::Cancelled);
            }
            if let Some(e) = failure {
                return Err(e);
            }
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
        let _ = events
            .send(ClientEvent::Stage {
                stage: stage.to_string(),
                status: StageStatus::Started,
                seconds: None,
            })
            .await;
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
                Some(event) = rx.recv() => forward(stage, event, events).await,
                outcome = &mut run => break outcome,
                // The client went away: free the GPU as soon as the worker allows.
                _ = events.closed(), if !cancel.is_cancelled() => cancel.cancel(),
            }
        };
        while let Ok(event) = rx.try_recv() {
            forward(stage, event, events).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        let result = outcome.map_err(|source| PipelineError::Stage {
            stage: stage.to_string(),
            source,
        })?;
        let _ = events
            .send(ClientEvent::Stage {
                stage: stage.to_string(),
                status: StageStatus::Done,
                seconds: Some(seconds),
            })
            .await;
        Ok((result, seconds))
    }
}

async fn forward(stage: &str, event: WorkerEvent, events: &mpsc::Sender<ClientEvent>) {
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
            line: message,
            level,
        },
    };
    let _ = events.send(event).await;
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
