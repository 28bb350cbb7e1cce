//! The answer on a spare connection (one accepted past `[http] max_connections`, see
//! `serve.rs`): the probes pass, anything else is told the server is busy. It runs inside the
//! drain layer, so a client that sends its whole body before reading gets the 503, not a reset.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;

/// Marks a request that came on a spare connection; `serve.rs` adds it to every such request.
#[derive(Debug, Clone, Copy)]
pub struct SpareConnection {
    /// The connection cap that is full, for the message.
    pub max_connections: usize,
}

pub(super) async fn probes_only(request: Request, next: Next) -> Response {
    let Some(spare) = request.extensions().get::<SpareConnection>().copied() else {
        return next.run(request).await;
    };
    if matches!(request.uri().path(), "/live" | "/health" | "/ready") {
        return next.run(request).await;
    }
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        format!(
            "all {} connection slots are in use (http.max_connections); retry in a moment",
            spare.max_connections
        ),
    )
    .with_retry_after(1)
    .into_response()
}
