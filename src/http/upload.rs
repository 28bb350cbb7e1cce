//! Receives an upload (raw body or multipart field `file`) into a file, enforcing the size limit
//! while streaming so an oversized upload is refused without being buffered.

use std::path::Path;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::error::ApiError;

/// Writes the upload to `path`; returns its size in bytes.
pub async fn receive(request: Request, path: &Path, limit: u64) -> Result<u64, ApiError> {
    let too_large = |what: &str| {
        ApiError::too_large(format!(
            "{what} exceeds the upload limit of {limit} bytes (limits.max_upload_bytes)"
        ))
    };
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large("the request body"));
    }
    let is_multipart = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !is_multipart {
        let stream = Body::into_data_stream(request.into_body());
        return write_stream(stream, path, limit)
            .await
            .map_err(|e| e.into_api(&too_large));
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
            return write_stream(field, path, limit)
                .await
                .map_err(|e| e.into_api(&too_large));
        }
    }
}

enum WriteError {
    TooLarge,
    Body(String),
    Io(std::io::Error),
}

impl WriteError {
    fn into_api(self, too_large: &dyn Fn(&str) -> ApiError) -> ApiError {
        match self {
            WriteError::TooLarge => too_large("the upload"),
            WriteError::Body(e) => ApiError::bad_request(format!("reading the upload failed: {e}")),
            WriteError::Io(e) => ApiError::internal(format!("cannot store the upload: {e}")),
        }
    }
}

async fn write_stream<S, E>(mut stream: S, path: &Path, limit: u64) -> Result<u64, WriteError>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(WriteError::Io)?;
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            // axum reports its own length limit as a body error; we set none, so this is I/O.
            WriteError::Body(e.to_string())
        })?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(WriteError::TooLarge);
        }
        file.write_all(&chunk).await.map_err(WriteError::Io)?;
    }
    file.flush().await.map_err(WriteError::Io)?;
    Ok(size)
}
