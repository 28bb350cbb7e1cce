//! `POST /transcribe`: take the upload, normalize it, wait in the GPU queue, run the pipeline,
//! and stream every step to the client as NDJSON.

use crate::protocol::ErrorCode;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::upload;
use crate::job::{self, start_job, PreparedJob};
use crate::pipeline::JobOptions;
use crate::protocol::ClientEvent;
use crate::render::{render, Format};
use crate::AppState;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TranscribeQuery {
    /// Comma-separated subset of the pipeline's stages (run in pipeline order).
    pub stages: Option<String>,
    pub language: Option<String>,
    #[param(minimum = 1, maximum = 1000)]
    pub num_speakers: Option<u32>,
    #[param(minimum = 1, maximum = 1000)]
    pub min_speakers: Option<u32>,
    #[param(minimum = 1, maximum = 1000)]
    pub max_speakers: Option<u32>,
    pub prompt: Option<String>,
    /// Translate the speech to English instead of transcribing it (a multilingual ASR model
    /// only; as `POST /v1/audio/translations`).
    pub translate: Option<bool>,
    /// Higher goes first among requests waiting for the GPU (default 0); nothing running is
    /// interrupted.
    pub priority: Option<i32>,
    /// Answer with the finished transcript in this format instead of the NDJSON stream.
    pub format: Option<Format>,
}

impl TranscribeQuery {
    /// The query's request options, unchecked ([`JobOptions::validated`] checks them).
    fn options(&self) -> JobOptions {
        JobOptions {
            language: self.language.clone(),
            num_speakers: self.num_speakers,
            min_speakers: self.min_speakers,
            max_speakers: self.max_speakers,
            prompt: self.prompt.clone(),
            translate: self.translate.unwrap_or(false),
        }
    }
}

/// Transcribe audio: an NDJSON stream of progress events ending in `result` or `error`, or with
/// `?format=` the finished document.
#[utoipa::path(
    post,
    path = "/transcribe",
    params(TranscribeQuery),
    request_body(
        description = "The audio: the raw body (any type), or multipart/form-data with field `file`",
        content(
            (Vec<u8> = "application/octet-stream"),
            (super::openapi::AudioForm = "multipart/form-data"),
        ),
    ),
    responses(
        (status = 200, description = "NDJSON events (`ClientEvent`, one per line), or the document for `?format=`", content(
            (String = "application/x-ndjson"),
            (Object = "application/json"),
            (String = "text/plain"),
            (String = "application/x-subrip"),
            (String = "text/vtt"),
        )),
        (status = 400, description = "Bad query or body; with `?format=`, also a worker's refusal (a language its model lacks, when it was not loaded to be asked before)", body = super::error::ErrorBody),
        (status = 401, description = "Token missing or wrong", body = super::error::ErrorBody),
        (status = 403, description = "Foreign Host or a cross-site request", body = super::error::ErrorBody),
        (status = 408, description = "The body stalled", body = super::error::ErrorBody),
        (status = 413, description = "Upload, field or audio too large", body = super::error::ErrorBody),
        (status = 415, description = "Not decodable as audio, or a refused format", body = super::error::ErrorBody),
        (status = 429, description = "The GPU queue is full (see Retry-After)", body = super::error::ErrorBody),
        (status = 507, description = "The temp dir's disk has no room (limits.min_free_bytes), or (`?format=` only) a worker's disk was full", body = super::error::ErrorBody),
        (status = 500, description = "Internal error (e.g. the job folder cannot be created), or (`?format=` only) a worker failed on the job (`job_failed`)", body = super::error::ErrorBody),
        (status = 502, description = "`?format=` only: a worker crashed or wrote bad output", body = super::error::ErrorBody),
        (status = 503, description = "`?format=` only: a worker is unavailable, or the host is shutting down", body = super::error::ErrorBody),
        (status = 504, description = "`?format=` only: a worker timed out", body = super::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(super) async fn transcribe(
    State(app): State<AppState>,
    query: Result<Query<TranscribeQuery>, QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::unparsed("query", e.body_text()))?;
    let format = query.format;
    let priority = query.priority.unwrap_or(0);
    // Refused here, the upload is still unread: the `drain` layer reads it after the error
    // goes out, so a client still sending it can read why.
    let stages = job::select_stages(&app.config.pipeline.stages, query.stages.as_deref())
        .map_err(ApiError::bad_request)?;
    // Refuse before taking the upload when the queue is full already.
    job::QueueFull::check(&app, Some(&stages)).map_err(|full| ApiError::queue_full(&full))?;
    let mut job = prepare(&app, query, stages, request).await?;
    job.priority = priority;
    let heartbeat = std::time::Duration::from_secs_f64(app.config.http.heartbeat_s);
    let events = start_job(app, job).map_err(|full| ApiError::queue_full(&full))?;
    match format {
        None => Ok(super::ndjson::from_channel(events, heartbeat)),
        Some(format) => {
            let result = final_result(events).await?;
            Ok((
                [(header::CONTENT_TYPE, format.content_type())],
                render(&result, format),
            )
                .into_response())
        }
    }
}

/// Waits for the final event: the result, or the job's error as an HTTP error.
pub(super) async fn final_result(
    mut events: mpsc::Receiver<ClientEvent>,
) -> Result<serde_json::Value, ApiError> {
    while let Some(event) = events.recv().await {
        match event {
            ClientEvent::Result { result } => return Ok(result),
            ClientEvent::Error { code, message } => return Err(job_error(code, message)),
            _ => {}
        }
    }
    Err(ApiError::internal("the job ended without a result"))
}

/// The HTTP error for a job that failed after it was accepted (status from `ErrorCode`).
pub(super) fn job_error(code: ErrorCode, message: String) -> ApiError {
    let status = axum::http::StatusCode::from_u16(code.http_status())
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    ApiError::new(status, code.as_str(), message)
}

/// Validates options, stores and decodes the upload of a job of `stages`. All client mistakes
/// surface here (or in selecting the stages), as HTTP errors, before anything is queued.
pub(super) async fn prepare(
    app: &AppState,
    query: TranscribeQuery,
    stages: Vec<String>,
    request: Request,
) -> Result<PreparedJob, ApiError> {
    let limits = upload::BodyLimits::from_config(&app.config);
    if let Some(format) = query.format {
        crate::render::fits(format, &stages).map_err(ApiError::bad_request)?;
    }
    let options = job::accept_options(app, query.options(), &stages)?;
    let folder_error = |e: std::io::Error| ApiError::job_folder(&e);
    // A body that may spill to disk needs its folder first; one declared small stays in memory,
    // and its folder is chosen once it is known (see `job::job_dir_for`).
    let early = match upload::declared_length(request.headers()) {
        Some(n) if n <= upload::SPILL_BYTES as u64 => None,
        _ => Some(job::job_dir(&app.config).map_err(folder_error)?),
    };
    let spill = early.as_ref().map(|dir| dir.path().join("upload"));
    let source = upload::receive(request, spill.as_deref(), limits)
        .await
        .map_err(|e| match &early {
            Some(dir) => e.redact(dir.path()),
            None => e,
        })?;
    let dir = match early {
        Some(dir) => dir,
        None => job::job_dir_for(&app.config, &source).map_err(folder_error)?,
    };
    let dir_path = dir.path().to_path_buf();
    PreparedJob::from_upload(app, dir, source, options, stages)
        .await
        .map_err(|e| ApiError::from(e).redact(&dir_path))
}
