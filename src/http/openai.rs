//! `POST /v1/audio/transcriptions` and `/v1/audio/translations`, compatible with OpenAI's API so
//! existing clients work unchanged: multipart `file`, `model`, `language`, `prompt`,
//! `response_format`, `timestamp_granularities[]` (form: `openai/form.rs`); speaker labels ride
//! along in `verbose_json` segments. A translation is the same job with `translate` set: English text, source timing.

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::transcribe::final_result;
use super::upload;
use crate::job::{self, start_job};
use crate::pipeline::JobOptions;
use crate::render::{render, Format};
use crate::transcript::Transcript;
use crate::AppState;

mod form;
mod words;
use form::read_form;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
pub(super) struct OpenAiError(ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

/// OpenAI's error body for a refusal of `status`.
fn openai_body(
    status: axum::http::StatusCode,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> Value {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// Whether an OpenAI client asks for `path`: `/v1` and below, and OpenAI's paths without it (a
/// base URL missing its `/v1`, a common slip: its 404 says so, in a shape the client shows).
pub(super) fn openai_path(path: &str) -> bool {
    path == "/v1"
        || path.starts_with("/v1/")
        || path.starts_with("/audio/")
        || path == "/models"
        || path.starts_with("/models/")
}

/// Answers in OpenAI's shape what another layer refused on `/v1/…` (the token check, the
/// browser defences, a wrong method or path, a drained connection), as the handlers' own
/// errors are: OpenAI clients read `error.message`. Status and headers stay as they were.
pub(super) async fn shape_refusals(request: Request, next: axum::middleware::Next) -> Response {
    let openai = openai_path(request.uri().path());
    let mut response = next.run(request).await;
    if !openai {
        return response;
    }
    let Some(refused) = response.extensions_mut().remove::<super::error::Refused>() else {
        return response;
    };
    let body = openai_body(response.status(), refused.code, &refused.message, None);
    let (mut parts, _) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body.to_string()))
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = openai_body(
            self.0.status,
            self.0.code,
            &self.0.message,
            self.0.param.as_deref(),
        );
        let mut response = (self.0.status, Json(body)).into_response();
        // OpenAI's clients retry a 5xx twice by themselves: a worker's own failure or bad
        // answer would come back alike, each time after a run on the GPU. (A crash, a timeout
        // or a worker down may go otherwise on a new process: those stay retried.)
        if matches!(self.0.code, "job_failed" | "bad_output") {
            response.headers_mut().insert(
                "x-should-retry",
                axum::http::HeaderValue::from_static("false"),
            );
        }
        if let Some(seconds) = self.0.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

/// OpenAI error shape, for the schema.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documentation only: built with json!
pub(super) struct OpenAiErrorBody {
    #[schema(value_type = Object)]
    error: serde_json::Value,
}

/// What both OpenAI endpoints may answer besides 200 and 400.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only
pub(super) enum OpenAiErrors {
    #[response(status = 401, description = "Token missing or wrong")]
    Unauthorized(OpenAiErrorBody),
    #[response(status = 403, description = "Foreign Host or a cross-site request")]
    Forbidden(OpenAiErrorBody),
    #[response(status = 408, description = "The body stalled")]
    Stalled(OpenAiErrorBody),
    #[response(status = 413, description = "Upload, field or audio too large")]
    TooLarge(OpenAiErrorBody),
    #[response(status = 415, description = "Not decodable as audio")]
    NotAudio(OpenAiErrorBody),
    #[response(status = 429, description = "The GPU queue is full (see Retry-After)")]
    QueueFull(OpenAiErrorBody),
    #[response(
        status = 507,
        description = "The temp dir's disk has no room (limits.min_free_bytes), or a worker's disk was full"
    )]
    NoSpace(OpenAiErrorBody),
    #[response(
        status = 500,
        description = "Internal error, or a worker failed on the job (`job_failed`)"
    )]
    Internal(OpenAiErrorBody),
    #[response(status = 502, description = "A worker crashed or wrote bad output")]
    WorkerBroke(OpenAiErrorBody),
    #[response(
        status = 503,
        description = "A worker is unavailable, or the host is shutting down"
    )]
    Unavailable(OpenAiErrorBody),
    #[response(status = 504, description = "A worker timed out")]
    Timeout(OpenAiErrorBody),
}

/// OpenAI-compatible transcription (`base_url=http://host:9090/v1`).
#[utoipa::path(
    post,
    path = "/v1/audio/transcriptions",
    request_body(content = super::openapi::OpenAiForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The transcript in `response_format`", content(
            (Object = "application/json"),
            (String = "text/plain"),
            (String = "application/x-subrip"),
            (String = "text/vtt"),
        )),
        (status = 400, description = "Bad form, or the worker refused the job (a language or a translation its model cannot do, when it was not loaded to be asked before)", body = OpenAiErrorBody),
        OpenAiErrors,
    ),
    security(("bearer" = []))
)]
pub(super) async fn transcriptions(
    State(app): State<AppState>,
    request: Request,
) -> Result<Response, OpenAiError> {
    answer(app, request, false).await
}

/// OpenAI-compatible model list (clients and UIs ask it before they offer speech-to-text): the
/// `model` field is not used to pick one, so the list holds OpenAI's name, which every client
/// sends by default, and the ASR model this server runs.
#[utoipa::path(get, path = "/v1/models", responses(
    (status = 200, description = "`{object: \"list\", data: [{id, object, created, owned_by}]}`", body = Object),
    (status = 401, description = "Token missing or wrong", body = OpenAiErrorBody),
    (status = 403, description = "Foreign Host or a cross-site request", body = OpenAiErrorBody),
), security(("bearer" = [])))]
pub(super) async fn models(State(app): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": model_list(&app)}))
}

/// One model of the list, as OpenAI's `GET /v1/models/{model}` answers it.
#[utoipa::path(get, path = "/v1/models/{model}", params(("model" = String, Path, description = "A model's id")), responses(
    (status = 200, description = "`{id, object, created, owned_by}`", body = Object),
    (status = 404, description = "No such model", body = OpenAiErrorBody),
    (status = 401, description = "Token missing or wrong", body = OpenAiErrorBody),
), security(("bearer" = [])))]
pub(super) async fn model(
    State(app): State<AppState>,
    // A segment that is not UTF-8 is refused in OpenAI's JSON shape too, not in plain text.
    id: Result<super::error::PathName, ApiError>,
) -> Result<Json<Value>, OpenAiError> {
    let super::error::PathName(id) = id?;
    model_list(&app)
        .into_iter()
        .find(|m| m["id"] == id.as_str())
        .map(Json)
        .ok_or_else(|| {
            OpenAiError(ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "model_not_found",
                format!(
                    "the model `{}` does not exist here; GET /v1/models lists them",
                    id.chars().take(80).collect::<String>()
                ),
            ))
        })
}

fn model_list(app: &AppState) -> Vec<Value> {
    let loaded = app
        .supervisor
        .get("asr")
        .and_then(|w| w.status().loaded)
        .and_then(|l| l.model);
    // Without an `asr` stage every transcription is a 400: no model to offer.
    let has_asr = app.config.pipeline.stages.iter().any(|s| s == "asr");
    let ids = std::iter::once("whisper-1".to_string())
        .chain(loaded)
        .filter(|_| has_asr);
    ids.map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "gpuhost"}))
        .collect()
}

/// OpenAI-compatible translation to English (a multilingual ASR model only).
#[utoipa::path(
    post,
    path = "/v1/audio/translations",
    request_body(content = super::openapi::OpenAiForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The transcript in `response_format`", content(
            (Object = "application/json"),
            (String = "text/plain"),
            (String = "application/x-subrip"),
            (String = "text/vtt"),
        )),
        (status = 400, description = "Bad form, or the ASR model is English-only", body = OpenAiErrorBody),
        OpenAiErrors,
    ),
    security(("bearer" = []))
)]
pub(super) async fn translations(
    State(app): State<AppState>,
    request: Request,
) -> Result<Response, OpenAiError> {
    answer(app, request, true).await
}

/// One job from the form; the transcript (or translation) in `response_format`.
async fn answer(app: AppState, request: Request, translate: bool) -> Result<Response, OpenAiError> {
    // Refused before the upload is read (the drain layer reads it after the answer).
    if let Some(name) = form::field_in_query(request.uri()) {
        return Err(ApiError::bad_request(format!(
            "`{name}` is given as a query parameter; this endpoint reads it from the multipart \
             form only (beside `file`), so it would be ignored"
        ))
        .at(name)
        .into());
    }
    let pipeline = &app.config.pipeline.stages;
    if crate::render::fits(crate::render::Format::Txt, pipeline).is_err() {
        return Err(ApiError::bad_request(format!(
            "this server's pipeline ({}) has no `asr` stage: there is no text to answer with",
            pipeline.join(", ")
        ))
        .into());
    }
    let (intake, request) = upload::FormIntake::begin(&app, request, &app.config.pipeline.stages)?;
    let form = read_form(
        request,
        intake.dir(),
        intake.limits.max_bytes,
        app.config.limits.max_field_bytes,
        app.config.limits.min_free_bytes,
    )
    .await
    .map_err(|e| intake.failed(e))?;
    let format = form.response_format.as_deref().map_or("json", str::trim);
    if !["json", "text", "srt", "verbose_json", "vtt"].contains(&format) {
        return Err(ApiError::bad_request(format!(
            "response_format `{format}` is not supported (json, text, srt, verbose_json, vtt)"
        ))
        .at("response_format")
        .into());
    }
    // As OpenAI answers: only `verbose_json` has times to give (they were dropped unsaid).
    if !form.granularities.is_empty() && format != "verbose_json" {
        return Err(ApiError::bad_request(format!(
            "timestamp_granularities needs response_format `verbose_json` (this asks `{format}`)"
        ))
        .at("timestamp_granularities[]")
        .into());
    }
    let file = form
        .file
        .ok_or_else(|| ApiError::bad_request("the multipart field `file` is missing").at("file"))?;
    let options = JobOptions {
        language: form.language,
        prompt: form.prompt,
        translate,
        num_speakers: form.num_speakers,
        min_speakers: form.min_speakers,
        max_speakers: form.max_speakers,
    };
    let stages = app.config.pipeline.stages.clone();
    let options = job::accept_options(&app, options, &stages).map_err(ApiError::from)?;
    let prepared = intake.into_job(&app, file, options, stages).await?;
    let duration = prepared.info.seconds;
    let events = start_job(app, prepared).map_err(|full| ApiError::queue_full(&full))?;
    let result = final_result(events).await?;
    let transcript = Transcript::from_result(&result);
    let text = transcript
        .as_ref()
        .map(|t| t.text.clone())
        .unwrap_or_default();
    Ok(match format {
        "text" => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            text + "\n",
        )
            .into_response(),
        "srt" => (
            [(header::CONTENT_TYPE, Format::Srt.content_type())],
            render(&result, Format::Srt),
        )
            .into_response(),
        "vtt" => (
            [(header::CONTENT_TYPE, Format::Vtt.content_type())],
            render(&result, Format::Vtt),
        )
            .into_response(),
        "verbose_json" => {
            let transcript = transcript.unwrap_or_default();
            Json(verbose(
                &transcript,
                duration,
                &form.granularities,
                translate,
            ))
            .into_response()
        }
        _ => Json(json!({ "text": text })).into_response(),
    })
}

fn verbose(
    transcript: &Transcript,
    duration: f64,
    granularities: &[String],
    translate: bool,
) -> Value {
    // A translation's is the output's, as OpenAI's (always `english`); a transcription's the
    // spoken one, named as OpenAI names it: `korean`, not `ko` (a code Whisper does not know
    // stays a code).
    let spoken = transcript.language.as_deref().unwrap_or("");
    let language = match translate {
        true => "english",
        false => crate::protocol::language::name(spoken).unwrap_or(spoken),
    };
    let mut body = json!({
        "task": if translate { "translate" } else { "transcribe" },
        "language": language,
        "duration": duration,
        "text": transcript.text,
    });
    let words_wanted = granularities.iter().any(|g| g == "word");
    let segments_wanted = granularities.is_empty() || granularities.iter().any(|g| g == "segment");
    if segments_wanted {
        body["segments"] = transcript
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                json!({
                    "id": i, "seek": 0, "start": s.start, "end": s.end, "text": s.text,
                    "tokens": [], "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0,
                    "no_speech_prob": 0.0, "speaker": s.speaker,
                })
            })
            .collect();
    }
    if words_wanted {
        body["words"] = transcript
            .whole_words()
            .iter()
            .filter_map(|w| {
                let word = words::bare(&w.word)?;
                Some(json!({"word": word, "start": w.start, "end": w.end, "speaker": w.speaker}))
            })
            .collect();
    }
    body
}
