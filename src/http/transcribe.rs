//! `POST /transcribe`: take the upload, normalize it, wait in the GPU queue, run the pipeline,
//! and stream every step to the client as NDJSON.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::header;
use axum::response::Response;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::upload;
use crate::job::{self, start_job, PreparedJob};
use crate::pipeline::JobOptions;
use crate::protocol::ClientEvent;
use crate::AppState;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscribeQuery {
    /// Comma-separated subset of the pipeline's stages (run in pipeline order).
    pub stages: Option<String>,
    pub language: Option<String>,
    pub num_speakers: Option<u32>,
    pub min_speakers: Option<u32>,
    pub max_speakers: Option<u32>,
}

pub async fn transcribe(
    State(app): State<AppState>,
    query: Result<Query<TranscribeQuery>, QueryRejection>,
    request: Request,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let job = prepare(&app, query, request).await?;
    Ok(ndjson_response(start_job(app, job)))
}

/// Validates options, stores and decodes the upload. All client mistakes surface here, as
/// HTTP errors, before anything is queued.
pub async fn prepare(
    app: &AppState,
    query: TranscribeQuery,
    request: Request,
) -> Result<PreparedJob, ApiError> {
    let stages = job::select_stages(&app.config.pipeline.stages, query.stages.as_deref())
        .map_err(ApiError::bad_request)?;
    let options = JobOptions {
        language: query.language.filter(|l| !l.is_empty()),
        num_speakers: query.num_speakers,
        min_speakers: query.min_speakers,
        max_speakers: query.max_speakers,
    };
    job::check_speakers(&options).map_err(ApiError::bad_request)?;
    let dir = job::job_dir()
        .map_err(|e| ApiError::internal(format!("cannot create a job folder: {e}")))?;
    let source = upload::receive(
        request,
        &dir.path().join("upload"),
        app.config.limits.max_upload_bytes,
    )
    .await?;
    Ok(PreparedJob::from_upload(&app.config, dir, source, options, stages).await?)
}

/// An NDJSON response that flushes each event as it happens.
pub fn ndjson_response(rx: mpsc::Receiver<ClientEvent>) -> Response {
    let stream = ReceiverStream::new(rx)
        .map(|event| Ok::<_, Infallible>(bytes::Bytes::from(event.to_line())));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .expect("static headers are valid")
}
