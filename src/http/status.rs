//! `GET /status` (GPU snapshot), `GET /workers` and `GET /metrics`: all read snapshots and
//! counters only, never the driver and never the GPU lock.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::AppState;

/// GPU snapshot: devices, processes with command lines, the idle decision, workers, queue.
#[utoipa::path(get, path = "/status", responses(
    (status = 200, description = "The latest GPU sample and decision", body = Object),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn status(State(app): State<AppState>) -> Json<Value> {
    let workers = app.supervisor.statuses();
    let view = app.gpu_view(&workers);
    let mut body = serde_json::to_value(&view).unwrap_or_default();
    body["workers"] = workers
        .iter()
        .map(|w| json!({ "name": w.name, "state": w.state, "pid": w.pid, "mode": w.mode, "vram_mib": w.vram_mib }))
        .collect();
    body["queue"] = app.queue.counts();
    body["holders"] = json!(app.queue.holders());
    body["waiting"] = json!(app.queue.waiters());
    body["leases"] = json!(app.arbiter.leases.list());
    body["devices"] = devices(&app);
    body["services"] = app
        .arbiter
        .services
        .statuses()
        .iter()
        .map(super::services::view)
        .collect();
    Json(body)
}

/// Each arbitrated GPU's holders, waiters and block (one queue per device).
pub(super) fn devices(app: &AppState) -> Value {
    app.arbiter
        .cores
        .iter()
        .map(|c| {
            json!({
                "index": c.device,
                "holders": c.queue.holders(),
                "waiting": c.queue.waiters(),
                "blocked": c.queue.blocked(),
                "busy_reason": c.busy_reason(),
            })
        })
        .collect()
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", responses(
    (status = 200, description = "OpenMetrics text format 1.0.0 (Prometheus scrapes it)", content_type = "application/openmetrics-text", body = String),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        crate::metrics::render(&app),
    )
}

/// Each worker: state, pid, mode, loaded model, job counts, restarts, last error, uptime.
#[utoipa::path(get, path = "/workers", responses(
    (status = 200, description = "Workers and the queue", body = Object),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn workers(State(app): State<AppState>) -> Json<Value> {
    let workers: Vec<Value> = app
        .supervisor
        .statuses()
        .into_iter()
        .map(|s| {
            let mut v = serde_json::to_value(&s).unwrap_or_default();
            v["uptime_s"] = json!(crate::pipeline::round3(s.uptime_s()));
            v["measured_vram_mib"] = json!(app
                .arbiter
                .core()
                .footprints
                .measured(&crate::arbiter::worker_key(&s.name)));
            v["state_for_s"] = json!(crate::pipeline::round3(
                s.state_since.elapsed().as_secs_f64()
            ));
            v
        })
        .collect();
    Json(json!({
        "workers": workers,
        "queue": app.queue.counts(),
    }))
}
