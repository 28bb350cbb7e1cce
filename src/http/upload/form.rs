//! multipart/form-data bodies: the form read field by field, its file field received under the
//! upload limits, its text fields refused past their own limit; every mistake a 400 or 413.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::extract::{FromRequest, Multipart, Request};
use futures_util::StreamExt;

use super::{collect, parts, ApiError, Source, Spill};

/// A multipart/form-data body read field by field, its mistakes as 400s (every form the API
/// takes: `/transcribe`, the OpenAI endpoints, `/speakers`).
pub(in crate::http) struct Form {
    fields: Multipart,
    /// Fields read so far: at most `MAX_FIELDS`.
    read: usize,
    /// Why the part scan cut the body off, if it did (the parser only says the stream failed).
    /// A lock-free cell: set once from the body stream, read after the parser gave up.
    cut: Arc<OnceLock<&'static str>>,
}

impl Form {
    pub(in crate::http) async fn open(request: Request) -> Result<Form, ApiError> {
        let cut = Arc::new(OnceLock::new());
        let request = bound_part_headers(request, Arc::clone(&cut));
        match Multipart::from_request(request, &()).await {
            Ok(fields) => Ok(Form {
                fields,
                read: 0,
                cut,
            }),
            Err(e) => Err(ApiError::bad_request(format!(
                "this endpoint reads a form: send Content-Type: multipart/form-data; boundary=… \
                 ({})",
                e.body_text()
            ))),
        }
    }

    pub(in crate::http) async fn next(
        &mut self,
    ) -> Result<Option<axum::extract::multipart::Field<'_>>, ApiError> {
        let cut = &self.cut;
        let field = self.fields.next_field().await.map_err(|e| {
            let why = cut
                .get()
                .map_or_else(|| e.body_text(), |why| why.to_string());
            ApiError::bad_request(format!("invalid multipart body: {why}"))
        })?;
        if field.is_some() {
            self.read += 1;
            if self.read > MAX_FIELDS {
                return Err(ApiError::bad_request(format!(
                    "the form has more than {MAX_FIELDS} fields; every form this API reads \
                     needs a handful"
                )));
            }
        }
        Ok(field)
    }
}

/// Fields a form may have: every form the API reads has at most a dozen and a few repeated
/// `include[]` or `timestamp_granularities[]`. Without a bound, a few megabytes of empty
/// fields kept a request busy for seconds each.
const MAX_FIELDS: usize = 256;

/// The names of the fields a form has given so far: each at most once (which one would be
/// meant? the last silently won, as a voice enrolled under the second of two names).
#[derive(Default)]
pub(in crate::http) struct Given(std::collections::HashSet<String>);

impl Given {
    /// Notes `name`; a 400 when the form gave it before.
    pub(in crate::http) fn first(&mut self, name: &str) -> Result<(), ApiError> {
        if !self.0.insert(name.to_string()) {
            let shown: String = name.chars().take(40).collect();
            return Err(ApiError::bad_request(format!(
                "the form field `{shown}` is given twice; give it once"
            ))
            .at(shown));
        }
        Ok(())
    }
}

/// The body of a multipart request with its part headers and preamble bounded as they stream in
/// (`parts.rs`); what cut it off goes to `cut`. A request without a boundary is left for the
/// parser to refuse.
fn bound_part_headers(request: Request, cut: Arc<OnceLock<&'static str>>) -> Request {
    let content_type = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let Some(boundary) = content_type.and_then(parts::boundary) else {
        return request;
    };
    let mut scan = parts::PartScan::new(&boundary);
    let (head, body) = request.into_parts();
    let checked = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        if let Err(why) = scan.feed(&chunk) {
            let _ = cut.set(why);
            return Err(std::io::Error::other(why));
        }
        Ok::<_, std::io::Error>(chunk)
    });
    Request::from_parts(head, axum::body::Body::from_stream(checked))
}

/// Receives one multipart field (the `file` of a form) with the same limits as `receive`.
pub(in crate::http) async fn collect_field(
    field: axum::extract::multipart::Field<'_>,
    spill: &Path,
    limit: u64,
    keep_free: u64,
) -> Result<Source, ApiError> {
    let spill = Spill {
        path: spill,
        keep_free,
    };
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
