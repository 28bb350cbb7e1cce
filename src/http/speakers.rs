//! `/speakers`: enrol a voice from a few seconds of its speech (or from one speaker of a finished
//! transcript), list the enrolled voices, delete one for good. Enrolment is a GPU job of the
//! `[speakers] stage` through the same queue as every other.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::error::{ApiError, ErrorBody, PathName};
use super::transcribe::final_result;
use super::upload;
use crate::audio::Source;
use crate::job::{start_job, JobKind};
use crate::pipeline::JobOptions;
use crate::speakers::{self, SpeakerError};
use crate::AppState;

mod segments;

/// A finished transcript may be sent back whole to enrol one of its speakers.
const TRANSCRIPT_MAX: usize = 16 * 1024 * 1024;

impl From<SpeakerError> for ApiError {
    fn from(e: SpeakerError) -> ApiError {
        let status = match &e {
            SpeakerError::BadName(_) => StatusCode::BAD_REQUEST,
            SpeakerError::NotFound(_) | SpeakerError::NotYet(_) => StatusCode::NOT_FOUND,
            SpeakerError::Full { .. }
            | SpeakerError::OtherModel { .. }
            | SpeakerError::DeletedMeanwhile(_) => StatusCode::CONFLICT,
            SpeakerError::BadVoiceprint { .. } => StatusCode::BAD_GATEWAY,
            SpeakerError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let code = match &e {
            SpeakerError::BadName(_) => "bad_request",
            SpeakerError::NotFound(_) | SpeakerError::NotYet(_) => "not_found",
            SpeakerError::Full { .. }
            | SpeakerError::OtherModel { .. }
            | SpeakerError::DeletedMeanwhile(_) => "conflict",
            SpeakerError::BadVoiceprint { .. } => "bad_output",
            SpeakerError::Io(_) => "internal",
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// Multipart form of `POST /speakers`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documentation only: the handler streams the form itself
pub(super) struct EnrollForm {
    /// The voice's name (Korean and every other script welcome; not `SPEAKER_…`).
    name: String,
    /// Audio with the voice in it: a few seconds of it alone (5–30 s is best).
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// JSON `[[start, end], …]` seconds where the voice speaks; default: all the speech.
    segments: Option<String>,
    /// A finished transcript of this audio (the JSON `result`); with `speaker`.
    transcript: Option<String>,
    /// The transcript's label of the voice (`SPEAKER_01`): its turns are the segments.
    speaker: Option<String>,
}

#[derive(Default)]
struct Form {
    name: Option<String>,
    file: Option<Source>,
    segments: Option<String>,
    transcript: Option<String>,
    speaker: Option<String>,
}

/// Enrol a voice, or add a sample to one: answers the voice once the worker has made its
/// voiceprint.
#[utoipa::path(post, path = "/speakers",
    request_body(content = EnrollForm, content_type = "multipart/form-data"),
    responses(
        (status = 201, description = "The voice: name, model, samples, seconds of speech", body = Object),
        (status = 400, description = "Bad name, segments or transcript, a form field given twice, or the worker refused the sample (too little speech to learn the voice from)", body = ErrorBody),
        (status = 408, description = "The upload stalled (http.body_idle_timeout_s) or came too slowly", body = ErrorBody),
        (status = 409, description = "Too many voices, another model, or no stage makes voiceprints", body = ErrorBody),
        (status = 413, description = "Upload or field too large", body = ErrorBody),
        (status = 415, description = "Not decodable as audio", body = ErrorBody),
        (status = 429, description = "The GPU queue is full", body = ErrorBody),
        (status = 507, description = "The temp dir's disk has no room (limits.min_free_bytes), or the worker's disk was full", body = ErrorBody),
        (status = 500, description = "The voice could not be written to the state folder, or the worker failed on the sample (`job_failed`)", body = ErrorBody),
        (status = 502, description = "The worker crashed or answered without a voiceprint", body = ErrorBody),
        (status = 503, description = "The worker is unavailable", body = ErrorBody),
        super::openapi::GuardErrors,
    ),
    security(("bearer" = [])))]
pub(super) async fn enroll(
    State(app): State<AppState>,
    request: Request,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let stage = voiceprint_stage(&app)?;
    // Before the body: a DELETE of this name while the upload still comes in must win too.
    let enrolment = app.speakers.enrolment();
    let (intake, request) = upload::FormIntake::begin(&app, request, std::slice::from_ref(&stage))?;
    let form = read_form(request, intake.dir(), intake.limits.max_bytes, &app)
        .await
        .map_err(|e| intake.failed(e))?;
    let name = speakers::check_name(form.name.as_deref().unwrap_or(""))?;
    let cfg = &app.config.speakers;
    app.speakers.check_room(&name, cfg.max_voices)?;
    // Up to 16 MiB of JSON to read (its spans only are kept: about its size in memory) and intersect:
    // not on a runtime thread, and no more at once than audio decodes.
    let (given, transcript, speaker) = (form.segments, form.transcript, form.speaker);
    let turn = app
        .decodes
        .acquire()
        .await
        .map_err(|_| ApiError::internal("the server is stopping"))?;
    let segments::Spans {
        spans: segments,
        transcribed_s,
    } = tokio::task::spawn_blocking(move || {
        segments::segments_of(given.as_deref(), transcript.as_deref(), speaker.as_deref())
    })
    .await
    .map_err(|e| ApiError::internal(format!("reading the segments failed: {e}")))??;
    drop(turn); // before the audio's decode takes one
    let file = form
        .file
        .ok_or_else(|| ApiError::bad_request("the multipart field `file` is missing"))?;
    let mut prepared = intake
        .into_job(&app, file, JobOptions::default(), vec![stage.clone()])
        .await?;
    let duration = prepared.info.seconds;
    // Another recording's transcript would teach the voice of whoever talks there at those
    // times. (Re-encoded, the same recording may gain or lose a few frames.)
    if let Some(transcribed) = transcribed_s.filter(|t| (t - duration).abs() > SAME_RECORDING_S) {
        return Err(ApiError::bad_request(format!(
            "the transcript is of a recording of {transcribed:.2} s and this audio is \
             {duration:.2} s: send the audio that was transcribed"
        )));
    }
    if let Some([start, _]) = segments
        .iter()
        .flatten()
        .find(|[start, _]| *start >= duration)
    {
        return Err(ApiError::bad_request(format!(
            "a segment starts at {start} s, past the end of the audio ({duration:.2} s)"
        )));
    }
    // One that runs past the end is taken to the end (an end of 1e308 reached the worker).
    let segments = segments.map(|spans| {
        spans
            .into_iter()
            .map(|[start, end]| [start, end.min(duration)])
            .collect()
    });
    prepared.kind = JobKind::Enroll { segments };
    let events = start_job(app.clone(), prepared).map_err(|full| ApiError::queue_full(&full))?;
    let result = final_result(events).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (model, sample) =
        match speakers::sample_of(&stage, &result["stages"][&stage], now, duration) {
            Ok(made) => made,
            Err(e) => {
                // A worker that was not loaded when the request came may turn out to make none.
                voiceprint_stage(&app)?;
                return Err(e.into());
            }
        };
    // The voice's file is written and fsynced on a blocking thread, not the runtime's.
    let limits = (cfg.max_voices, cfg.max_samples);
    let store = app.clone();
    let kept = name.clone();
    let voice = tokio::task::spawn_blocking(move || {
        store
            .speakers
            .add(&kept, &model, sample, &enrolment, limits)
    })
    .await
    .map_err(|e| ApiError::internal(format!("enrolment stopped: {e}")))??;
    tracing::info!(%name, "voice enrolled");
    Ok((StatusCode::CREATED, Json(voice)))
}

/// The enrolled voices (never their voiceprints).
#[utoipa::path(get, path = "/speakers", responses(
    (status = 200, description = "`{speakers: [{name, model, samples, seconds, created, updated}]}`", body = Object),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn list(State(app): State<AppState>) -> Json<Value> {
    Json(json!({ "speakers": app.speakers.list(), "threshold": app.config.speakers.threshold }))
}

/// Forget a voice: its file is removed, and later jobs no longer name anyone after it.
#[utoipa::path(delete, path = "/speakers/{name}", params(("name" = String, Path, description = "The voice's name (URL-encoded)")), responses(
    (status = 200, description = "Deleted", body = Object),
    (status = 400, description = "The name is not valid UTF-8 once decoded", body = ErrorBody),
    (status = 404, description = "No voice of that name", body = ErrorBody),
    (status = 500, description = "Its file could not be removed", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn delete(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Json<Value>, ApiError> {
    let name = speakers::normal_name(&name);
    let store = app.clone();
    let gone = name.clone();
    tokio::task::spawn_blocking(move || store.speakers.delete(&gone))
        .await
        .map_err(|e| ApiError::internal(format!("deletion stopped: {e}")))??;
    tracing::info!(%name, "voice deleted");
    Ok(Json(json!({ "deleted": name })))
}

/// The stage that makes voiceprints, when the pipeline has it and its worker (once loaded) says
/// it does.
fn voiceprint_stage(app: &AppState) -> Result<String, ApiError> {
    let stage = app.config.speakers.stage.clone();
    let conflict = |why: String| ApiError::new(StatusCode::CONFLICT, "conflict", why);
    if !app.config.pipeline.stages.contains(&stage) {
        return Err(conflict(format!(
            "[speakers] stage `{stage}` is not in this server's pipeline ({}); voices cannot be enrolled",
            app.config.pipeline.stages.join(", ")
        )));
    }
    let loaded = app.supervisor.get(&stage).and_then(|w| w.status().loaded);
    if loaded.is_some_and(|l| l.voiceprints.is_none()) {
        return Err(conflict(format!(
            "the `{stage}` worker's engine does not make voiceprints (its `ready` did not say \
             `voiceprints`); use the packaged diarizer"
        )));
    }
    Ok(stage)
}

/// How far the length of the audio sent may be from the transcript's recording's.
const SAME_RECORDING_S: f64 = 0.5;

async fn read_form(
    request: Request,
    dir: &std::path::Path,
    limit: u64,
    app: &AppState,
) -> Result<Form, ApiError> {
    let mut fields = upload::Form::open(request).await?;
    let max_field = app.config.limits.max_field_bytes;
    let mut form = Form::default();
    let mut given = upload::Given::default();
    while let Some(field) = fields.next().await? {
        let name = field.name().unwrap_or("").to_string();
        given.first(&name)?;
        match name.as_str() {
            "file" => form.file = Some(upload::collect_field(field, &dir.join("upload"), limit, app.config.limits.min_free_bytes).await?),
            "transcript" => {
                form.transcript = Some(upload::text_field(field, &name, TRANSCRIPT_MAX, "the most a transcript may be").await?)
            }
            "segments" => {
                form.segments = Some(upload::text_field(field, &name, TRANSCRIPT_MAX, "the most a transcript may be").await?)
            }
            "name" => form.name = Some(upload::text_field(field, &name, max_field, "limits.max_field_bytes").await?),
            "speaker" => form.speaker = Some(upload::text_field(field, &name, max_field, "limits.max_field_bytes").await?),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown form field `{other}`; POST /speakers takes name, file, segments, transcript, speaker"
                )))
            }
        }
    }
    Ok(form)
}
