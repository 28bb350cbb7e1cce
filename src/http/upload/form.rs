//! multipart/form-data bodies: the form read field by field, its file field received under the
//! upload limits, its text fields refused past their own limit; every mistake a 400 or 413.

use std::path::Path;

use axum::extract::{FromRequest, Multipart, Request};

use super::{collect, ApiError, Source};

/// A multipart/form-data body read field by field, its mistakes as 400s (every form the API
/// takes: `/transcribe`, the OpenAI endpoints, `/speakers`).
pub(in crate::http) struct Form(Multipart);

impl Form {
    pub(in crate::http) async fn open(request: Request) -> Result<Form, ApiError> {
        Multipart::from_request(request, &())
            .await
            .map(Form)
            .map_err(|e| {
                ApiError::bad_request(format!("send multipart/form-data: {}", e.body_text()))
            })
    }

    pub(in crate::http) async fn next(
        &mut self,
    ) -> Result<Option<axum::extract::multipart::Field<'_>>, ApiError> {
        self.0.next_field().await.map_err(|e| {
            ApiError::bad_request(format!("invalid multipart body: {}", e.body_text()))
        })
    }
}

/// Receives one multipart field (the `file` of a form) with the same limits as `receive`.
pub(in crate::http) async fn collect_field(
    field: axum::extract::multipart::Field<'_>,
    spill: &Path,
    limit: u64,
) -> Result<Source, ApiError> {
    collect(field, Some(spill), limit)
        .await
        .map_err(|e| e.into_api(limit))
}

/// A text field of the form, refused once it grows past `max` bytes (never buffered whole).
pub(in crate::http) async fn text_field(
    mut field: axum::extract::multipart::Field<'_>,
    name: &str,
    max: usize,
    limit: &str,
) -> Result<String, ApiError> {
    let mut value = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|e| {
        ApiError::bad_request(format!(
            "invalid multipart field `{name}`: {}",
            e.body_text()
        ))
    })? {
        if value.len() + chunk.len() > max {
            return Err(ApiError::too_large(format!(
                "the form field `{name}` is longer than {max} bytes ({limit})"
            )));
        }
        value.extend_from_slice(&chunk);
    }
    String::from_utf8(value)
        .map_err(|_| ApiError::bad_request(format!("the form field `{name}` is not UTF-8 text")))
}
