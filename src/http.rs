//! The HTTP surface: the router, the open `/health`, and the token-protected rest.

mod auth;
mod dashboard;
mod drain;
pub mod error;
mod gpu;
mod health;
mod ndjson;
mod no_query;
mod openai;
pub mod openapi;
mod origin;
mod services;
mod spare;
mod speakers;
mod status;
mod transcribe;
mod upload;

use axum::middleware;
use axum::routing::{get, post};
use axum::Router;

pub use auth::token_matches;
pub use drain::Drains;
pub(crate) use drain::{DRAIN_BYTES, DRAIN_FOR};
pub use error::ApiError;
pub use spare::SpareConnection;
pub use transcribe::TranscribeQuery;

use crate::AppState;

/// Builds the router over `state`.
pub fn router(state: AppState) -> Router {
    let protected = Router::new()
        .route("/transcribe", post(transcribe::transcribe))
        .route("/workers", get(status::workers))
        .route("/status", get(status::status))
        .route("/metrics", get(status::metrics))
        .route("/v1/audio/transcriptions", post(openai::transcriptions))
        .route("/v1/audio/translations", post(openai::translations))
        .route("/v1/models", get(openai::models))
        // Ids such as `Systran/faster-whisper-tiny`, as clients put them in the path: unescaped.
        .route("/v1/models/{*model}", get(openai::model))
        .route("/gpu/leases", get(gpu::leases))
        .route("/gpu/history", get(gpu::history))
        .route("/services", get(services::list))
        .route("/speakers", get(speakers::list).post(speakers::enroll))
        .merge(control())
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    // Browser defences cover everything but the probes (load balancers call those by address).
    let browsed = Router::new()
        .route("/", get(dashboard::page))
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), origin::check));
    Router::new()
        .route("/live", get(health::live))
        .route("/health", get(health::health))
        .route("/ready", get(health::ready))
        .route("/openapi.json", get(openapi::spec))
        .merge(browsed)
        // Uploads are limited while streaming (limits.max_upload_bytes), not by axum's buffer cap.
        .layer(axum::extract::DefaultBodyLimit::disable())
        // Requests on the spare connections: the probes, or a 503 (drained like any refusal).
        .layer(middleware::from_fn(spare::probes_only))
        // Every refusal, the token check's and the browser defences' included.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            drain::refused,
        ))
        // Outermost: `/v1/…` refusals in OpenAI's shape, whichever layer made them.
        .layer(middleware::from_fn(openai::shape_refusals))
        .with_state(state)
}

/// The endpoints that change state: options in the path or the JSON body, none in a query.
fn control() -> Router<AppState> {
    Router::new()
        .route(
            "/gpu/lease",
            post(gpu::lease).layer(axum::extract::DefaultBodyLimit::max(64 * 1024)),
        )
        .route("/gpu/lease/{id}/renew", post(gpu::renew))
        .route("/gpu/lease/{id}", axum::routing::delete(gpu::release))
        .route("/services/{name}/start", post(services::start))
        .route("/services/{name}/stop", post(services::stop))
        .route("/services/{name}/touch", post(services::touch))
        .route("/speakers/{name}", axum::routing::delete(speakers::delete))
        .route("/workers/{name}/unload", post(services::unload))
        .route("/workers/{name}/load", post(services::load))
        .route_layer(middleware::from_fn(no_query::refuse))
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let hint = if openai::openai_path(path) && !path.starts_with("/v1") {
        "; OpenAI clients: the base URL ends in /v1 (http://HOST:PORT/v1)"
    } else {
        "; see the README for the API"
    };
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {path}{hint}"),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}
