//! Runs a job through the configured stages, one worker after another, turning worker events
//! into client events. Each stage sees the audio path and every earlier stage's result.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::protocol::{ClientEvent, StageStatus, WorkerEvent};
use crate::supervisor::Supervisor;
use crate::worker::{JobError, JobRequest};

/// Per-request options handed to every stage.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_speakers: Option<u32>,
    /// Text that primes the ASR (names, spelling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("stage `{stage}`: {source}")]
    Stage { stage: String, source: JobError },
    #[error("unknown stage `{0}`")]
    UnknownStage(String),
    #[error("the client went away; the job was abandoned")]
    Cancelled,
}

impl PipelineError {
    pub fn code(&self) -> &'static str {
        match self {
            PipelineError::Stage { source, .. } => source.code(),
            PipelineError::UnknownStage(_) => "unknown_stage",
            PipelineError::Cancelled => "cancelled",
        }
    }
}

pub struct Pipeline {
    supervisor: Arc<Supervisor>,
}

impl Pipeline {
    pub fn new(supervisor: Arc<Supervisor>) -> Pipeline {
        Pipeline { supervisor }
    }

    /// Runs `stages` in order on the normalized audio at `audio` (inside the job folder `dir`).
    pub async fn run(
        &self,
        dir: &Path,
        audio: &Path,
        duration: f64,
        options: &JobOptions,
        stages: &[String],
        events: &mpsc::Sender<ClientEvent>,
    ) -> Result<Value, PipelineError> {
        let mut results = Map::new();
        let mut timings = Map::new();
        for stage in stages {
            if events.is_closed() {
                return Err(PipelineError::Cancelled);
            }
            let worker = self
                .supervisor
                .get(stage)
                .ok_or_else(|| PipelineError::UnknownStage(stage.clone()))?;
            let mut job = Map::new();
            let audio_path = Value::from(audio.display().to_string());
            job.insert("audio_path".into(), audio_path.clone());
            job.insert("wav_path".into(), audio_path);
            job.insert("duration".into(), duration.into());
            if let Value::Object(opts) = serde_json::to_value(options).unwrap_or_default() {
                job.extend(opts);
            }
            job.insert("results".into(), Value::Object(results.clone()));
            job.insert("_stage".into(), stage.clone().into());

            let _ = events
                .send(ClientEvent::Stage {
                    stage: stage.clone(),
                    status: StageStatus::Started,
                    seconds: None,
                })
                .await;
            let started = Instant::now();
            let (tx, mut rx) = mpsc::channel(1024);
            let cancel = CancellationToken::new();
            let request = JobRequest {
                job,
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
            if cancel.is_cancelled() {
                return Err(PipelineError::Cancelled);
            }
            while let Ok(event) = rx.try_recv() {
                forward(stage, event, events).await;
            }
            let seconds = started.elapsed().as_secs_f64();
            let result = outcome.map_err(|source| PipelineError::Stage {
                stage: stage.clone(),
                source,
            })?;
            let _ = events
                .send(ClientEvent::Stage {
                    stage: stage.clone(),
                    status: StageStatus::Done,
                    seconds: Some(seconds),
                })
                .await;
            timings.insert(stage.clone(), json!(round3(seconds)));
            results.insert(stage.clone(), result);
        }
        Ok(json!({
            "duration": round3(duration),
            "stages": results,
            "timings": timings,
        }))
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
