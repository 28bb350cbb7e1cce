//! `GET /openapi.json`: the HTTP API as OpenAPI 3, generated from the handlers' annotations and
//! the wire types (`ClientEvent`, `ErrorBody`, `TranscribeQuery`, …), so it cannot drift from them.
//! CI runs schemathesis against it on the real server.

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::error::ErrorBody;

/// Multipart form of `POST /transcribe`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documentation only: the handler streams the form itself
pub struct AudioForm {
    /// The audio file.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
}

/// Multipart form of `POST /v1/audio/transcriptions` and `/translations` (OpenAI's fields).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // documentation only: the handler streams the form itself
pub struct OpenAiForm {
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// Accepted and ignored: the server's pipeline decides.
    model: Option<String>,
    language: Option<String>,
    prompt: Option<String>,
    /// `json` (default), `text`, `srt`, `verbose_json`, `vtt`.
    response_format: Option<String>,
    /// `word` and/or `segment` (`verbose_json`), as `timestamp_granularities[]`.
    timestamp_granularities: Option<Vec<String>>,
    /// Checked (0 to 1) and ignored: the server chooses its decoding.
    temperature: Option<f64>,
    /// Only `false`: `POST /transcribe` streams progress.
    stream: Option<bool>,
    /// gpuhost's: exactly this many speakers (1–1000).
    #[schema(minimum = 1, maximum = 1000)]
    num_speakers: Option<u32>,
    /// gpuhost's: at least this many speakers.
    #[schema(minimum = 1, maximum = 1000)]
    min_speakers: Option<u32>,
    /// gpuhost's: at most this many speakers.
    #[schema(minimum = 1, maximum = 1000)]
    max_speakers: Option<u32>,
}

/// What every protected endpoint may answer besides its own responses.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // documentation only
pub enum GuardErrors {
    #[response(status = 401, description = "Token missing or wrong")]
    Unauthorized(ErrorBody),
    #[response(
        status = 403,
        description = "A Host this server does not answer to, or a cross-site request"
    )]
    Forbidden(ErrorBody),
}

#[derive(OpenApi)]
#[openapi(
    info(title = "gpuhost", description = "Time-share one GPU between many AI models. Every error is JSON: `{\"error\": code, \"message\": text}`."),
    paths(
        super::health::live,
        super::health::health,
        super::health::ready,
        super::transcribe::transcribe,
        super::openai::transcriptions,
        super::openai::translations,
        super::openai::models,
        super::openai::model,
        super::status::status,
        super::status::metrics,
        super::status::workers,
        super::dashboard::page,
        super::gpu::lease,
        super::gpu::renew,
        super::gpu::release,
        super::gpu::leases,
        super::gpu::history,
        super::services::list,
        super::services::start,
        super::services::stop,
        super::services::touch,
        super::services::unload,
        super::services::load,
        super::speakers::enroll,
        super::speakers::list,
        super::speakers::delete,
        spec,
    ),
    components(schemas(crate::protocol::ClientEvent, crate::protocol::GrantEvent, crate::protocol::StageStatus, crate::render::Format, ErrorBody, AudioForm, OpenAiForm, super::speakers::EnrollForm)),
    modifiers(&Bearer),
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "OpenAPI 3 document", content_type = "application/json", body = Object)))]
pub async fn spec() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_documented() {
        let doc = ApiDoc::openapi();
        for path in [
            "/live",
            "/health",
            "/ready",
            "/transcribe",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/status",
            "/metrics",
            "/workers",
            "/",
            "/openapi.json",
        ] {
            assert!(doc.paths.paths.contains_key(path), "{path} is missing");
        }
        let json = serde_json::to_value(&doc).unwrap();
        assert!(json["components"]["schemas"]["ClientEvent"].is_object());
    }
}
