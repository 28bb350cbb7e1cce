//! On-demand services and worker loading by hand: `GET /services`, `POST /services/{name}/start`
//! (NDJSON until `healthy` or `error`; single flight), `/stop`, `/touch`, and
//! `POST /workers/{name}/unload` / `/load`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::error::{ApiError, ErrorBody, PathName};
use crate::arbiter::services::{ServiceHandle, ServiceState, ServiceStatus};
use crate::protocol::GrantEvent;
use crate::AppState;

/// Every service: state, pid, uptime, last use, measured VRAM, last error.
#[utoipa::path(get, path = "/services", responses(
    (status = 200, description = "Services", body = Object),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn list(State(app): State<AppState>) -> Json<Value> {
    let services: Vec<Value> = app.arbiter.services.statuses().iter().map(view).collect();
    Json(json!({ "services": services }))
}

pub(super) fn view(s: &ServiceStatus) -> Value {
    let round = |d: f64| (d * 1000.0).round() / 1000.0;
    let mut v = serde_json::to_value(s).unwrap_or_default();
    let up = matches!(
        s.state,
        ServiceState::Starting | ServiceState::Healthy | ServiceState::Stopping
    );
    v["uptime_s"] = json!(s
        .since
        .filter(|_| up)
        .map(|t| round(t.elapsed().as_secs_f64())));
    v["last_use_s_ago"] = json!(s.last_use.map(|t| round(t.elapsed().as_secs_f64())));
    v
}

fn service(app: &AppState, name: &str) -> Result<ServiceHandle, ApiError> {
    app.arbiter.services.get(name).cloned().ok_or_else(|| {
        let known = app.arbiter.services.statuses().into_iter().map(|s| s.name);
        unknown(
            "no_such_service",
            "service",
            name,
            known,
            "none ([[services]] in the config)",
        )
    })
}

/// Starts the service through the GPU queue, or answers at once when it is healthy. However
/// many callers ask at once, one process starts and every caller sees the same outcome.
#[utoipa::path(post, path = "/services/{name}/start", params(("name" = String, Path, description = "Service name")), responses(
    (status = 200, description = "NDJSON `GrantEvent`s ending in `healthy` or `error`", content_type = "application/x-ndjson", body = String),
    (status = 404, description = "No such service", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn start(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Response, ApiError> {
    let handle = service(&app, &name)?;
    let joined = handle.start();
    let mut events = joined.events;
    let status = handle.status();
    // The service's events, as every NDJSON stream takes them (heartbeats included): a task
    // passes them on until the final one, or until the client is gone.
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        if status.state == ServiceState::Healthy {
            handle.touch();
            let healthy = GrantEvent::Healthy {
                pid: status.pid,
                seconds: 0.0,
            };
            let _ = tx.send(healthy).await;
            return;
        }
        // Joining a start under way: where it is now, then (heartbeats) said again while it
        // stays there. Joining a stop: this start waits for it (its grace, its teardown), and
        // says so rather than nothing until then.
        let now = joined.now.or_else(|| {
            (status.state == ServiceState::Stopping).then(|| GrantEvent::Queued {
                position: 1,
                waiting_for: Some(format!(
                    "service {} to finish stopping (it starts again after)",
                    status.name
                )),
            })
        });
        if let Some(now) = now {
            if tx.send(now).await.is_err() {
                return;
            }
        }
        // Joined during a failed start's teardown: its `error` is not this caller's answer.
        let mut skip_final = joined.skip_final;
        loop {
            // A client that leaves stops listening at once, not at the next event: a start
            // nobody listens to any more leaves the queue.
            let received = tokio::select! {
                received = events.recv() => received,
                _ = tx.closed() => return,
            };
            let event = match received {
                Ok(event) => event,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => GrantEvent::Error {
                    code: "shutting_down".into(),
                    message: "gpuhost is shutting down".into(),
                },
            };
            let last = event.is_final();
            if last && std::mem::take(&mut skip_final) {
                continue;
            }
            if tx.send(event).await.is_err() || last {
                return;
            }
        }
    });
    let heartbeat = std::time::Duration::from_secs_f64(app.config.http.heartbeat_s);
    Ok(super::ndjson::from_channel(rx, heartbeat))
}

/// Stops the service (release call, signal → grace → kill, verified teardown) and waits for it.
#[utoipa::path(post, path = "/services/{name}/stop", params(("name" = String, Path, description = "Service name")), responses(
    (status = 200, description = "Stopped (or failed: see `last_error`)", body = Object),
    (status = 404, description = "No such service", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn stop(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Json<Value>, ApiError> {
    let handle = service(&app, &name)?;
    let status = handle.stop_and_wait("stopped by request").await;
    Ok(Json(view(&status)))
}

/// Marks the service as used now (it will not be stopped as idle or to make room for a while).
#[utoipa::path(post, path = "/services/{name}/touch", params(("name" = String, Path, description = "Service name")), responses(
    (status = 200, description = "Touched", body = Object),
    (status = 404, description = "No such service", body = ErrorBody),
    (status = 409, description = "The service is stopped, stopping or failed", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn touch(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Json<Value>, ApiError> {
    let handle = service(&app, &name)?;
    // Checked before and after: a stop that began meanwhile dropped the touch.
    not_running(&name, handle.status().state)?;
    handle.touch();
    let status = handle.status();
    not_running(&name, status.state)?;
    Ok(Json(view(&status)))
}

/// 409 for a service that is stopped, stopping or failed: a caller that marks use of a
/// service that does not run is about to call a dead URL, and a 200 would tell it all is well.
fn not_running(name: &str, state: ServiceState) -> Result<(), ApiError> {
    let said = match state {
        ServiceState::Stopped => "stopped",
        ServiceState::Stopping => "stopping",
        ServiceState::Failed => "failed",
        ServiceState::Queued | ServiceState::Starting | ServiceState::Healthy => return Ok(()),
    };
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "not_running",
        format!(
            "service {name} is {said}: nothing to mark as used; POST /services/{name}/start starts it"
        ),
    ))
}

fn worker(app: &AppState, name: &str) -> Result<crate::worker::WorkerHandle, ApiError> {
    app.supervisor.get(name).cloned().ok_or_else(|| {
        let known = app.supervisor.statuses().into_iter().map(|s| s.name);
        unknown("no_such_worker", "worker", name, known, "none")
    })
}

/// 404 `code` for the `what` called `name`, naming the `known` ones (`none` when there are none).
fn unknown(
    code: &'static str,
    what: &str,
    name: &str,
    known: impl Iterator<Item = String>,
    none: &str,
) -> ApiError {
    let known: Vec<String> = known.collect();
    let listed = if known.is_empty() {
        none.to_string()
    } else {
        known.join(", ")
    };
    ApiError::new(
        StatusCode::NOT_FOUND,
        code,
        format!("no {what} `{name}`; configured: {listed}"),
    )
}

/// Unloads a worker (its process stops; it reloads at the next job or on `/load`).
#[utoipa::path(post, path = "/workers/{name}/unload", params(("name" = String, Path, description = "Worker name")), responses(
    (status = 200, description = "Unloaded", body = Object),
    (status = 404, description = "No such worker", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn unload(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Json<Value>, ApiError> {
    let handle = worker(&app, &name)?;
    let pid = handle.unload().await;
    Ok(Json(
        json!({ "worker": name, "stopped_pid": pid, "state": handle.status().state }),
    ))
}

/// Loads an unloaded resident worker now, unless its GPU is held for a lease or a service (and
/// it did not say it runs on the CPU).
#[utoipa::path(post, path = "/workers/{name}/load", params(("name" = String, Path, description = "Worker name")), responses(
    (status = 200, description = "Loading", body = Object),
    (status = 404, description = "No such worker", body = ErrorBody),
    (status = 409, description = "A one-shot worker (nothing to load), or its GPU is held for a lease or a service (not for a worker on the CPU)", body = ErrorBody),
    super::openapi::GuardErrors,
), security(("bearer" = [])))]
pub(super) async fn load(
    State(app): State<AppState>,
    PathName(name): PathName,
) -> Result<Json<Value>, ApiError> {
    let handle = worker(&app, &name)?;
    let conflict = |why: String| ApiError::new(StatusCode::CONFLICT, "cannot_load", why);
    if handle.status().mode == crate::config::Mode::Oneshot {
        // Started by hand it stayed loaded, and no holder of the GPU unloaded it.
        return Err(conflict(format!(
            "worker `{name}` is one-shot: it starts for each job and exits after it, so there \
             is nothing to load"
        )));
    }
    // Loaded beside a lease's program or a service, it would take their memory: it loads again
    // by itself once the GPU is released. One that said it runs on the CPU takes none.
    let on_cpu = handle.status().runs_on_cpu();
    let core = app.arbiter.core_for(handle.device()).filter(|_| !on_cpu);
    if let Some(why) = core.and_then(|core| core.held_reason()) {
        return Err(conflict(format!(
            "worker `{name}` is not loaded now: {why}; it loads again once that is over"
        )));
    }
    handle.load();
    // The answer says what the load did (`starting`), not the state before the worker's task
    // took it up.
    let moved = handle.wait_for_state(|s| s.state != crate::worker::WorkerState::Unloaded);
    let _ = tokio::time::timeout(std::time::Duration::from_millis(500), moved).await;
    Ok(Json(
        json!({ "worker": name, "state": handle.status().state }),
    ))
}
