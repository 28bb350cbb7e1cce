//! Leases for any program: `POST /gpu/lease` (NDJSON while waiting with `wait`), renew, release,
//! `GET /gpu/leases` with the holders and the queue, and `GET /gpu/history` (who held the GPU,
//! memory and utilization over time). The arbiter does the work.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tokio::sync::mpsc;

use super::error::{ApiError, ErrorBody};
use super::upload::{guard, BodyLimits};
use crate::arbiter::leases::{LeaseRequest, LeaseView};
use crate::protocol::{label, GrantEvent};
use crate::AppState;

/// Longest lease `holder` or `purpose`, in bytes: a name and a sentence.
const LABEL_MAX: usize = 512;

/// Asks for the GPU. Without `wait`: 200 with the lease, or 409 when the GPU is taken. With
/// `wait`: an NDJSON stream of `queued` / `making_room` events ending in `granted` or `error`.
#[utoipa::path(post, path = "/gpu/lease", request_body = LeaseRequest, responses(
    (status = 200, description = "Granted (JSON), or with `wait` the NDJSON stream of `GrantEvent`s", content(
        (Object = "application/json"),
        (String = "application/x-ndjson"),
    )),
    (status = 400, description = "Bad request body", body = ErrorBody),
    (status = 409, description = "The GPU is taken (without `wait`), or no room can be made", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn lease(
    State(app): State<AppState>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    // Paced as uploads are (the 64 KiB cap is the route's body limit, applied by `Json`).
    let limits = BodyLimits {
        max_bytes: u64::MAX,
        ..BodyLimits::from_config(&app.config)
    };
    let (request, tripwire) = guard(request, limits);
    let body = Json::<LeaseRequest>::from_request(request, &()).await;
    let Json(request) = body.map_err(|e: JsonRejection| {
        tripwire.error(&limits).unwrap_or_else(|| match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(format!(
                "a lease request is at most 64 KiB of JSON: {}",
                e.body_text()
            )),
            _ => ApiError::bad_request(e.body_text()),
        })
    })?;
    if request.holder.trim().is_empty() {
        return Err(ApiError::bad_request(
            "`holder` must name who holds the lease",
        ));
    }
    // Both are shown to everyone (`/status`, queue events, the dashboard, terminals).
    if request.holder.len() > LABEL_MAX || request.purpose.len() > LABEL_MAX {
        return Err(ApiError::too_large(format!(
            "`holder` and `purpose` may be at most {LABEL_MAX} bytes each"
        )));
    }
    if !(label::shows_as_text(&request.holder) && label::shows_as_text(&request.purpose)) {
        return Err(ApiError::bad_request(
            "`holder` and `purpose` must not contain control or invisible characters",
        ));
    }
    let ttl = app
        .arbiter
        .leases
        .ttl(&request)
        .map_err(ApiError::bad_request)?;
    let device = app
        .arbiter
        .leases
        .device_for(&request)
        .map_err(ApiError::bad_request)?;
    let wait = request.wait;
    // Waiting leases take places in the same queue as jobs, bounded by the same limit (checked
    // by the queue, under its lock).
    let max = app.config.limits.max_queue;
    let (tx, mut rx) = mpsc::channel(64);
    let arbiter = std::sync::Arc::clone(&app.arbiter);
    tokio::spawn(async move { arbiter.leases.acquire(request, device, ttl, max, tx).await });
    if wait {
        // The first event says whether the lease got a place: a full queue is a 429, as for
        // jobs, and a lease that can never fit (more than the whole GPU) a 409, as without
        // `wait`; anything else starts the stream.
        let first = rx.recv().await;
        if let Some(GrantEvent::Error { code, message }) = &first {
            let refused = match code.as_str() {
                "queue_full" => Some((StatusCode::TOO_MANY_REQUESTS, "queue_full")),
                "no_room" => Some((StatusCode::CONFLICT, "no_room")),
                _ => None,
            };
            if let Some((status, code)) = refused {
                return Err(ApiError::new(status, code, message.clone()));
            }
        }
        return Ok(super::ndjson::from_first_and_channel(
            first,
            rx,
            std::time::Duration::from_secs_f64(app.config.http.heartbeat_s),
        ));
    }
    while let Some(event) = rx.recv().await {
        match event {
            GrantEvent::Granted { lease_id, ttl_s } => {
                return Ok(Json(json!({ "lease_id": lease_id, "ttl_s": ttl_s })).into_response())
            }
            GrantEvent::Error { code, message } => {
                let code = if code == "no_room" {
                    "no_room"
                } else {
                    "gpu_busy"
                };
                return Err(ApiError::new(StatusCode::CONFLICT, code, message));
            }
            _ => {}
        }
    }
    Err(ApiError::internal(
        "the lease request ended without an answer",
    ))
}

/// Extends a lease by its TTL.
#[utoipa::path(post, path = "/gpu/lease/{id}/renew", params(("id" = u64, Path, description = "Lease id")), responses(
    (status = 200, description = "Renewed", body = LeaseView),
    (status = 400, description = "Bad id", body = ErrorBody),
    (status = 404, description = "No such lease (released or expired)", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn renew(
    State(app): State<AppState>,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Result<Json<LeaseView>, ApiError> {
    let Path(id) = id.map_err(|_| bad_id())?;
    app.arbiter
        .leases
        .renew(id)
        .map(Json)
        .ok_or_else(|| no_lease(id))
}

/// Ends a lease: the GPU goes to the next waiter once the lease's memory is back.
#[utoipa::path(delete, path = "/gpu/lease/{id}", params(
    ("id" = u64, Path, description = "Lease id"),
    ("gpuhost-program-ended-ms-ago" = Option<u64>, Header, description = "Milliseconds since the program under the lease exited (0 to 3600000): its memory is then checked on a sample taken after that"),
), responses(
    (status = 200, description = "Released", body = Object),
    (status = 400, description = "Bad id, or a gpuhost-program-ended-ms-ago that is no number of milliseconds", body = ErrorBody),
    (status = 404, description = "No such lease (released or expired)", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn release(
    State(app): State<AppState>,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(id) = id.map_err(|_| bad_id())?;
    // How long ago the program under the lease exited (`gpuhost lease` says): only a sample
    // taken after that may show its memory back. Relative, so no clock need agree.
    let program_ended = match headers.get(crate::arbiter::leases::PROGRAM_ENDED) {
        None => None,
        Some(value) => {
            let ms: u64 = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .filter(|ms| *ms <= 3_600_000)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "{} must be the milliseconds since the program exited (0 to 3600000)",
                        crate::arbiter::leases::PROGRAM_ENDED
                    ))
                })?;
            std::time::Instant::now().checked_sub(std::time::Duration::from_millis(ms))
        }
    };
    if app.arbiter.leases.release(id, program_ended) {
        Ok(Json(json!({ "released": id })))
    } else {
        Err(no_lease(id))
    }
}

/// Leases, every holder of the GPU, and the queue.
#[utoipa::path(get, path = "/gpu/leases", responses(
    (status = 200, description = "Leases, holders and waiters", body = Object),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn leases(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "leases": app.arbiter.leases.list(),
        "holders": app.queue.holders(),
        "waiting": app.queue.waiters(),
        "blocked": app.queue.blocked(),
        "devices": super::status::devices(&app),
    }))
}

fn no_lease(id: u64) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_lease",
        format!("lease {id} does not exist: it was released or expired (renew within its ttl_s)"),
    )
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryQuery {
    /// Only what happened at or after this Unix time (seconds); default: everything kept.
    since: Option<f64>,
}

/// Memory and utilization samples (with the queue length) and every grant — speech job,
/// service, lease, unload, reload — with holder, start, end, time waited and peak memory, over
/// the last `[arbiter] history_s`.
#[utoipa::path(get, path = "/gpu/history", params(HistoryQuery), responses(
    (status = 200, description = "Samples and grants", body = Object),
    (status = 400, description = "Bad `since`", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn history(
    State(app): State<AppState>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Json<crate::arbiter::history::HistoryView>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::unparsed("query (`since` is a Unix time in seconds)", e.body_text())
    })?;
    if query.since.is_some_and(|s| !s.is_finite()) {
        return Err(ApiError::bad_request(
            "`since` must be a finite Unix time in seconds",
        ));
    }
    Ok(Json(app.queue.history.view(query.since)))
}

/// A lease id that is not one.
fn bad_id() -> ApiError {
    ApiError::bad_request(
        "a lease id is a whole number: the `lease_id` that POST /gpu/lease answered",
    )
}
