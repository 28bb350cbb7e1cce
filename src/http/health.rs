//! The open probes: `/live` (the process answers), `/health` (it answers and can take jobs at
//! all) and `/ready` (it should get traffic now). None reveals paths or command lines, and none
//! waits on the GPU lock.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde_json::json;

use super::SpareConnection;
use crate::worker::WorkerState;
use crate::AppState;

/// Liveness alone, for a probe that restarts the process when it fails (Kubernetes'
/// `livenessProbe`): 200 whenever the server answers. Nothing a restart cannot mend makes it
/// fail — a full or read-only temp dir stays full across a restart (an `emptyDir` outlives its
/// container), so it is `/health`'s and `/ready`'s 503, not this one's, and a node's running
/// jobs are not killed in a loop for it.
#[utoipa::path(get, path = "/live", responses(
    (status = 200, description = "The server answers", body = Object),
))]
pub(super) async fn live() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Liveness plus a summary. 503 when the temp dir cannot take job folders (a full or read-only
/// disk): every upload would fail.
#[utoipa::path(get, path = "/health", responses(
    (status = 200, description = "Alive: status, version, uptime, worker counts, queue, GPU sampling", body = Object),
    (status = 503, description = "Alive but unable to take jobs (`problems` says why)", body = Object),
))]
pub(super) async fn health(State(app): State<AppState>) -> Response {
    let statuses = app.supervisor.statuses();
    let ready = statuses
        .iter()
        .filter(|s| matches!(s.state, WorkerState::Ready | WorkerState::Busy))
        .count();
    let busy = statuses
        .iter()
        .filter(|s| s.state == WorkerState::Busy)
        .count();
    let loading = statuses
        .iter()
        .filter(|s| s.state == WorkerState::Starting)
        .count();
    let temp = app.temp_probe.check().await;
    let mut problems = Vec::new();
    if let Err(why) = &temp {
        problems.push(why.clone());
    }
    let status = if problems.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    // The queue the pipeline's jobs wait in (its first GPU's; `[gpu] device`'s on the CPU).
    let mut queue = crate::job::route(&app, &app.config.pipeline.stages)
        .first
        .queue
        .counts();
    queue["max_waiting"] = json!(app.config.limits.max_queue);
    let body = json!({
        "status": if problems.is_empty() { "ok" } else { "unhealthy" },
        "problems": problems,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": crate::pipeline::round3(app.started.elapsed().as_secs_f64()),
        // `ready`: loaded and serving, busy ones included (`busy` of them running a task now).
        "workers": { "total": statuses.len(), "ready": ready, "busy": busy, "loading": loading },
        "queue": queue,
        "gpu": app.gpu_health(),
        // Not a reason to restart by itself (running jobs would end): said, and logged.
        "orphan_guard": if crate::process::guard::gone() { "gone" } else { "ok" },
    });
    (status, Json(body)).into_response()
}

/// The answer of `/ready`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(super) struct Readiness {
    pub ready: bool,
    /// Why not, one line each (empty when ready).
    pub reasons: Vec<String>,
}

/// Readiness for a load balancer or a Kubernetes probe: 503 while a resident worker is loading
/// or down, the queue is full, every connection slot is held (the probe came on a spare
/// connection), or the temp dir is unusable, with the reasons.
#[utoipa::path(get, path = "/ready", responses(
    (status = 200, description = "Ready for traffic", body = Readiness),
    (status = 503, description = "Not ready now", body = Readiness),
))]
pub(super) async fn ready(
    State(app): State<AppState>,
    spare: Option<Extension<SpareConnection>>,
) -> Response {
    let mut reasons = Vec::new();
    if let Some(Extension(spare)) = spare {
        reasons.push(format!(
            "all {} connection slots are in use (http.max_connections)",
            spare.max_connections
        ));
    }
    for s in app.supervisor.statuses() {
        let up = match s.mode {
            // Unloaded (idle, by hand, or for a lease or service): a job loads it again, once
            // the GPU is free; until then jobs wait in the queue like any other, which is what
            // `max_queue` bounds (a 503 kept away the very job that would bring it back). A
            // worker that was failing when it was unloaded stays `exited`.
            crate::config::Mode::Resident => matches!(
                s.state,
                WorkerState::Ready | WorkerState::Busy | WorkerState::Unloaded
            ),
            crate::config::Mode::Oneshot => s.state != WorkerState::Stopped,
        };
        if !up {
            reasons.push(format!("worker {} is {}", s.name, state_word(s.state)));
        }
    }
    // A queue blocked on memory that never came back grants nothing until someone frees it:
    // jobs there would not wait their turn, they would wait for a person. Only the GPUs the
    // pipeline's jobs take count (none for a pipeline on the CPU: blocks do not hold its jobs).
    let route = crate::job::route(&app, &app.config.pipeline.stages);
    for core in route.gpus() {
        // Why it is blocked names the processes on the GPU and their command lines: not for an
        // open endpoint (`/status` and `/gpu/leases` say it to a caller with the token).
        if core.queue.blocked_on_memory().is_some() {
            reasons.push(format!(
                "the GPU {} queue is blocked: memory a holder left behind has not come back \
                 (/status or /gpu/leases says whose)",
                core.device
            ));
        }
    }
    // Full as `/transcribe` finds it, in the queue the pipeline's jobs wait in: its first GPU's
    // (`[gpu] device`'s for a pipeline on the CPU, whose jobs wait there for a job place).
    let core = &route.first;
    let waiting = core.queue.waiting();
    if waiting >= app.config.limits.max_queue {
        let which = if app.arbiter.cores.len() > 1 {
            format!("the GPU {} queue", core.device)
        } else {
            "the GPU queue".to_string()
        };
        reasons.push(format!(
            "{which} is full ({waiting} waiting, limits.max_queue = {})",
            app.config.limits.max_queue
        ));
    }
    if let Err(why) = app.temp_probe.check().await {
        reasons.push(why);
    }
    let status = if reasons.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready: reasons.is_empty(),
        reasons,
    };
    (status, Json(body)).into_response()
}

fn state_word(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Starting => "loading",
        WorkerState::Ready => "ready",
        WorkerState::Busy => "busy",
        WorkerState::Exited => "down after a failure",
        WorkerState::Idle => "idle",
        WorkerState::Unloaded => "unloaded",
        WorkerState::Stopped => "stopped",
    }
}
