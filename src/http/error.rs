//! `ApiError`: the one error type that becomes an HTTP response (status + JSON a person can act on).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::audio::AudioError;

/// The JSON body of every error response.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable machine-readable code, e.g. `queue_full`.
    pub error: String,
    /// What happened and what to do about it.
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
    /// The request parameter at fault, where one is (OpenAI's error body says it as `param`).
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
            param: None,
        }
    }

    /// The same, naming the request parameter at fault.
    pub fn at(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// 507: the temp dir's disk is (nearly) full.
    pub fn no_space(no: crate::job::NoSpace) -> ApiError {
        ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
            no.to_string(),
        )
    }

    /// 507 for an I/O error that is the disk or the quota being full (ENOSPC, EDQUOT), whatever
    /// wrote.
    pub fn disk_full(e: &std::io::Error) -> Option<ApiError> {
        crate::job::is_disk_full(e).then(|| {
            ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                crate::job::DISK_FULL,
            )
        })
    }

    /// A job folder that could not be made: 507 when the disk is full, else 500 (the error
    /// names no path: `job::job_dir`).
    pub fn job_folder(e: &std::io::Error) -> ApiError {
        ApiError::disk_full(e)
            .unwrap_or_else(|| ApiError::internal(format!("cannot create a job folder: {e}")))
    }

    /// 400 for a query string or path that does not parse, in words a person reads: serde's
    /// "invalid digit found in string" says a number was expected.
    pub fn unparsed(what: &str, text: String) -> ApiError {
        let text = text
            .replace("Failed to deserialize query string: ", "")
            .replace("Invalid URL: ", "");
        // Speaker counts run from 1 (`-1` read as "not a whole number of 0 or more", and 0 is
        // refused too); anything else numeric is a plain whole number.
        let digits = match text.contains("_speakers") {
            true => "not a whole number from 1 to 1000",
            false => "not a whole number",
        };
        let text = text
            .replace("invalid digit found in string", digits)
            .replace(
                "cannot parse integer from empty string",
                &format!("empty, {digits}"),
            )
            .replace(
                "number too large to fit in target type",
                "a number too large",
            )
            .replace(
                "provided string was not `true` or `false`",
                "neither `true` nor `false`",
            );
        ApiError::bad_request(format!("bad {what}: {text}"))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// The GPU queue is full; `Retry-After` says when to come back.
    pub fn queue_full(full: &crate::job::QueueFull) -> ApiError {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            format!(
                "{} for the GPU (limits.max_queue); retry in about {} s",
                crate::arbiter::queue::already_waiting(full.max_queue),
                full.retry_after_s
            ),
        )
        .with_retry_after(full.retry_after_s)
    }

    pub fn with_retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// Hides the job folder's path in the message.
    pub fn redact(mut self, dir: &std::path::Path) -> ApiError {
        self.message = crate::job::redact(&self.message, dir);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong token: send `Authorization: Bearer <token>` (the server's `token` / GPUHOST_TOKEN)",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.code == "internal" {
            // The message tells the client that the log has the details: here they are.
            tracing::error!(status = %self.status, message = %self.message, "a request failed on the server's side");
        }
        let refused = Refused {
            code: self.code,
            message: self.message.clone(),
        };
        let body = Json(ErrorBody {
            error: self.code.to_string(),
            message: self.message,
        });
        let mut response = (self.status, body).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response.extensions_mut().insert(refused);
        response
    }
}

/// Marks a response made from an [`ApiError`], so that a layer can answer it in another shape
/// (the OpenAI endpoints' errors: `openai::shape_refusals`) whichever layer refused.
#[derive(Debug, Clone)]
pub struct Refused {
    pub code: &'static str,
    pub message: String,
}

impl From<crate::protocol::OptionsError> for ApiError {
    fn from(e: crate::protocol::OptionsError) -> ApiError {
        use crate::protocol::OptionsError as E;
        let param = match &e {
            E::BadLanguage | E::UnsupportedLanguage { .. } => Some("language"),
            E::PromptTooLong { .. } => Some("prompt"),
            E::MinAboveMax { .. } => Some("min_speakers"),
            E::NumOutsideRange { .. } => Some("num_speakers"),
            E::StageNotRun { option, .. }
            | E::NoSuchStage { option, .. }
            | E::ZeroSpeakers { option }
            | E::TooManySpeakers { option } => Some(*option),
            E::CannotTranslate { .. } => None,
        };
        let error = match e {
            E::PromptTooLong { .. } => ApiError::too_large(e.to_string()),
            _ => ApiError::bad_request(e.to_string()),
        };
        match param {
            Some(param) => error.at(param),
            None => error,
        }
    }
}

impl From<AudioError> for ApiError {
    fn from(e: AudioError) -> ApiError {
        let message = e.to_string();
        match e {
            AudioError::Empty => ApiError::new(StatusCode::BAD_REQUEST, "empty_upload", message),
            AudioError::Undecodable(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "undecodable_audio",
                message,
            ),
            AudioError::BadFormat(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_audio_format",
                message,
            ),
            AudioError::TooLong { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "audio_too_long", message)
            }
            AudioError::NoSpace(no) => ApiError::no_space(no),
            AudioError::Io(e) => {
                ApiError::disk_full(&e).unwrap_or_else(|| ApiError::internal(message))
            }
            AudioError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
        }
    }
}

/// A `{name}` path segment (a service, a worker, a voice). axum's own `Path<String>` answers a
/// segment that is not UTF-8 in plain text; this answers it as every other error, in JSON.
pub struct PathName(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for PathName {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(name)| PathName(name))
            .map_err(|e| ApiError::bad_request(e.body_text()))
    }
}
