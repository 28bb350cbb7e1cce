//! A transcription job from intake to its final event: audio normalized into its own folder,
//! a place in the GPU queue, the pipeline run, and the stream of `ClientEvent`s to whoever asked.
//! The HTTP handler and the local `gpuhost transcribe` share this path.

use std::path::PathBuf;

use futures_util::FutureExt;
use tokio::sync::mpsc;

use crate::audio::{self, AudioError, AudioInfo, Source};
use crate::pipeline::JobOptions;
use crate::protocol::ClientEvent;
use crate::{AppState, Config};

/// A request that passed every check and waits for the GPU. Dropping it removes its folder.
pub struct PreparedJob {
    pub dir: tempfile::TempDir,
    pub audio: PathBuf,
    pub info: AudioInfo,
    pub options: JobOptions,
    pub stages: Vec<String>,
}

/// A fresh job folder under the system temp dir.
pub fn job_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("gpuhost-job-").tempdir()
}

impl PreparedJob {
    /// Normalizes the upload into `dir`; whatever the upload left in `dir` is deleted afterwards.
    pub async fn from_upload(
        config: &Config,
        dir: tempfile::TempDir,
        upload: Source,
        options: JobOptions,
        stages: Vec<String>,
    ) -> Result<PreparedJob, AudioError> {
        let audio = audio::normalized_path(dir.path());
        let max = config.limits.max_audio_seconds;
        let info = audio::normalize(upload, &audio, max, &config.audio.ffmpeg).await?;
        // A spilled upload, or the copy made for ffmpeg.
        let _ = std::fs::remove_file(dir.path().join("upload"));
        Ok(PreparedJob {
            dir,
            audio,
            info,
            options,
            stages,
        })
    }
}

pub fn select_stages(pipeline: &[String], requested: Option<&str>) -> Result<Vec<String>, String> {
    let Some(requested) = requested.filter(|s| !s.trim().is_empty()) else {
        return Ok(pipeline.to_vec());
    };
    let wanted: Vec<&str> = requested
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(unknown) = wanted.iter().find(|w| !pipeline.iter().any(|p| p == *w)) {
        return Err(format!(
            "unknown stage `{unknown}`; this server's pipeline is: {}",
            pipeline.join(", ")
        ));
    }
    Ok(pipeline
        .iter()
        .filter(|p| wanted.contains(&p.as_str()))
        .cloned()
        .collect())
}

pub fn check_speakers(o: &JobOptions) -> Result<(), String> {
    if o.num_speakers == Some(0) || o.min_speakers == Some(0) || o.max_speakers == Some(0) {
        return Err("speaker counts must be at least 1".into());
    }
    if let (Some(min), Some(max)) = (o.min_speakers, o.max_speakers) {
        if min > max {
            return Err(format!(
                "min_speakers ({min}) is above max_speakers ({max})"
            ));
        }
    }
    Ok(())
}

/// Spawns the job: it waits in the queue, runs, and sends events until its final one. The
/// receiver dropping (client gone) makes it leave the queue, or skip the stages not yet started.
pub fn start_job(app: AppState, job: PreparedJob) -> mpsc::Receiver<ClientEvent> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let events = tx.clone();
        let outcome = std::panic::AssertUnwindSafe(run_job(app, job, events))
            .catch_unwind()
            .await;
        if outcome.is_err() {
            let _ = tx
                .send(ClientEvent::Error {
                    code: "internal".into(),
                    message: "the job panicked; see the server log".into(),
                })
                .await;
        }
    });
    rx
}

async fn run_job(app: AppState, job: PreparedJob, tx: mpsc::Sender<ClientEvent>) {
    let mut waiter = app.queue.enqueue();
    let mut last_position = None;
    let permit = loop {
        let position = waiter.position();
        if position.is_some() && position != last_position {
            last_position = position;
            let _ = tx
                .send(ClientEvent::Queued {
                    position: position.unwrap_or(0),
                })
                .await;
        }
        tokio::select! {
            next = waiter.next() => if let Some(permit) = next { break permit },
            _ = tx.closed() => return, // dropping the waiter leaves the queue
        }
    };
    let started = std::time::Instant::now();
    let outcome = app
        .pipeline
        .run(
            job.dir.path(),
            &job.audio,
            job.info.seconds,
            &job.options,
            &job.stages,
            &tx,
        )
        .await;
    drop(permit);
    app.stats.record(&outcome, started.elapsed());
    let last = match outcome {
        Ok(result) => ClientEvent::Result {
            result: app.finish_result(result, &job),
        },
        Err(e) => {
            tracing::warn!(error = %e, "job failed");
            ClientEvent::Error {
                code: e.code().into(),
                message: e.to_string(),
            }
        }
    };
    let _ = tx.send(last).await;
    drop(job); // removes the job folder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_keep_pipeline_order() {
        let p: Vec<String> = ["diarizer", "asr", "aligner"].map(String::from).to_vec();
        assert_eq!(
            select_stages(&p, Some("aligner,asr")).unwrap(),
            ["asr", "aligner"]
        );
        assert_eq!(select_stages(&p, None).unwrap(), p);
        let err = select_stages(&p, Some("asr,ocr")).unwrap_err();
        assert!(err.contains("`ocr`"));
    }
}
