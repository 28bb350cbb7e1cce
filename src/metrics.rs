//! `GET /metrics` in the OpenMetrics text format (`prometheus-client`): GPUs, GPU processes,
//! workers, services, queue and jobs, read from the live state at each scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::gpu::Decision;
use crate::worker::WorkerState;
use crate::App;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;
type Counters = Family<Labels, Counter<f64, AtomicU64>>;

/// A registry built for one scrape: each family is registered once and filled from the state.
struct Scrape(Registry);

impl Scrape {
    fn gauges(&mut self, name: &str, help: &str) -> Gauges {
        let family = Gauges::default();
        self.0.register(name, help, family.clone());
        family
    }

    /// One label-less gauge.
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let gauge = Gauge::<f64, AtomicU64>::default();
        gauge.set(value);
        self.0.register(name, help, gauge);
    }

    /// A counter family; the encoder appends `_total` to `name`.
    fn counters(&mut self, name: &str, help: &str) -> Counters {
        let family = Counters::default();
        self.0.register(name, help, family.clone());
        family
    }
}

fn set(family: &Gauges, labels: Labels, value: f64) {
    family.get_or_create(&escaped(labels)).set(value);
}

fn count(family: &Counters, labels: Labels, value: f64) {
    family.get_or_create(&escaped(labels)).inc_by(value);
}

/// Label values as the text format writes them (`\\`, `\"`, `\n`): `prometheus-client` writes
/// them as given, and a process name is whatever its owner chose (`x"} 1` broke every scrape,
/// a newline in a `comm` forged lines).
fn escaped(labels: Labels) -> Labels {
    labels
        .into_iter()
        .map(|(key, value)| {
            let mut out = String::with_capacity(value.len());
            for c in value.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            (key, out)
        })
        .collect()
}

fn flag(on: bool) -> f64 {
    f64::from(u8::from(on))
}

const MIB: f64 = 1048576.0;

pub fn render(app: &App) -> String {
    let workers = app.supervisor.statuses();
    let status = app.gpu_view(&workers);
    let mut scrape = Scrape(Registry::default());

    let sample_ok = scrape.gauges(
        "gpuhost_gpu_sample_ok",
        "1 when the last GPU sample succeeded and is fresh",
    );
    let backend = status.backend.active.to_string();
    set(
        &sample_ok,
        vec![("backend", backend)],
        flag(status.error.is_none()),
    );
    let decision = scrape.gauges("gpuhost_gpu_decision", "The scheduling decision, one-hot");
    for d in [
        Decision::Idle,
        Decision::Loading,
        Decision::Busy,
        Decision::Unknown,
    ] {
        set(
            &decision,
            vec![("decision", serde_name(d))],
            flag(status.decision == d),
        );
    }

    let gpus = if status.error.is_some() {
        &[][..]
    } else {
        &status.gpus[..]
    };
    type GpuField = fn(&crate::gpu::GpuInfo) -> f64;
    let per_gpu: [(&str, &str, GpuField); 5] = [
        ("gpuhost_gpu_utilization_percent", "GPU utilization", |g| {
            f64::from(g.utilization)
        }),
        ("gpuhost_gpu_memory_used_bytes", "GPU memory in use", |g| {
            g.memory_used_mib as f64 * MIB
        }),
        (
            "gpuhost_gpu_memory_total_bytes",
            "GPU memory installed",
            |g| g.memory_total_mib as f64 * MIB,
        ),
        ("gpuhost_gpu_temperature_celsius", "GPU temperature", |g| {
            f64::from(g.temperature)
        }),
        ("gpuhost_gpu_power_watts", "GPU power draw", |g| {
            g.power_draw
        }),
    ];
    for (name, help, get) in per_gpu {
        let family = scrape.gauges(name, help);
        for g in gpus {
            let labels = vec![
                ("gpu", g.index.to_string()),
                ("uuid", g.uuid.clone()),
                ("name", g.name.clone()),
            ];
            set(&family, labels, get(g));
        }
    }
    let process_memory =
        scrape.gauges("gpuhost_gpu_process_memory_bytes", "GPU memory per process");
    for p in &status.processes {
        let labels = vec![
            ("gpu", p.gpu_index.to_string()),
            ("pid", p.pid.to_string()),
            ("name", p.name.clone()),
            ("worker", p.worker.clone().unwrap_or_default()),
            ("service", p.service.clone().unwrap_or_default()),
        ];
        // Added up: one pid may be listed twice on one GPU (MIG instances), and a second
        // `set` kept only the last of them.
        process_memory
            .get_or_create(&escaped(labels))
            .inc_by(p.used_memory_mib as f64 * MIB);
    }

    let state = scrape.gauges("gpuhost_worker_state", "Worker state, one-hot");
    let tasks = scrape.counters(
        "gpuhost_worker_tasks",
        "Tasks a worker finished, by outcome",
    );
    let restarts = scrape.counters(
        "gpuhost_worker_restarts",
        "Worker restarts after a crash, hang or failed load",
    );
    for w in &workers {
        for s in [
            WorkerState::Starting,
            WorkerState::Ready,
            WorkerState::Busy,
            WorkerState::Exited,
            WorkerState::Idle,
            WorkerState::Unloaded,
            WorkerState::Stopped,
        ] {
            let labels = vec![("worker", w.name.clone()), ("state", serde_name(s))];
            set(&state, labels, flag(w.state == s));
        }
        for (outcome, n) in [
            ("ok", w.tasks_done),
            ("error", w.tasks_failed),
            ("refused", w.tasks_refused),
            ("cancelled", w.tasks_cancelled),
        ] {
            let labels = vec![("worker", w.name.clone()), ("outcome", outcome.into())];
            count(&tasks, labels, n as f64);
        }
        count(
            &restarts,
            vec![("worker", w.name.clone())],
            w.restarts as f64,
        );
    }

    let waiting = scrape.gauges(
        "gpuhost_queue_waiting",
        "Requests waiting for the GPU: jobs, service starts, leases",
    );
    let running = scrape.gauges(
        "gpuhost_queue_running",
        "Holders of the GPU now: jobs, services, leases",
    );
    let blocked = scrape.gauges(
        "gpuhost_gpu_blocked",
        "1 while nothing is granted because a holder's memory did not come back",
    );
    for core in &app.arbiter.cores {
        let gpu = || vec![("gpu", core.device.to_string())];
        set(&waiting, gpu(), core.queue.waiting() as f64);
        set(&running, gpu(), core.queue.running() as f64);
        set(
            &blocked,
            gpu(),
            flag(core.queue.blocked_on_memory().is_some()),
        );
    }
    let leases = app.arbiter.leases.list().len() as f64;
    scrape.gauge(
        "gpuhost_leases",
        "GPU leases held by outside programs",
        leases,
    );

    let service_state = scrape.gauges(
        "gpuhost_service_state",
        "1 for the state each on-demand service is in",
    );
    let starts = scrape.counters(
        "gpuhost_service_starts",
        "Processes started per on-demand service",
    );
    for s in &app.arbiter.services.statuses() {
        let labels = vec![("service", s.name.clone()), ("state", serde_name(s.state))];
        set(&service_state, labels, 1.0);
        count(&starts, vec![("service", s.name.clone())], s.starts as f64);
    }

    let stats = &app.stats;
    let outcomes = scrape.counters("gpuhost_jobs", "Pipeline jobs by outcome");
    for (outcome, n) in [
        ("ok", &stats.succeeded),
        ("error", &stats.failed),
        ("refused", &stats.refused),
        ("cancelled", &stats.cancelled),
    ] {
        count(
            &outcomes,
            vec![("outcome", outcome.into())],
            n.load(Ordering::Relaxed) as f64,
        );
    }
    scrape.0.register(
        "gpuhost_job_duration_seconds",
        "Time pipeline jobs held the GPU",
        stats.durations.clone(),
    );

    let mut out = String::with_capacity(8192);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &scrape.0);
    out
}

/// The name serde gives an enum variant (`"idle"`, `"ready"`): the label value a client also
/// sees in the JSON endpoints.
fn serde_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_cannot_break_out_of_their_quotes() {
        let mut scrape = Scrape(Registry::default());
        let family = scrape.gauges("g", "a gauge");
        set(&family, vec![("name", "x\"} 1\\\nforged 2".into())], 1.0);
        let mut text = String::new();
        encode(&mut text, &scrape.0).unwrap();
        assert!(
            text.contains(r#"g{name="x\"} 1\\\nforged 2"} 1.0"#),
            "{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");
    }
}
