//! Receives an upload (raw body or multipart field `file`), enforcing the size limit while
//! streaming so an oversized upload is refused without being buffered. Uploads up to
//! `SPILL_BYTES` stay in memory; larger ones are written to `spill` as they arrive.

use std::path::Path;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::error::ApiError;
use crate::audio::Source;

/// Uploads larger than this are streamed to a file instead of kept in memory.
pub const SPILL_BYTES: usize = 8 * 1024 * 1024;

/// Receives the upload; `spill` is where a large one goes.
pub async fn receive(request: Request, spill: &Path, limit: u64) -> Result<Source, ApiError> {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large("the request body", limit));
    }
    let is_multipart = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !is_multipart {
        let stream = Body::into_data_stream(request.into_body());
        return collect(stream, spill, limit)
            .await
            .map_err(|e| e.into_api(limit));
    }
    let mut multipart = Multipart::from_request(request, &())
        .await
        .map_err(|e| ApiError::bad_request(format!("invalid multipart body: {}", e.body_text())))?;
    loop {
        let field = multipart.next_field().await.map_err(|e| {
            ApiError::bad_request(format!("invalid multipart body: {}", e.body_text()))
        })?;
        let Some(field) = field else {
            return Err(ApiError::bad_request(
                "the multipart body has no field `file`: send the audio as `file`",
            ));
        };
        if field.name() == Some("file") {
            return collect(field, spill, limit)
                .await
                .map_err(|e| e.into_api(limit));
        }
    }
}

/// Receives one multipart field (the `file` of a form) with the same limits as `receive`.
pub async fn collect_field(
    field: axum::extract::multipart::Field<'_>,
    spill: &Path,
    limit: u64,
) -> Result<Source, ApiError> {
    collect(field, spill, limit)
        .await
        .map_err(|e| e.into_api(limit))
}

fn too_large(what: &str, limit: u64) -> ApiError {
    ApiError::too_large(format!(
        "{what} exceeds the upload limit of {limit} bytes (limits.max_upload_bytes)"
    ))
}

enum WriteError {
    TooLarge,
    Body(String),
    Io(std::io::Error),
}

impl WriteError {
    fn into_api(self, limit: u64) -> ApiError {
        match self {
            WriteError::TooLarge => too_large("the upload", limit),
            WriteError::Body(e) => ApiError::bad_request(format!("reading the upload failed: {e}")),
            WriteError::Io(e) => ApiError::internal(format!("cannot store the upload: {e}")),
        }
    }
}

async fn collect<S, E>(mut stream: S, spill: &Path, limit: u64) -> Result<Source, WriteError>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut memory = bytes::BytesMut::new();
    let mut file: Option<tokio::io::BufWriter<tokio::fs::File>> = None;
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| WriteError::Body(e.to_string()))?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(WriteError::TooLarge);
        }
        match file.as_mut() {
            Some(f) => f.write_all(&chunk).await.map_err(WriteError::Io)?,
            None if memory.len() + chunk.len() > SPILL_BYTES => {
                let f = tokio::fs::File::create(spill)
                    .await
                    .map_err(WriteError::Io)?;
                let mut f = tokio::io::BufWriter::with_capacity(1 << 20, f);
                f.write_all(&memory).await.map_err(WriteError::Io)?;
                f.write_all(&chunk).await.map_err(WriteError::Io)?;
                memory.clear();
                file = Some(f);
            }
            None => memory.extend_from_slice(&chunk),
        }
    }
    match file {
        Some(mut f) => {
            f.flush().await.map_err(WriteError::Io)?;
            Ok(Source::File(spill.to_path_buf()))
        }
        None => Ok(Source::Memory(memory.freeze())),
    }
}
