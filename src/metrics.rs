//! `GET /metrics` in the Prometheus text format: GPUs, GPU processes, workers, queue and jobs.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::gpu::Decision;
use crate::worker::WorkerState;
use crate::App;

/// Escapes a label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, String)], value: f64) {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label(v)))
            .collect();
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{}}} {value}", labels.join(","));
        }
    }
}

pub fn render(app: &App) -> String {
    let workers = app.supervisor.statuses();
    let status = app.gpu.view(&workers);
    let mut out = Out(String::with_capacity(4096));

    out.family(
        "gpuhost_gpu_sample_ok",
        "gauge",
        "1 when the last GPU sample succeeded and is fresh",
    );
    out.sample(
        "gpuhost_gpu_sample_ok",
        &[("backend", status.backend.active.to_string())],
        f64::from(u8::from(status.error.is_none())),
    );
    out.family(
        "gpuhost_gpu_decision",
        "gauge",
        "The scheduling decision, one-hot",
    );
    for d in [
        Decision::Idle,
        Decision::Loading,
        Decision::Busy,
        Decision::Unknown,
    ] {
        let name = serde_name(d);
        out.sample(
            "gpuhost_gpu_decision",
            &[("decision", name)],
            f64::from(u8::from(status.decision == d)),
        );
    }
    let gpus = if status.error.is_some() {
        Vec::new()
    } else {
        status.gpus.clone()
    };
    type GpuField = fn(&crate::gpu::GpuInfo) -> f64;
    let per_gpu: [(&str, &str, GpuField); 5] = [
        ("gpuhost_gpu_utilization_percent", "GPU utilization", |g| {
            f64::from(g.utilization)
        }),
        ("gpuhost_gpu_memory_used_bytes", "GPU memory in use", |g| {
            g.memory_used_mib as f64 * 1048576.0
        }),
        (
            "gpuhost_gpu_memory_total_bytes",
            "GPU memory installed",
            |g| g.memory_total_mib as f64 * 1048576.0,
        ),
        ("gpuhost_gpu_temperature_celsius", "GPU temperature", |g| {
            f64::from(g.temperature)
        }),
        ("gpuhost_gpu_power_watts", "GPU power draw", |g| {
            g.power_draw
        }),
    ];
    for (name, help, get) in per_gpu {
        out.family(name, "gauge", help);
        for g in &gpus {
            let labels = [
                ("gpu", g.index.to_string()),
                ("uuid", g.uuid.clone()),
                ("name", g.name.clone()),
            ];
            out.sample(name, &labels, get(g));
        }
    }
    out.family(
        "gpuhost_gpu_process_memory_bytes",
        "gauge",
        "GPU memory per process",
    );
    for p in &status.processes {
        let labels = [
            ("gpu", p.gpu_index.to_string()),
            ("pid", p.pid.to_string()),
            ("name", p.name.clone()),
            ("worker", p.worker.clone().unwrap_or_default()),
        ];
        out.sample(
            "gpuhost_gpu_process_memory_bytes",
            &labels,
            p.used_memory_mib as f64 * 1048576.0,
        );
    }

    out.family("gpuhost_worker_state", "gauge", "Worker state, one-hot");
    for w in &workers {
        for s in [
            WorkerState::Starting,
            WorkerState::Ready,
            WorkerState::Busy,
            WorkerState::Exited,
            WorkerState::Idle,
            WorkerState::Stopped,
        ] {
            let name = serde_name(s);
            out.sample(
                "gpuhost_worker_state",
                &[("worker", w.name.clone()), ("state", name)],
                f64::from(u8::from(w.state == s)),
            );
        }
    }
    out.family(
        "gpuhost_worker_jobs_total",
        "counter",
        "Jobs a worker finished, by outcome",
    );
    for w in &workers {
        out.sample(
            "gpuhost_worker_jobs_total",
            &[("worker", w.name.clone()), ("outcome", "ok".into())],
            w.jobs_done as f64,
        );
        out.sample(
            "gpuhost_worker_jobs_total",
            &[("worker", w.name.clone()), ("outcome", "error".into())],
            w.jobs_failed as f64,
        );
        out.sample(
            "gpuhost_worker_jobs_total",
            &[("worker", w.name.clone()), ("outcome", "cancelled".into())],
            w.jobs_cancelled as f64,
        );
    }
    out.family(
        "gpuhost_worker_restarts_total",
        "counter",
        "Worker restarts after a crash, hang or failed load",
    );
    for w in &workers {
        out.sample(
            "gpuhost_worker_restarts_total",
            &[("worker", w.name.clone())],
            w.restarts as f64,
        );
    }

    out.family("gpuhost_queue_waiting", "gauge", "Jobs waiting for the GPU");
    out.sample("gpuhost_queue_waiting", &[], app.queue.waiting() as f64);
    out.family("gpuhost_queue_running", "gauge", "Jobs holding the GPU");
    out.sample("gpuhost_queue_running", &[], app.queue.running() as f64);

    out.family(
        "gpuhost_leases",
        "gauge",
        "GPU leases held by outside programs",
    );
    out.sample(
        "gpuhost_leases",
        &[],
        app.arbiter.leases.list().len() as f64,
    );
    out.family(
        "gpuhost_gpu_blocked",
        "gauge",
        "1 while nothing is granted because a holder's memory did not come back",
    );
    out.sample(
        "gpuhost_gpu_blocked",
        &[],
        f64::from(u8::from(app.queue.blocked().is_some())),
    );
    let services = app.arbiter.services.statuses();
    out.family(
        "gpuhost_service_state",
        "gauge",
        "1 for the state each on-demand service is in",
    );
    for s in &services {
        out.sample(
            "gpuhost_service_state",
            &[("service", s.name.clone()), ("state", serde_name(s.state))],
            1.0,
        );
    }
    out.family(
        "gpuhost_service_starts_total",
        "counter",
        "Processes started per on-demand service",
    );
    for s in &services {
        out.sample(
            "gpuhost_service_starts_total",
            &[("service", s.name.clone())],
            s.starts as f64,
        );
    }

    let stats = &app.stats;
    let (ok, failed) = (
        stats.succeeded.load(Ordering::Relaxed),
        stats.failed.load(Ordering::Relaxed),
    );
    out.family("gpuhost_jobs_total", "counter", "Pipeline jobs by outcome");
    out.sample("gpuhost_jobs_total", &[("outcome", "ok".into())], ok as f64);
    out.sample(
        "gpuhost_jobs_total",
        &[("outcome", "error".into())],
        failed as f64,
    );
    out.sample(
        "gpuhost_jobs_total",
        &[("outcome", "cancelled".into())],
        stats.cancelled.load(Ordering::Relaxed) as f64,
    );
    out.family(
        "gpuhost_job_duration_seconds",
        "histogram",
        "Time pipeline jobs held the GPU",
    );
    for (le, n) in stats.cumulative() {
        out.sample(
            "gpuhost_job_duration_seconds_bucket",
            &[("le", format!("{le}"))],
            n as f64,
        );
    }
    out.sample(
        "gpuhost_job_duration_seconds_bucket",
        &[("le", "+Inf".into())],
        stats.total() as f64,
    );
    out.sample(
        "gpuhost_job_duration_seconds_sum",
        &[],
        stats.busy_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
    out.sample(
        "gpuhost_job_duration_seconds_count",
        &[],
        stats.total() as f64,
    );
    out.0
}

/// The name serde gives an enum variant (`"idle"`, `"ready"`): the label value a client also
/// sees in the JSON endpoints.
fn serde_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
