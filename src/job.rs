//! A transcription job from intake to its final event: audio normalized into its own folder,
//! a place in the GPU queue, the pipeline run, and the stream of `ClientEvent`s to whoever asked.
//! The HTTP handler and the local `gpuhost transcribe` share this path.

use std::path::PathBuf;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::audio::{self, AudioError, AudioInfo, Source};
use crate::pipeline::JobOptions;
use crate::protocol::{ClientEvent, OptionsError};
use crate::AppState;

mod fields;
mod folders;

pub use folders::{job_dir, job_dir_for, redact, sweep_stale, temp_dir_usable};

/// A request that passed every check and waits for the GPU. Dropping it removes its folder.
pub struct PreparedJob {
    pub dir: tempfile::TempDir,
    pub audio: PathBuf,
    pub info: AudioInfo,
    pub options: JobOptions,
    pub stages: Vec<String>,
    /// Higher goes first among waiters (nothing running is interrupted).
    pub priority: i32,
    pub kind: JobKind,
}

/// What a job asks of its stages.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum JobKind {
    /// Run the pipeline; the `[speakers] stage` also gets the enrolled voiceprints.
    #[default]
    Transcribe,
    /// Make a voiceprint: the `[speakers] stage` alone, from these `[start, end]` spans (all
    /// the speech it finds when `None`).
    Enroll { segments: Option<Vec<[f64; 2]>> },
}

/// The GPU queue is full: come back later.
#[derive(Debug)]
pub struct QueueFull {
    /// A guess at when a place frees up, from recent job durations.
    pub retry_after_s: u64,
    pub max_queue: usize,
}

impl QueueFull {
    pub fn check(app: &AppState) -> Result<(), QueueFull> {
        if app.queue.waiting() >= app.config.limits.max_queue {
            return Err(QueueFull::now(app));
        }
        Ok(())
    }

    fn now(app: &AppState) -> QueueFull {
        let jobs = app.stats.total();
        let mean_s = if jobs == 0 {
            10.0
        } else {
            app.stats
                .busy_micros
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6
                / jobs as f64
        };
        let ahead = (app.queue.waiting() + app.queue.running()) as f64;
        let slots = app.config.gpu.max_concurrent_jobs.max(1) as f64;
        QueueFull {
            retry_after_s: (mean_s * ahead / slots).ceil().clamp(1.0, 3600.0) as u64,
            max_queue: app.config.limits.max_queue,
        }
    }
}

impl PreparedJob {
    /// Normalizes the upload into `dir`; whatever the upload left in `dir` is deleted afterwards.
    pub async fn from_upload(
        app: &crate::App,
        dir: tempfile::TempDir,
        upload: Source,
        options: JobOptions,
        stages: Vec<String>,
    ) -> Result<PreparedJob, AudioError> {
        let config = &app.config;
        let audio = audio::normalized_path(dir.path());
        let max = config.limits.max_audio_seconds;
        let spilled = matches!(upload, Source::File(_));
        let decode = audio::normalize(
            upload,
            &audio,
            max,
            config.audio.decoder.as_deref(),
            &config.audio.ffmpeg,
            &app.decodes,
        );
        // A shutdown drops the decode (its child is killed with the future) and says so.
        let info = tokio::select! {
            info = decode => info?,
            () = app.stopping.cancelled() => return Err(AudioError::ShuttingDown),
        };
        if spilled || info.decoder == "ffmpeg" {
            // A spilled upload, or the copy made for ffmpeg.
            let _ = std::fs::remove_file(dir.path().join("upload"));
        }
        Ok(PreparedJob {
            dir,
            audio,
            info,
            options,
            stages,
            priority: 0,
            kind: JobKind::Transcribe,
        })
    }
}

/// Stages that work on another's result (the aligner aligns the ASR's words): asked for without
/// it, when the pipeline has it, the request is refused before it waits in the queue.
const WORKS_ON: &[(&str, &str)] = &[("aligner", "asr")];

/// The stages a request runs, in pipeline order: all of them when `requested` is absent or
/// blank, else the named ones (comma-separated), each known, at least one, and none without
/// the stage whose result it works on.
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
    if wanted.is_empty() {
        return Err(format!(
            "`stages` names no stage; name some of {} (comma-separated), or leave it out for all",
            pipeline.join(", ")
        ));
    }
    let in_pipeline = |s: &str| pipeline.iter().any(|p| p == s);
    for (stage, input) in WORKS_ON {
        if wanted.contains(stage) && !wanted.contains(input) && in_pipeline(input) {
            return Err(format!(
                "the `{stage}` stage works on the `{input}` stage's result: ask for both \
                 (stages={input},{stage})"
            ));
        }
    }
    Ok(pipeline
        .iter()
        .filter(|p| wanted.contains(&p.as_str()))
        .cloned()
        .collect())
}

/// Spawns the job: it waits in the queue, runs, and sends events until its final one. The
/// receiver dropping (client gone) makes it leave the queue, or skip the stages not yet started.
/// `Err` when `limits.max_queue` requests wait already.
pub fn start_job(
    app: AppState,
    job: PreparedJob,
) -> Result<mpsc::Receiver<ClientEvent>, QueueFull> {
    let waiter = app
        .queue
        .try_enqueue(
            crate::arbiter::queue::Ticket::job(job.priority),
            app.config.limits.max_queue,
        )
        .ok_or_else(|| QueueFull::now(&app))?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let events = tx.clone();
        let outcome = std::panic::AssertUnwindSafe(run_job(app, job, waiter, events))
            .catch_unwind()
            .await;
        if outcome.is_err() {
            let _ = tx
                .send(ClientEvent::Error {
                    code: crate::protocol::ErrorCode::Internal,
                    message: "the job panicked; see the server log".into(),
                })
                .await;
        }
    });
    Ok(rx)
}

async fn run_job(
    app: AppState,
    job: PreparedJob,
    mut waiter: crate::arbiter::queue::Waiter,
    tx: mpsc::Sender<ClientEvent>,
) {
    let mut last_position = None;
    let permit = loop {
        let position = waiter.position();
        if position.is_some() && position != last_position {
            last_position = position;
            // Not waited for: a client that does not read must not keep its turn from coming.
            let _ = tx.try_send(ClientEvent::Queued {
                position: position.unwrap_or(0),
                waiting_for: app.queue.waiting_for(),
            });
        }
        tokio::select! {
            next = waiter.next() => if let Some(permit) = next { break permit },
            _ = tx.closed() => return, // dropping the waiter leaves the queue
        }
    };
    let started = std::time::Instant::now();
    let extra = fields::stage_fields(&app, &job);
    let input = crate::pipeline::JobInput {
        dir: job.dir.path(),
        audio: &job.audio,
        duration: job.info.seconds,
        options: &job.options,
        stages: &job.stages,
        extra: &extra,
    };
    let outcome = app.pipeline.run(input, &tx).await;
    drop(permit);
    app.stats.record(&outcome, started.elapsed());
    let last = match outcome {
        Ok(result) => ClientEvent::Result {
            result: finish_result(result, &job),
        },
        Err(e) => {
            tracing::warn!(error = %e, "job failed");
            ClientEvent::Error {
                code: e.code(),
                message: redact(&e.to_string(), job.dir.path()),
            }
        }
    };
    let _ = tx.send(last).await;
    drop(job); // removes the job folder
}

/// The request options as every door (HTTP query, OpenAI form, Wyoming) accepts them:
/// [`JobOptions::validated`], then a `language` refused when a stage's loaded model does not
/// know it (its `ready` said which it does) — so a request is never silently answered in English,
/// and is refused before it waits in the queue. A worker not loaded yet is not checked here; its
/// engine refuses the job itself.
pub fn accept_options(
    app: &AppState,
    options: JobOptions,
    stages: &[String],
) -> Result<JobOptions, OptionsError> {
    let options = options.validated(app.config.limits.max_field_bytes)?;
    options_for_stages_run(&options, &app.config.pipeline.stages, stages)?;
    // Already the bare lowercase code (`validated`).
    let language = options.language.as_deref();
    for stage in stages {
        let Some(loaded) = app.supervisor.get(stage).and_then(|w| w.status().loaded) else {
            continue;
        };
        // The stage that says which languages it knows is the ASR.
        let Some(known) = &loaded.languages else {
            continue;
        };
        let model = || loaded.model.clone().unwrap_or_else(|| "its model".into());
        if options.translate && !loaded.translate {
            return Err(OptionsError::CannotTranslate {
                stage: stage.clone(),
                model: model(),
            });
        }
        if let Some(language) = language {
            if !known
                .iter()
                .any(|k| k == "*" || k.eq_ignore_ascii_case(language))
            {
                return Err(OptionsError::UnsupportedLanguage {
                    language: language.to_string(),
                    stage: stage.clone(),
                    model: model(),
                    known: known.clone(),
                });
            }
        }
    }
    Ok(options)
}

/// Options for a stage of the pipeline that the request leaves out are refused, not dropped
/// (`num_speakers` with `stages=asr` would otherwise be silently ignored).
pub fn options_for_stages_run(
    options: &JobOptions,
    pipeline: &[String],
    stages: &[String],
) -> Result<(), OptionsError> {
    let left_out =
        |stage: &str| pipeline.iter().any(|p| p == stage) && !stages.iter().any(|s| s == stage);
    let for_asr = [
        ("language", options.language.is_some()),
        ("prompt", options.prompt.is_some()),
        ("translate", options.translate),
    ];
    let for_diarizer = [
        ("num_speakers", options.num_speakers.is_some()),
        ("min_speakers", options.min_speakers.is_some()),
        ("max_speakers", options.max_speakers.is_some()),
    ];
    for (stage, given) in [("asr", &for_asr), ("diarizer", &for_diarizer)] {
        if let Some((option, _)) = given.iter().find(|(_, set)| *set) {
            if left_out(stage) {
                return Err(OptionsError::StageNotRun {
                    option,
                    stage: stage.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The final result of a job: the merged transcript when the pipeline has an ASR stage (the
/// raw stage results otherwise), plus timings and what the host knows of the audio.
pub fn finish_result(mut result: Value, job: &PreparedJob) -> Value {
    let transcript = result
        .get("stages")
        .and_then(Value::as_object)
        .and_then(crate::transcript::build);
    if let Some(mut transcript) = transcript.and_then(|t| serde_json::to_value(t).ok()) {
        transcript["duration"] = result["duration"].take();
        transcript["timings"] = result["timings"].take();
        transcript["pipeline_seconds"] = result["pipeline_seconds"].take();
        result = transcript;
    }
    result["audio"] = serde_json::json!({
        "decoder": job.info.decoder,
        "source_rate": job.info.source_rate,
        "source_channels": job.info.source_channels,
    });
    result
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
        assert_eq!(
            select_stages(&p, Some(" ")).unwrap(),
            p,
            "blank is not given"
        );
        for none in [",", " , ", ",,"] {
            assert!(select_stages(&p, Some(none))
                .unwrap_err()
                .contains("names no stage"));
        }
        for alone in ["aligner", "diarizer,aligner"] {
            let err = select_stages(&p, Some(alone)).unwrap_err();
            assert!(err.contains("stages=asr,aligner"), "{err}");
        }
        // A pipeline without an asr stage has nothing to refuse for.
        let custom: Vec<String> = ["aligner"].map(String::from).to_vec();
        assert_eq!(select_stages(&custom, Some("aligner")).unwrap(), custom);
    }
}
