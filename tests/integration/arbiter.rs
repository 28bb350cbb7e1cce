//! GPU arbitration with fake services (stdlib HTTP servers that "load" like vLLM, holding fake GPU
//! memory the fake `nvidia-smi` reports while they live): single-flight starts, leases that make
//! room, release calls, stubborn services, memory that never comes back, TTL reclaim, FIFO order
//! across kinds, and idle stops.

use std::time::{Duration, Instant};

use gpuhost::protocol::{ClientEvent, GrantEvent};
use serde_json::{json, Value};

use super::gpu_status::FakeGpu;
use super::support::*;

const IDLE: &str = "gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `[[services]]` entry running the fake service on a free port.
pub(super) fn service(gpu: &FakeGpu, name: &str, flags: &str, extra: &str) -> String {
    let port = free_port();
    let state = gpu.dir.path().display().to_string();
    let mut argv = vec![
        python(),
        fixture("fake_service.py").display().to_string(),
        port.to_string(),
        state,
    ];
    argv.extend(flags.split_whitespace().map(String::from));
    format!(
        "[[services]]\nname = {name:?}\ncommand = {argv:?}\nhealth_url = \"http://127.0.0.1:{port}/health\"\npoll_interval_s = 0.1\nstart_timeout_s = 20\nstop_grace_s = 1\n{extra}\n"
    )
}

/// A one-second job sent with `query`, once its stage has started.
async fn running_job(host: &TestHost, query: &str) -> EventReader {
    let mut job = EventReader::new(
        host.post(&format!("/transcribe{query}"))
            .body(wav(1.0, 16_000, 1))
            .send()
            .await
            .unwrap(),
    );
    let first = job.next().await;
    assert!(matches!(&first, Some(e) if started(e)), "{first:?}");
    job
}

/// Two idle GPUs, GPU 0 with the more free memory.
const TWO_GPUS: &str = "gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\ngpu: NVIDIA RTX A4000, 0, 300, 16376, 35, 20.0\n";

pub(super) fn arbiter_config(gpu: &FakeGpu, rest: &str) -> String {
    format!(
        "[pipeline]\nstages = [\"w\"]\n{}\n[arbiter]\nteardown_timeout_s = 3\n{}\n{rest}",
        fake_worker("w", ""),
        gpu.config("")
    )
}

/// A host on `gpu` with one fake worker and no services, its worker ready.
async fn arbiter_host(gpu: &FakeGpu) -> TestHost {
    TestHost::start(&arbiter_config(gpu, ""))
        .await
        .ready()
        .await
}

/// `POST /gpu/lease` for `holder`, without waiting: the response.
async fn lease_as(host: &TestHost, holder: &str) -> reqwest::Response {
    host.post("/gpu/lease")
        .json(&json!({ "holder": holder }))
        .send()
        .await
        .unwrap()
}

pub(super) async fn grant_events(response: reqwest::Response) -> Vec<GrantEvent> {
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let events: Vec<GrantEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    assert_eq!(
        events.iter().filter(|e| e.is_final()).count(),
        1,
        "{events:?}"
    );
    events
}

/// Asserts that a grant stream ended with the service healthy.
#[track_caller]
fn assert_healthy(events: &[GrantEvent]) {
    assert!(
        matches!(events.last(), Some(GrantEvent::Healthy { .. })),
        "{events:?}"
    );
}

/// Asserts that a grant stream ended with the GPU granted.
#[track_caller]
pub(super) fn assert_granted(events: &[GrantEvent]) {
    assert!(
        matches!(events.last(), Some(GrantEvent::Granted { .. })),
        "{events:?}"
    );
}

/// `POST /services/{name}/start`: its events, to the last.
async fn start_service(host: &TestHost, name: &str) -> Vec<GrantEvent> {
    grant_events(
        host.post(&format!("/services/{name}/start"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

fn starts(gpu: &FakeGpu) -> usize {
    std::fs::read_to_string(gpu.dir.path().join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

async fn status(host: &TestHost) -> Value {
    host.get("/status")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn wait_status(host: &TestHost, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = status(host).await;
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn service_state(s: &Value, name: &str) -> String {
    s["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .map(|v| v["state"].as_str().unwrap().to_string())
        .unwrap()
}

#[tokio::test]
async fn twenty_concurrent_starts_start_one_process() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, &service(&gpu, "llm", "--load-s 1 --mib 20000", ""));
    let host = TestHost::start(&config).await.ready().await;
    let calls = (0..20).map(|_| {
        let request = host.post("/services/llm/start");
        async move { grant_events(request.send().await.unwrap()).await }
    });
    let outcomes = futures_util::future::join_all(calls).await;
    for events in &outcomes {
        assert_healthy(events);
    }
    assert_eq!(starts(&gpu), 1, "exactly one process for 20 callers");
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("gpuhost_service_starts_total{service=\"llm\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpuhost_service_state{service=\"llm\",state=\"healthy\"} 1"),
        "{metrics}"
    );
    // While loading the service held the GPU: /status said busy even before its memory showed.
    let s = wait_status(&host, "the service's memory in the sample", |s| {
        s["gpu"]["memory_used_mib"].as_u64() > Some(20_000)
    })
    .await;
    assert_eq!(
        (s["decision"].as_str(), s["is_idle"].as_bool()),
        (Some("busy"), Some(false))
    );
    assert!(
        s["reason"].as_str().unwrap().contains("service llm"),
        "{s:#}"
    );
    // Its process is named as gpuhost's service, in /status and in /metrics.
    assert_eq!(s["processes"][0]["service"], "llm", "{s:#}");
    let metrics = host.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpuhost_gpu_process_memory_bytes")
                && l.contains("service=\"llm\"")),
        "{metrics}"
    );
    // Already healthy: answered at once, still one process.
    let events = start_service(&host, "llm").await;
    assert!(matches!(events.as_slice(), [GrantEvent::Healthy { .. }]));
    assert_eq!(starts(&gpu), 1);
    let stopped: Value = host
        .post("/services/llm/stop")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    let s = status(&host).await;
    assert!(
        s["gpu"]["memory_used_mib"].as_u64().unwrap() < 1000,
        "memory back: {s:#}"
    );
    assert!(s["holders"].as_array().unwrap().is_empty());
    host.stop().await;
}

#[tokio::test]
async fn a_lease_makes_room_and_residents_come_back_after_it() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let old_pid = host.worker("w").await["pid"].as_u64().unwrap();
    let (lease_id, events) = granted_lease(
        &host,
        json!({"holder": "alice", "purpose": "training", "wait": true, "ttl_s": 30}),
    )
    .await;
    assert!(
        events.iter().any(|e| matches!(e, GrantEvent::MakingRoom { action, target } if action == "unload" && target == "worker w")),
        "{events:?}"
    );
    assert_eq!(host.worker("w").await["state"], "unloaded");
    let s = status(&host).await;
    assert_eq!(s["decision"], "busy");
    assert!(
        s["reason"].as_str().unwrap().contains("alice: training"),
        "{s:#}"
    );
    // /health and /metrics say what /status says, though the sample shows nothing yet.
    let health = host.get_json("/health").await;
    assert_eq!(health["gpu"]["decision"], "busy", "{health:#}");
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("gpuhost_gpu_decision{decision=\"busy\"} 1"),
        "{metrics}"
    );
    assert_eq!(s["leases"][0]["holder"], "alice");
    // Renew, then release: the worker reloads (a new process).
    let renewed = host
        .post(&format!("/gpu/lease/{lease_id}/renew"))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), 200);
    assert_eq!(release(&host, lease_id).await, 200);
    let handle = host.state.supervisor.get("w").unwrap();
    tokio::time::timeout(
        Duration::from_secs(15),
        handle.wait_for_state(|s| s.state == gpuhost::worker::WorkerState::Ready),
    )
    .await
    .expect("the worker reloads after the lease");
    assert_ne!(host.worker("w").await["pid"].as_u64().unwrap(), old_pid);
    assert_eq!(release(&host, lease_id).await, 404);
    host.stop().await;
}

/// The config line of a fake worker that says, after `ready`, that it runs on the CPU.
const SAYS_CPU: &str = "env = { FAKE_READY_META = '{\"protocol\":1,\"device\":\"cpu\"}' }";

#[tokio::test]
async fn workers_on_the_cpu_are_not_unloaded_and_their_jobs_run_beside_a_lease() {
    let gpu = FakeGpu::new(IDLE);
    let said = |device: &str| {
        format!("env = {{ FAKE_READY_META = '{{\"protocol\":1,\"device\":\"{device}\"}}' }}")
    };
    let config = format!(
        "[limits]\nmax_queue = 1\n[pipeline]\nstages = [\"g\", \"c\"]\n{}{}\n[arbiter]\nteardown_timeout_s = 3\n{}",
        fake_worker("g", &said("cuda")),
        fake_worker("c", &said("cpu/int8")),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let cpu_pid = host.worker("c").await["pid"].as_u64().unwrap();
    // A lease that names no memory: every idle worker on the GPU unloads, not the one on the CPU.
    let (lease_id, events) = granted_lease(&host, json!({"holder": "alice", "wait": true})).await;
    let unloaded: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            GrantEvent::MakingRoom { action, target } if action == "unload" => {
                Some(target.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(unloaded, ["worker g"], "{events:?}");
    assert_eq!(host.worker("g").await["state"], "unloaded");
    let c = host.worker("c").await;
    assert_eq!(c["state"], "ready", "{c:#}");
    assert_eq!(
        c["pid"].as_u64(),
        Some(cpu_pid),
        "not restarted either: {c:#}"
    );
    // A job of that worker alone takes nothing of the GPU: it runs beside the lease at once,
    // and /status says what it is while it runs.
    let mut beside = running_job(&host, "?stages=c&prompt=fake:sleep=1500").await;
    let holders = status(&host).await["holders"].to_string();
    assert!(holders.contains("speech job on the CPU"), "{holders}");
    let last = beside.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    // Unloaded (by hand, or idle), it still said where it runs: it may be loaded by hand
    // beside the lease (the one on the GPU may not), and its next job runs beside the lease too.
    let unloaded = host.post("/workers/c/unload").send().await.unwrap();
    assert_eq!(unloaded.status(), 200);
    let refused = host.post("/workers/g/load").send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let loaded = host.post("/workers/c/load").send().await.unwrap();
    assert_eq!(loaded.status(), 200);
    wait_for("c to be loaded again", Duration::from_secs(10), || async {
        host.worker("c").await["state"] == "ready"
    })
    .await;
    let unloaded = host.post("/workers/c/unload").send().await.unwrap();
    assert_eq!(unloaded.status(), 200);
    let events = host.transcribe("?stages=c", wav(1.0, 16_000, 1)).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ClientEvent::Queued { .. })),
        "{events:?}"
    );
    let _ = result_of(&events);
    // One that needs the other worker, unloaded for the lease, waits for the lease as ever.
    let mut waits = EventReader::new(
        host.post("/transcribe?stages=g,c")
            .body(wav(1.0, 16_000, 1))
            .send()
            .await
            .unwrap(),
    );
    let queued = waits.next().await;
    assert!(
        matches!(&queued, Some(ClientEvent::Queued { waiting_for: Some(w), .. }) if w.contains("alice")),
        "{queued:?}"
    );
    // That one fills the queue (limits.max_queue = 1); a job on the CPU goes past it all the
    // same, not refused as if it had to wait.
    let events = host.transcribe("?stages=c", wav(1.0, 16_000, 1)).await;
    let _ = result_of(&events);
    assert_eq!(release(&host, lease_id).await, 200);
    let last = waits.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    host.stop().await;
}

#[tokio::test]
async fn a_speech_job_on_the_gpu_makes_status_busy_before_its_worker_touches_it() {
    // /status said `idle` while a job held the GPU: a one-shot worker granted the GPU has not
    // loaded yet, and a script that starts vLLM on `idle` starts it beside the worker.
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // (After the quiet period that follows the start.)
    wait_status(&host, "idle", |s| s["decision"] == "idle").await;
    let mut job = running_job(&host, "?prompt=fake:sleep=1500").await;
    let status = host.get_json("/status").await;
    assert_eq!(
        (&status["decision"], &status["is_idle"]),
        (&json!("busy"), &json!(false)),
        "{status:#}"
    );
    assert!(
        status["reason"]
            .as_str()
            .is_some_and(|r| r.contains("speech job")),
        "{status:#}"
    );
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    wait_status(&host, "the GPU idle again", |s| s["decision"] == "idle").await;
    host.stop().await;
}

#[tokio::test]
async fn a_job_on_the_cpu_leaves_its_gpu_free_for_any_lease_and_says_so_in_the_history() {
    // GPU 0 has the most free memory; only a speech job on the CPU holds its queue.
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n[pipeline]\nstages = [\"c\"]\n{}\n[arbiter]\nteardown_timeout_s = 3\n{}",
        fake_worker("c", SAYS_CPU),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let mut job = running_job(&host, "?prompt=fake:sleep=2000").await;
    // It takes no part of the GPU: /status does not call the GPU busy for it.
    let status = host.get_json("/status").await;
    assert_eq!(
        status["devices"][0]["busy_reason"],
        Value::Null,
        "{status:#}"
    );
    let any = host
        .post("/gpu/lease")
        .json(&json!({"holder": "y", "vram_mib": 1000, "device": "any"}))
        .send()
        .await
        .unwrap();
    assert_eq!(any.status(), 200);
    let held = leases(&host).await;
    assert_eq!(
        held[0]["device"], 0,
        "the job takes none of GPU 0: {held:?}"
    );
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    // The history records the job as one on the CPU, with no GPU memory credited to it.
    let history: Value = host
        .get("/gpu/history")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let grants = history["grants"].as_array().unwrap();
    let job = grants.iter().find(|g| g["kind"] == "job").unwrap();
    assert_eq!(
        (&job["on_cpu"], &job["peak_mib"]),
        (&json!(true), &Value::Null),
        "{history:#}"
    );
    let lease = grants.iter().find(|g| g["kind"] == "lease").unwrap();
    assert_eq!(lease["on_cpu"], false, "{history:#}");
    host.stop().await;
}

#[tokio::test]
async fn release_calls_and_stubborn_services_are_torn_down() {
    let gpu = FakeGpu::new(IDLE);
    let release = service(
        &gpu,
        "comfy",
        "--release --mib 8000",
        "release_url = \"http://127.0.0.1:{PORT}/free\"\n",
    );
    // The release URL names the service's own port.
    let port = release
        .split("127.0.0.1:")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let release = release.replace("{PORT}", &port);
    let stubborn = service(&gpu, "stubborn", "--ignore-term --mib 4000", "");
    let host = TestHost::start(&arbiter_config(&gpu, &format!("{release}{stubborn}")))
        .await
        .ready()
        .await;
    for name in ["comfy", "stubborn"] {
        let events = start_service(&host, name).await;
        assert!(
            matches!(events.last(), Some(GrantEvent::Healthy { .. })),
            "{name}: {events:?}"
        );
        let started = Instant::now();
        let stopped: Value = host
            .post(&format!("/services/{name}/stop"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(stopped["state"], "stopped", "{name}: {stopped}");
        if name == "stubborn" {
            assert!(
                started.elapsed() >= Duration::from_secs(1),
                "the grace was given"
            );
        }
    }
    let released = std::fs::read_to_string(gpu.dir.path().join("released")).unwrap();
    assert_eq!(
        released.lines().count(),
        1,
        "the release URL was called once"
    );
    assert_eq!(starts(&gpu), 2);
    host.stop().await;
}

#[tokio::test]
async fn memory_that_never_comes_back_blocks_every_grant() {
    let gpu = FakeGpu::new(IDLE);
    let host = TestHost::start(&arbiter_config(
        &gpu,
        &service(&gpu, "leaky", "--leak 9000 --mib 9000", ""),
    ))
    .await
    .ready()
    .await;
    let events = start_service(&host, "leaky").await;
    assert_healthy(&events);
    // `gpuhost stop` says the stop failed, and exits 1 (it exited 0).
    let (code, err, out) = cli(&host, &["stop", "leaky"]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("leaky: the stop failed"), "{err}");
    let stopped: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stopped["state"], "failed", "{stopped}");
    assert!(
        stopped["last_error"]
            .as_str()
            .unwrap()
            .contains("did not come back"),
        "{stopped}"
    );
    let s = status(&host).await;
    assert_eq!(s["decision"], "busy");
    assert!(
        s["reason"].as_str().unwrap().contains("service leaky"),
        "{s:#}"
    );
    // Nothing is granted meanwhile.
    let refused = lease_as(&host, "bob").await;
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("did not come back"),
        "{body}"
    );
    // Nor is the server ready: jobs would wait for a person, not for their turn.
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready = ready.text().await.unwrap();
    assert!(ready.contains("queue is blocked"), "{ready}");
    // The memory comes back (the leak ends): grants resume.
    std::fs::remove_file(gpu.procs_dir().join("leak")).unwrap();
    wait_status(&host, "the block to lift", |s| {
        s["decision"] != "busy" || s["reason"].as_str().is_some_and(|r| !r.contains("leaky"))
    })
    .await;
    let granted = lease_as(&host, "bob").await;
    assert_eq!(granted.status(), 200);
    // The service is stopped now, not `failed` for good; what happened is still told.
    wait_for("leaky stopped", Duration::from_secs(5), || async {
        first_service(&host).await["state"] == "stopped"
    })
    .await;
    let leaky = &first_service(&host).await;
    let error = leaky["last_error"].as_str().unwrap();
    assert!(error.contains("did not come back"), "{leaky}");
    assert!(error.contains("its memory came back"), "{leaky}");
    host.stop().await;
}

/// A host on `gpu` with one fake worker and service `name` (`flags` for fake_service.py).
async fn service_host(gpu: &FakeGpu, name: &str, flags: &str) -> TestHost {
    TestHost::start(&arbiter_config(gpu, &service(gpu, name, flags, "")))
        .await
        .ready()
        .await
}

/// The first service as `GET /services` shows it.
async fn first_service(host: &TestHost) -> Value {
    host.get_json("/services").await["services"][0].clone()
}

#[tokio::test]
async fn a_service_stopped_while_starting_whose_memory_stayed_is_stopped_once_it_is_back() {
    let gpu = FakeGpu::new(IDLE);
    let host = service_host(&gpu, "slow", "--load-s 30 --mib 9000").await;
    let start = tokio::spawn(host.post("/services/slow/start").send());
    wait_status(&host, "slow on the GPU", |s| {
        s["processes"].as_array().is_some_and(|p| !p.is_empty())
    })
    .await;
    // What its stop will leave (a driver leak; written by the test: a fake's own, on SIGTERM,
    // never came when a loaded machine let its grace pass first).
    std::fs::write(gpu.procs_dir().join("leak"), "0 9000\n").unwrap();
    assert_eq!(first_service(&host).await["state"], "starting");
    let stop = host.post("/services/slow/stop").send().await.unwrap();
    assert_eq!(stop.status(), 200, "{:?}", stop.text().await);
    let events = grant_events(start.await.unwrap().unwrap()).await;
    assert!(
        matches!(events.last(), Some(GrantEvent::Error { .. })),
        "{events:?}"
    );
    wait_for("its memory not back", Duration::from_secs(15), || async {
        first_service(&host).await["state"] == "failed"
    })
    .await;
    std::fs::remove_file(gpu.procs_dir().join("leak")).unwrap();
    wait_for("slow stopped", Duration::from_secs(10), || async {
        first_service(&host).await["state"] == "stopped"
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_service_that_crashed_and_left_memory_stays_failed_once_it_is_back() {
    // Only a stop asked for becomes `stopped` when its memory comes back: a crash is a failure
    // however its memory ends (helper 80 saw a crash read `stopped`).
    let gpu = FakeGpu::new(IDLE);
    let flags = "--load-s 0.1 --mib 9000 --fail-after-s 1.5";
    let host = service_host(&gpu, "crashy", flags).await;
    assert_healthy(&start_service(&host, "crashy").await);
    // What it leaves when it crashes (a driver leak).
    std::fs::write(gpu.procs_dir().join("leak"), "0 9000\n").unwrap();
    wait_for(
        "the crash's memory not back",
        Duration::from_secs(15),
        || async {
            let crashy = &first_service(&host).await;
            crashy["state"] == "failed"
                && crashy["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("did not come back"))
        },
    )
    .await;
    std::fs::remove_file(gpu.procs_dir().join("leak")).unwrap();
    wait_status(&host, "the block to lift", |s| s["decision"] != "busy").await;
    let stopped = tokio::time::timeout(
        Duration::from_secs(1),
        wait_for("crashy stopped", Duration::from_secs(2), || async {
            first_service(&host).await["state"] == "stopped"
        }),
    );
    assert!(stopped.await.is_err(), "a crash read as a stop");
    assert_eq!(first_service(&host).await["state"], "failed");
    host.stop().await;
}

/// Alice's lease for a notebook, whose program takes the memory `state` says (9512 MiB used)
/// and keeps it after the lease is given back: the status once the queue is blocked for it.
async fn outlive_a_lease(host: &TestHost, gpu: &FakeGpu, state: &str) -> Value {
    let granted: Value = host
        .post("/gpu/lease")
        .json(&json!({"holder": "alice", "purpose": "notebook"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = granted["lease_id"].as_u64().expect("a lease id");
    gpu.set_state(state);
    wait_status(host, "the program's memory in the sample", |s| {
        s["gpu"]["memory_used_mib"] == 9512
    })
    .await;
    let released = host
        .client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    wait_status(host, "the block", |s| {
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("did not come back"))
    })
    .await
}

#[tokio::test]
async fn a_program_that_outlives_its_lease_blocks_the_gpu_until_its_memory_is_back() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // The notebook takes 9 GB, and keeps it after its lease ends.
    let s = outlive_a_lease(
        &host,
        &gpu,
        "gpu: NVIDIA GeForce RTX 5090, 0, 9512, 32607, 41, 28.5\n",
    )
    .await;
    assert_eq!(s["decision"], "busy");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("the lease of alice (notebook)"),
        "{s:#}"
    );
    let refused = lease_as(&host, "bob").await;
    assert_eq!(refused.status(), 409);
    // The notebook exits: the GPU goes on.
    gpu.set_state(IDLE);
    wait_status(&host, "the block to lift", |s| s["decision"] != "busy").await;
    let granted = lease_as(&host, "bob").await;
    assert_eq!(granted.status(), 200);
    host.stop().await;
}

#[tokio::test]
async fn hidden_command_lines_stay_out_of_a_blocked_gpus_reason() {
    let gpu = FakeGpu::new(IDLE);
    let config =
        arbiter_config(&gpu, "").replace("[gpu.status]\n", "[gpu.status]\nhide_commands = true\n");
    let host = TestHost::start(&config).await.ready().await;
    gpu.process(4242, 1, &["python3", "train.py", "--api-key=hunter2"]);
    let s = outlive_a_lease(
        &host,
        &gpu,
        "gpu: NVIDIA GeForce RTX 5090, 0, 9512, 32607, 41, 28.5\nproc: 4242, python3, 9000\n",
    )
    .await;
    let reason = s["reason"].as_str().unwrap();
    // The holder by pid and name: its command line was in the reason, hidden everywhere else.
    assert!(reason.contains("pid 4242 9000 MiB: python3"), "{reason}");
    let leases = host.get_text("/gpu/leases").await;
    for text in [reason, &leases, &s.to_string()] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    host.stop().await;
}

#[tokio::test]
async fn the_open_ready_endpoint_names_no_holder_of_a_blocked_gpu() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    gpu.process(4242, 1, &["python3", "train.py", "--hf-token=hf_SECRET"]);
    let s = outlive_a_lease(
        &host,
        &gpu,
        "gpu: NVIDIA GeForce RTX 5090, 0, 9512, 32607, 41, 28.5\nproc: 4242, python3, 9000\n",
    )
    .await;
    // Whoever may read /status sees the holder; /ready is open to anyone.
    assert!(s["reason"].as_str().unwrap().contains("hf_SECRET"), "{s:#}");
    let ready = reqwest::get(format!("{}/ready", host.url)).await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready = ready.text().await.unwrap();
    assert!(ready.contains("queue is blocked"), "{ready}");
    assert!(
        !ready.contains("hf_SECRET") && !ready.contains("4242"),
        "{ready}"
    );
    host.stop().await;
}

#[tokio::test]
async fn an_unrenewed_lease_is_reclaimed_after_its_ttl() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // A TTL too short to renew within is refused, not granted already expired.
    let instant = host
        .post("/gpu/lease")
        .json(&json!({"holder": "x", "ttl_s": 1e-300}))
        .send()
        .await
        .unwrap();
    assert_eq!(instant.status(), 400);
    let first: Value = host
        .post("/gpu/lease")
        .json(&json!({"holder": "crashed-notebook", "ttl_s": 0.5, "vram_mib": 1000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(first["lease_id"].is_u64(), "{first}");
    // A second holder waits, and gets the GPU once the first lease expires.
    let started = Instant::now();
    let events = grant_events(
        host.post("/gpu/lease")
            .json(&json!({"holder": "next", "wait": true, "vram_mib": 1000}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        matches!(events.first(), Some(GrantEvent::Queued { position: 1, waiting_for: Some(w) }) if w.contains("crashed-notebook")),
        "{events:?}"
    );
    assert_granted(&events);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    // Holder and purpose are shown to everyone: bounded, and no escape sequences or bidi.
    for (holder, purpose, want) in [
        ("bob\u{1b}]0;pwned\u{7}", "", 400),
        ("alice", "\u{202e}gnp.exe", 400),
        ("carol", &"x".repeat(513), 413),
    ] {
        let r = host
            .post("/gpu/lease")
            .json(&json!({"holder": holder, "purpose": purpose, "ttl_s": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{holder:?} {purpose:?}");
    }
    host.stop().await;
}

#[tokio::test]
async fn jobs_service_starts_and_leases_take_turns_in_fifo_order() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &service(&gpu, "llm", "--load-s 0.2 --mib 8000", "busy_grace_s = 0.3"),
    );
    let host = TestHost::start(&config).await.ready().await;
    let first: Value = host
        .post("/gpu/lease")
        .json(&json!({"holder": "first"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let first_id = first["lease_id"].as_u64().unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // In this order: a speech job, a service start, a lease.
    let job = {
        let (order, request) = (
            order.clone(),
            host.post("/transcribe").body(wav(0.2, 16000, 1)),
        );
        tokio::spawn(async move {
            let events = read_events(request.send().await.unwrap()).await;
            result_of(&events);
            order.lock().unwrap().push("job");
        })
    };
    wait_for("the job to queue", Duration::from_secs(10), || {
        let n = host.state.queue.waiting();
        async move { n == 1 }
    })
    .await;
    let start = {
        let (order, request) = (order.clone(), host.post("/services/llm/start"));
        tokio::spawn(async move {
            let events = grant_events(request.send().await.unwrap()).await;
            assert_healthy(&events);
            order.lock().unwrap().push("service");
        })
    };
    wait_for("the start to queue", Duration::from_secs(10), || {
        let n = host.state.queue.waiting();
        async move { n == 2 }
    })
    .await;
    let lease = {
        let (order, request) = (
            order.clone(),
            host.post("/gpu/lease")
                .json(&json!({"holder": "last", "wait": true})),
        );
        tokio::spawn(async move {
            let events = grant_events(request.send().await.unwrap()).await;
            assert_granted(&events);
            order.lock().unwrap().push("lease");
        })
    };
    wait_for("the lease to queue", Duration::from_secs(10), || {
        let n = host.state.queue.waiting();
        async move { n == 3 }
    })
    .await;
    host.client()
        .delete(format!("{}/gpu/lease/{first_id}", host.url))
        .send()
        .await
        .unwrap();
    // The job runs, the service starts and (unused for busy_grace_s) stops for the lease.
    for task in [job, start, lease] {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["job", "service", "lease"]);
    let s = status(&host).await;
    assert_eq!(
        service_state(&s, "llm"),
        "stopped",
        "stopped to make room: {s:#}"
    );
    host.stop().await;
}

#[tokio::test]
async fn an_unused_service_stops_by_itself() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &service(
            &gpu,
            "llm",
            "--load-s 0.1 --mib 6000",
            "idle_stop_after_s = 0.5",
        ),
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "llm").await;
    assert_healthy(&events);
    let s = wait_status(&host, "the idle stop", |s| {
        service_state(s, "llm") == "stopped"
    })
    .await;
    assert!(s["holders"].as_array().unwrap().is_empty(), "{s:#}");
    // And the resident worker it made room for is back.
    let handle = host.state.supervisor.get("w").unwrap();
    tokio::time::timeout(
        Duration::from_secs(15),
        handle.wait_for_state(|s| s.state == gpuhost::worker::WorkerState::Ready),
    )
    .await
    .unwrap();
    host.stop().await;
}

#[tokio::test]
async fn a_health_url_that_never_answers_fails_the_start_at_its_timeout() {
    // The health URL is a socket that takes connections and never reads them (a hung service),
    // polled every 30 s, each probe waiting up to 30 s for its answer: the start still fails
    // at start_timeout_s, and the service's log is read meanwhile.
    let gpu = FakeGpu::new(IDLE);
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_url = format!(
        "health_url = \"http://{}/health\"",
        hung.local_addr().unwrap()
    );
    let mute = service(&gpu, "mute", "--load-s 0", "")
        .lines()
        .map(|line| match line {
            l if l.starts_with("health_url") => hung_url.clone(),
            "poll_interval_s = 0.1" => "poll_interval_s = 30".into(),
            "start_timeout_s = 20" => "start_timeout_s = 3".into(),
            l => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let host = TestHost::start(&arbiter_config(&gpu, &mute))
        .await
        .ready()
        .await;
    let asked = Instant::now();
    let events = start_service(&host, "mute").await;
    let took = asked.elapsed();
    let Some(GrantEvent::Error { code, message }) = events.last() else {
        panic!("{events:?}");
    };
    assert_eq!(code, "service_timeout", "{message}");
    assert!(message.contains("model loaded; serving"), "{message}");
    assert!(took < Duration::from_secs(10), "failed after {took:?}");
    drop(hung);
    wait_status(&host, "the hung service stopped", |s| {
        service_state(s, "mute") == "failed" || service_state(s, "mute") == "stopped"
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_start_waiting_behind_a_lease_says_so_again_while_it_waits() {
    // Heartbeats every 0.2 s: the start's stream repeats its queue place until the lease goes,
    // then its start until the service is healthy.
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &format!(
            "[http]\nheartbeat_s = 0.2\n{}",
            service(&gpu, "llm", "--load-s 1 --mib 6000 --quiet", "")
        ),
    );
    let host = TestHost::start(&config).await.ready().await;
    let (lease_id, _) =
        granted_lease(&host, json!({"holder": "alice", "wait": true, "ttl_s": 60})).await;
    let response = host.post("/services/llm/start").send().await.unwrap();
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    while text.matches("\"queued\"").count() < 3 {
        let chunk = tokio::time::timeout(
            Duration::from_secs(15),
            futures_util::StreamExt::next(&mut stream),
        )
        .await
        .expect("a heartbeat within 15 s")
        .unwrap()
        .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    // A second caller joins the start under way: it hears where the start is first (it used to
    // get nothing until the service was healthy, and no heartbeat meanwhile).
    let joined = host.post("/services/llm/start").send().await.unwrap();
    let mut joined = joined.bytes_stream();
    let first = tokio::time::timeout(
        Duration::from_secs(15),
        futures_util::StreamExt::next(&mut joined),
    )
    .await
    .expect("the joining caller hears at once")
    .unwrap()
    .unwrap();
    let first: GrantEvent = serde_json::from_slice(&first).unwrap();
    assert!(
        matches!(&first, GrantEvent::Queued { waiting_for: Some(w), .. } if w.contains("alice")),
        "{first:?}"
    );
    assert_eq!(release(&host, lease_id).await, 200);
    while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let mut joined_text = String::new();
    while let Some(chunk) = futures_util::StreamExt::next(&mut joined).await {
        joined_text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(
        joined_text.lines().last().unwrap().contains("\"healthy\""),
        "{joined_text}"
    );
    assert_eq!(starts(&gpu), 1, "one process for both callers");
    let events: Vec<GrantEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    assert_healthy(&events);
    // While the service loads (1 s, quietly), its start is said again too.
    let starting = events
        .iter()
        .filter(|e| matches!(e, GrantEvent::Starting { .. }))
        .count();
    assert!(starting >= 2, "{events:?}");
    host.stop().await;
}

/// Takes a lease with `wait` (the request's JSON body) and returns its id once granted.
async fn granted_lease(host: &TestHost, body: Value) -> (u64, Vec<GrantEvent>) {
    let events = grant_events(host.post("/gpu/lease").json(&body).send().await.unwrap()).await;
    (lease_id_of(&events), events)
}

/// The lease id granted by a lease request's `events` (its last one the grant).
fn lease_id_of(events: &[GrantEvent]) -> u64 {
    let Some(GrantEvent::Granted { lease_id, .. }) = events.last().cloned() else {
        panic!("{events:?}")
    };
    lease_id
}

/// Releases lease `id`; the answer's status.
async fn release(host: &TestHost, id: u64) -> u16 {
    host.client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn leases(host: &TestHost) -> Vec<Value> {
    host.get_json("/gpu/leases").await["leases"]
        .as_array()
        .unwrap()
        .clone()
}

fn lease_command(host: &TestHost, extra: &[&str], command: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
    c.args(["lease", "--server", &host.url, "--purpose", "test run"])
        .args(extra)
        .arg("--")
        .args(command)
        .env_remove("GPUHOST_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    c
}

#[tokio::test]
async fn gpuhost_lease_runs_a_program_under_a_lease_and_passes_its_status() {
    let gpu = FakeGpu::new(IDLE);
    // No --ttl: the server's default TTL (1 s here), renewed at a third of it.
    let config = arbiter_config(&gpu, "").replace(
        "teardown_timeout_s = 3\n",
        "teardown_timeout_s = 3\nlease_ttl_s = 1\n",
    );
    let host = TestHost::start(&config).await.ready().await;
    // Its argument is not UTF-8 (a file name need not be): passed on as it is.
    let child = lease_command(
        &host,
        &["--vram", "1000"],
        &[
            "sh",
            "-c",
            "sleep 1.5; [ \"$1\" = \"$(printf 'n\\377u')\" ] && exit 7",
            "sh",
        ],
    )
    .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"n\xffu"))
    .spawn()
    .unwrap();
    wait_for("the lease to show", Duration::from_secs(10), || {
        let host = &host;
        async move {
            leases(host)
                .await
                .iter()
                .any(|l| l["purpose"] == "test run")
        }
    })
    .await;
    let status = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        String::from_utf8_lossy(&status.stderr).contains("(ttl 1 s)"),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    // Renewed past its 1 s TTL while the program ran, released when it ended.
    assert!(leases(&host).await.is_empty());
    host.stop().await;
}

#[tokio::test]
async fn a_killed_lease_holder_is_reclaimed_after_its_ttl() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let mut child = lease_command(&host, &["--vram", "1000", "--ttl", "1"], &["sleep", "600"])
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for("the lease to be reclaimed", Duration::from_secs(5), || {
        let host = &host;
        async move { leases(host).await.is_empty() }
    })
    .await;
    let next = host
        .post("/gpu/lease")
        .json(&json!({"holder": "next", "vram_mib": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
    host.stop().await;
}

#[tokio::test]
async fn a_sigkilled_lease_client_takes_its_programs_whole_tree() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    // A wrapper that ignores SIGTERM, and a child that inherits that: a SIGKILLed client runs
    // no code, so only the orphan guard can stop them (SIGTERM, a second, SIGKILL).
    let script = format!(
        "trap '' TERM; echo $$ > {0}/sh; sleep 6021 & echo $! > {0}/sleep; wait",
        dir.path().display()
    );
    let mut child = lease_command(&host, &["--ttl", "600"], &["sh", "-c", &script])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    let pid = |name: &str| -> Option<u32> {
        std::fs::read_to_string(dir.path().join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    wait_for("the program to start", Duration::from_secs(10), || {
        let started = pid("sh").is_some() && pid("sleep").is_some();
        async move { started }
    })
    .await;
    let (sh, sleep) = (pid("sh").unwrap(), pid("sleep").unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(
        "the program and its child to be stopped",
        Duration::from_secs(10),
        || {
            let gone = !pid_alive(sh) && !pid_alive(sleep);
            async move { gone }
        },
    )
    .await;
    host.stop().await;
}

/// The children of `parent` as (pid, comm, zombie), read from /proc.
fn children_of(parent: u32) -> Vec<(u32, String, bool)> {
    let procfs = gpuhost::gpu::procfs::ProcFs::new("/proc");
    procfs
        .pids()
        .into_iter()
        .filter(|&p| procfs.ppid(p) == Some(parent))
        .map(|p| (p, procfs.comm(p).unwrap_or_default(), procfs.zombie(p)))
        .collect()
}

#[tokio::test]
async fn a_sigkilled_lease_client_takes_what_it_had_adopted_and_reaps_meanwhile() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    // Fifty short-lived detached helpers (zombies of the client once they exit, until reaped)
    // and one long one, orphaned to the client: outside the program's tree.
    let script = format!(
        "for i in $(seq 50); do (true &); done; (sleep 6024 & echo $! > {}/detached); sleep 600",
        dir.path().display()
    );
    let mut child = lease_command(&host, &["--ttl", "600"], &["sh", "-c", &script])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let client = child.id();
    let detached = || -> Option<u32> {
        std::fs::read_to_string(dir.path().join("detached"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    wait_for(
        "the detached helper to be adopted and the exited ones reaped",
        Duration::from_secs(10),
        || {
            let under = children_of(client);
            let adopted = detached().is_some_and(|d| under.iter().any(|c| c.0 == d));
            let zombies = under.iter().filter(|c| c.2).count();
            async move { adopted && zombies == 0 }
        },
    )
    .await;
    let detached = detached().unwrap();
    // The guard notes what is below the client once a second.
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    until_dead(
        detached,
        "what the client had adopted to be stopped with it",
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_leased_program_still_gets_sigterm_when_its_client_and_guard_are_killed() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = lease_command(&host, &["--ttl", "600"], &["sleep", "6025"])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    let client = child.id();
    let mut program = None;
    wait_for("the program to start", Duration::from_secs(10), || {
        program = children_of(client)
            .into_iter()
            .find(|c| c.1 == "sleep")
            .map(|c| c.0);
        let started = program.is_some();
        async move { started }
    })
    .await;
    let program = program.unwrap();
    // `pkill -9 gpuhost` takes both (the guard's name is gpuhost-guard).
    for (pid, comm, _) in children_of(client) {
        if comm == "gpuhost-guard" {
            // SAFETY: kill(2) on the guard, a child of our child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    until_dead(program, "the program to get its death signal").await;
    host.stop().await;
}

#[tokio::test]
async fn what_a_leased_program_detaches_is_stopped_when_it_ends() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    // A daemon: its own session, and its parent gone at once, so neither the program's group
    // nor its tree holds it any more.
    let script = format!(
        "setsid sleep 6022 & echo $! > {}/daemon; exit 3",
        dir.path().display()
    );
    let mut child = lease_command(&host, &["--ttl", "600"], &["sh", "-c", &script])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_eq!(status.code(), Some(3), "the program's own status: {err}");
    assert!(err.contains("left running"), "{err}");
    let daemon: u32 = std::fs::read_to_string(dir.path().join("daemon"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !pid_alive(daemon),
        "the detached process outlived its lease: {err}"
    );
    assert!(leases(&host).await.is_empty(), "released: {err}");
    host.stop().await;
}

#[tokio::test]
async fn a_program_whose_lease_is_gone_is_stopped() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // A wrapper (sh) with the real user below it, as `uv run` or a shell script has.
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = lease_command(
        &host,
        &["--vram", "1000", "--ttl", "1"],
        &["sh", "-c", "sleep 6017; true"],
    )
    // A file, not a pipe: a child left running would hold a pipe open and hang the read.
    .stderr(std::fs::File::create(log.path()).unwrap())
    .spawn()
    .unwrap();
    lease_shows(&host).await;
    let below = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x006017\x00")
            })
            .count()
    };
    wait_for(
        "the program's child to start",
        Duration::from_secs(10),
        || {
            let running = below() == 1;
            async move { running }
        },
    )
    .await;
    // Someone releases it (an operator, a restarted server): the next renewal finds it gone.
    let id = leases(&host).await[0]["id"].as_u64().unwrap();
    let r = host
        .client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut child = child;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let err = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(
        err.contains("is gone") && err.contains("stopping the program"),
        "{err}"
    );
    wait_for(
        "the wrapper's child to be stopped too",
        Duration::from_secs(5),
        || {
            let gone = below() == 0;
            async move { gone }
        },
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_second_interrupt_stops_the_leased_program() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    let running = dir.path().join("running");
    // SIGINT sent to the client alone never reaches the program (it waited forever).
    let script = format!(
        "trap 'exit 9' TERM; touch {}; sleep 6021 & wait",
        running.display()
    );
    let child = lease_command(&host, &["--ttl", "600"], &["sh", "-c", &script])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    wait_for("the program to run", Duration::from_secs(10), || {
        let up = running.exists();
        async move { up }
    })
    .await;
    let err = || std::fs::read_to_string(dir.path().join("err")).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_for(
        "the first interrupt to be heard",
        Duration::from_secs(10),
        || {
            let heard = err().contains("interrupt again");
            async move { heard }
        },
    )
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut child = child;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(9),
        "the program's own status: {}",
        err()
    );
    assert!(leases(&host).await.is_empty(), "released: {}", err());
    host.stop().await;
}

#[tokio::test]
async fn a_terminated_lease_client_stops_its_program_and_releases_at_once() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("term");
    let running = dir.path().join("running");
    let script = format!(
        "trap 'echo got > {}; exit 9' TERM; touch {}; sleep 6019 & wait",
        marker.display(),
        running.display()
    );
    // A long TTL: the lease gone right after proves a release, not a reclaim.
    let child = lease_command(&host, &["--ttl", "600"], &["sh", "-c", &script])
        .stderr(std::fs::File::create(dir.path().join("err")).unwrap())
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    // The program runs, its trap set (a SIGTERM before the program starts is answered by a
    // release without starting it).
    wait_for("the program to run", Duration::from_secs(10), || {
        let up = running.exists();
        async move { up }
    })
    .await;
    // SIGTERM, as a service manager or `kill` sends it.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut child = child;
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    let err = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_eq!(status.code(), Some(9), "the program's own status: {err}");
    assert!(marker.exists(), "the program got SIGTERM: {err}");
    assert!(leases(&host).await.is_empty(), "released: {err}");

    // Terminated while its lease waits behind another: it leaves the queue, its program unrun.
    let holder = lease_command(&host, &["--ttl", "600"], &["sleep", "6019"])
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    let never = dir.path().join("never");
    let waiter = lease_command(&host, &[], &["touch", never.to_str().unwrap()])
        .spawn()
        .unwrap();
    wait_for("the second lease to queue", Duration::from_secs(10), || {
        let n = host.state.queue.waiting();
        async move { n == 1 }
    })
    .await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(waiter.id() as i32, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.status.code(),
        Some(128 + libc::SIGTERM),
        "{status:?}"
    );
    wait_for("the queue to empty", Duration::from_secs(10), || {
        let n = host.state.queue.waiting();
        async move { n == 0 }
    })
    .await;
    assert!(!never.exists(), "the program never ran");
    // SAFETY: kill(2) on our own child; it releases its lease.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    let _ = tokio::task::spawn_blocking(move || holder.wait_with_output()).await;
    host.stop().await;
}

#[test]
fn a_lease_client_whose_server_never_answers_still_stops_at_sigterm() {
    // A server that takes the connection and never answers (hung, or not a gpuhost).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let mut client = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"))
        .args(["lease", "--server", &url, "--", "true"])
        .env_remove("GPUHOST_TOKEN")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its request has arrived: the client is waiting for the answer.
    let (_held, _) = silent.accept().unwrap();
    let asked = std::time::Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(client.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(status) = client.try_wait().unwrap() {
            break status;
        }
        if asked.elapsed() > Duration::from_secs(10) {
            let _ = client.kill();
            panic!("the lease client ignored SIGTERM while its request went unanswered");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
}

#[tokio::test]
async fn a_program_that_cannot_start_gives_its_lease_back_at_once() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let out = tokio::task::spawn_blocking({
        let mut command = lease_command(&host, &["--ttl", "600"], &["/nonexistent/program"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "as a shell's: {err}");
    assert!(err.contains("cannot run"), "{err}");
    // Not found: said before any lease was asked for (one unloads the resident workers).
    assert!(!err.contains("granted"), "{err}");
    assert!(leases(&host).await.is_empty(), "{err}");
    // A script whose interpreter is missing: said so (exec's "No such file or directory"
    // named a file that is there), before any lease.
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    // A script of `text`, run under a lease: its exit code and the client's stderr.
    let run_script = |name: &str, text: &str| {
        let script = dir.path().join(name);
        std::fs::write(&script, text).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = lease_command(&host, &["--ttl", "600"], &[script.to_str().unwrap()]);
        tokio::task::spawn_blocking(move || {
            let out = command.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (out.status.code(), err)
        })
    };
    let (code, err) = run_script("script", "#!/nonexistent/interpreter -u\n")
        .await
        .unwrap();
    assert_eq!(code, Some(126), "as a shell's: {err}");
    assert!(
        err.contains("interpreter /nonexistent/interpreter") && !err.contains("granted"),
        "{err}"
    );
    // Found but not runnable (its interpreter is no program): the lease is given back at once.
    let (code, err) = run_script("not-a-program", "#!/etc/passwd\n")
        .await
        .unwrap();
    assert_eq!(code, Some(126), "as a shell's: {err}");
    assert!(
        err.contains("granted") && err.contains("cannot run"),
        "{err}"
    );
    assert!(
        leases(&host).await.is_empty(),
        "released, not held for 600 s: {err}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_lease_client_that_cannot_reach_its_server_for_a_ttl_stops_the_program() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = lease_command(&host, &["--ttl", "1"], &["sleep", "6020"])
        .stderr(std::fs::File::create(log.path()).unwrap())
        .spawn()
        .unwrap();
    lease_shows(&host).await;
    // The server goes away (crash, reboot): nobody answers the renewals any more, and a new
    // server would not know the lease.
    host.stop().await;
    let child = std::sync::Mutex::new(child);
    wait_for("the client to give up", Duration::from_secs(30), || {
        let ended = child.lock().unwrap().try_wait().unwrap().is_some();
        async move { ended }
    })
    .await;
    let status = child.lock().unwrap().wait().unwrap();
    let err = std::fs::read_to_string(log.path()).unwrap();
    assert_eq!(status.code(), Some(75), "{err}");
    assert!(err.contains("unreachable"), "{err}");
}

/// Runs `gpuhost ACTION NAME --server URL` and returns (exit code, stderr, stdout).
async fn cli(host: &TestHost, args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
    c.args(args)
        .args(["--server", &host.url])
        .env_remove("GPUHOST_TOKEN");
    let out = tokio::task::spawn_blocking(move || c.output())
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn the_command_line_unloads_loads_starts_and_stops() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, &service(&gpu, "llm", "--load-s 0.3 --mib 9000", ""));
    let host = TestHost::start(&config).await.ready().await;
    let (code, err, out) = cli(&host, &["unload", "w"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"unloaded\""), "{out}");
    let workers: Value = host
        .get("/workers")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(workers["workers"][0]["state"], "unloaded", "{workers:#}");
    // Unloaded on purpose is still ready: the next job loads it (a 503 kept that job away).
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);
    let (code, err, _) = cli(&host, &["load", "w"]).await;
    assert_eq!(code, Some(0), "{err}");
    let host = host.ready().await;
    let (code, err, _) = cli(&host, &["start", "llm"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("llm: healthy"), "{err}");
    assert_eq!(service_state(&status(&host).await, "llm"), "healthy");
    let (code, err, _) = cli(&host, &["stop", "llm"]).await;
    assert_eq!(code, Some(0), "{err}");
    wait_status(&host, "llm stopped", |s| {
        service_state(s, "llm") == "stopped"
    })
    .await;
    // A name the server does not know: the server's message, exit 1.
    let (code, err, _) = cli(&host, &["stop", "nope"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("no service `nope`"), "{err}");
    let (code, err, _) = cli(&host, &["unload", "nope"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("no worker `nope`; configured: w"), "{err}");
    host.stop().await;
}

#[tokio::test]
async fn measured_footprints_replace_the_guess_and_survive_a_restart() {
    let gpu = FakeGpu::new(IDLE);
    let state = gpu.dir.path().join("gpuhost-state");
    let config = format!(
        "state_dir = {:?}\n{}",
        state.display().to_string(),
        arbiter_config(
            &gpu,
            &service(&gpu, "llm", "--load-s 0.2 --mib 7000", "vram_mib = 20000")
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "llm").await;
    assert_healthy(&events);
    let measured = |v: &Value| v["services"].as_array().unwrap()[0]["measured_vram_mib"].as_u64();
    wait_for(
        "the service's peak to be measured",
        Duration::from_secs(10),
        || {
            let host = &host;
            async move {
                let v: Value = host
                    .get("/services")
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                measured(&v) == Some(7000)
            }
        },
    )
    .await;
    host.post("/services/llm/stop").send().await.unwrap();
    wait_status(&host, "llm stopped", |s| {
        service_state(s, "llm") == "stopped"
    })
    .await;
    host.stop().await;
    let file: Value =
        serde_json::from_slice(&std::fs::read(state.join("footprints.json")).unwrap()).unwrap();
    assert_eq!(file["peaks_mib"]["service llm"], 7000, "{file:#}");
    // A new server knows it before the service ever runs again.
    let host = TestHost::start(&config).await.ready().await;
    let v: Value = host
        .get("/services")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(measured(&v), Some(7000), "{v:#}");
    assert_eq!(v["services"][0]["vram_mib"], 20000);
    host.stop().await;
}

#[tokio::test]
async fn a_services_engine_in_a_session_of_its_own_is_in_its_footprint() {
    // A launcher that `setsid`s its engine: /status gave the engine to the service, but the
    // footprint counted the launcher's process group only (10 MiB), and room was made, or not,
    // on that figure.
    let gpu = FakeGpu::new(IDLE);
    // The real /proc: who started whom is read there.
    let fake_proc = format!("proc_root = {:?}", gpu.proc_root().display().to_string());
    let config = arbiter_config(
        &gpu,
        &service(&gpu, "llm", "--load-s 0.2 --mib 10 --engine-mib 6000", ""),
    )
    .replace(&fake_proc, "proc_root = \"/proc\"");
    assert!(config.contains("proc_root = \"/proc\""), "{config}");
    let host = TestHost::start(&config).await.ready().await;
    assert_healthy(&start_service(&host, "llm").await);
    wait_for(
        "the engine's memory to be measured with the service's",
        Duration::from_secs(10),
        || async { first_service(&host).await["measured_vram_mib"] == 6010 },
    )
    .await;
    host.post("/services/llm/stop").send().await.unwrap();
    wait_status(&host, "llm stopped", |s| {
        service_state(s, "llm") == "stopped"
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn the_history_shows_who_held_the_gpu_and_who_waited() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let before = host
        .get("/gpu/history")
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["now"]
        .as_f64()
        .unwrap();
    let granted: Value = host
        .post("/gpu/lease")
        .json(&json!({"holder": "alice", "purpose": "training", "vram_mib": 1000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = granted["lease_id"].as_u64().expect("a lease id");
    // A speech job waits behind the lease, then runs.
    let job = host.post("/transcribe").body(wav(0.2, 16000, 1)).send();
    let job = tokio::spawn(job);
    wait_status(&host, "the job to wait", |s| s["queue"]["waiting"] == 1).await;
    wait_for("a sample with the waiter", Duration::from_secs(10), || {
        let host = &host;
        async move {
            let h: Value = host
                .get("/gpu/history")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            h["samples"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["waiting"] == 1)
        }
    })
    .await;
    host.client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(job.await.unwrap().unwrap().status(), 200);
    let h: Value = host
        .get(&format!("/gpu/history?since={before}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let grants = h["grants"].as_array().unwrap();
    let lease = grants
        .iter()
        .find(|g| g["kind"] == "lease")
        .expect("the lease");
    assert!(lease["holder"].as_str().unwrap().contains("alice"), "{h:#}");
    assert!(lease["end"].as_f64().unwrap() > lease["start"].as_f64().unwrap());
    assert_eq!(
        lease["peak_mib"], 512,
        "the sampled peak while it held: {h:#}"
    );
    let jobs: Vec<&Value> = grants.iter().filter(|g| g["kind"] == "job").collect();
    assert_eq!(jobs.len(), 1, "{h:#}");
    assert!(jobs[0]["waited_s"].as_f64().unwrap() > 0.0, "{h:#}");
    assert!(jobs[0]["start"].as_f64() >= lease["end"].as_f64(), "{h:#}");
    let s = &h["samples"].as_array().unwrap()[0];
    assert_eq!(s["gpus"][0]["memory_total_mib"], 32607, "{h:#}");
    // A bad `since` is a JSON 400.
    let bad = host
        .get("/gpu/history?since=yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body: Value = bad.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("Unix time"),
        "{body}"
    );
    // So is a parameter it does not have (a typo would silently show everything).
    let typo = host.get("/gpu/history?snce=1").send().await.unwrap();
    assert_eq!(typo.status(), 400);
    let body: Value = typo.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("snce"), "{body}");
    host.stop().await;
}

/// A fake Ollama (not started by gpuhost) holding `mib` for `model`, registered in the fake
/// `/proc` as `ollama serve`. Killed on drop.
struct FakeOllama {
    child: std::process::Child,
    port: u16,
}

impl FakeOllama {
    fn start(gpu: &FakeGpu, model: &str, mib: u64, flags: &[&str]) -> FakeOllama {
        let port = free_port();
        let child = std::process::Command::new(python())
            .arg(fixture("fake_ollama.py"))
            .args([port.to_string(), gpu.dir.path().display().to_string()])
            .args(["--model", model, "--mib", &mib.to_string()])
            .args(flags)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        gpu.process(child.id(), 1, &["/usr/local/bin/ollama", "serve"]);
        FakeOllama { child, port }
    }
}

impl Drop for FakeOllama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_watched_ollama_is_asked_to_unload_its_models_to_make_room() {
    let gpu = FakeGpu::new(IDLE);
    let ollama = FakeOllama::start(&gpu, "nomic-embed-text", 20_000, &["--embed-only"]);
    let watch = format!(
        "[[gpu.watch]]\nname = \"ollama\"\npattern = \"ollama serve\"\nrelease = {{ kind = \"ollama\", url = \"http://127.0.0.1:{}\" }}\n",
        ollama.port
    );
    let config = format!(
        // A generous teardown deadline: on a loaded machine the fake nvidia-smi's samples come
        // slowly, and the check only waits as long as the memory takes to come back.
        "[pipeline]\nstages = [\"w\"]\n{}\n[arbiter]\nteardown_timeout_s = 15\n{}",
        fake_worker("w", ""),
        gpu.config(&watch)
    );
    let host = TestHost::start(&config).await.ready().await;
    // Both halves of one sample: the process list and the GPU's used memory (two nvidia-smi
    // queries; one taken before the fake published its memory would make room look free).
    wait_status(&host, "Ollama's memory in the sample", |s| {
        s["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["watch"] == "ollama" && p["used_memory_mib"] == 20_000)
            && s["gpu"]["memory_used_mib"].as_u64() >= Some(20_000)
    })
    .await;
    let events = grant_events(
        host.post("/gpu/lease")
            .json(&json!({"holder": "bob", "vram_mib": 20_000, "wait": true}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, GrantEvent::MakingRoom { action, target }
            if action == "release" && target == "watched ollama")),
        "{events:?}"
    );
    assert_granted(&events);
    let unloaded = std::fs::read_to_string(gpu.dir.path().join("ollama-unloaded")).unwrap();
    assert_eq!(unloaded.trim(), "nomic-embed-text");
    let s = status(&host).await;
    assert!(s["gpu"]["memory_used_mib"].as_u64() < Some(1000), "{s:#}");
    host.stop().await;
}

#[tokio::test]
async fn waiting_leases_are_bounded_by_the_queue_limit() {
    let gpu = FakeGpu::new(IDLE);
    let host = TestHost::start(&arbiter_config(&gpu, "[limits]\nmax_queue = 2\n"))
        .await
        .ready()
        .await;
    assert_eq!(lease_now(&host, "holder", 1000).await.status(), 200);
    // Two wait (their streams stay open), the third is told the queue is full.
    let mut waiting = Vec::new();
    for i in 0..2 {
        let r = host
            .post("/gpu/lease")
            .json(&json!({"holder": format!("waiter {i}"), "wait": true, "vram_mib": 1000}))
            .send()
            .await
            .unwrap();
        let mut stream = r.bytes_stream();
        let first = futures_util::StreamExt::next(&mut stream)
            .await
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&first).contains("queued"));
        waiting.push(stream);
    }
    let r = host
        .post("/gpu/lease")
        .json(&json!({"holder": "one too many", "wait": true, "vram_mib": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "queue_full", "{body}");
    drop(waiting);
    wait_for("the waiters to leave", Duration::from_secs(10), || async {
        host.state.queue.waiting() == 0
    })
    .await;
    // Many at once race past the early check: the queue's own check still holds the bound,
    // and those turned away there are told so in their stream.
    let burst = (0..20).map(|i| {
        let request = host
            .post("/gpu/lease")
            .json(&json!({"holder": format!("burst {i}"), "wait": true, "vram_mib": 1000}));
        async move {
            let r = request.send().await.unwrap();
            let mut stream = r.bytes_stream();
            let first = futures_util::StreamExt::next(&mut stream).await;
            (
                first.map(|b| String::from_utf8_lossy(&b.unwrap()).to_string()),
                stream,
            )
        }
    });
    let answers = futures_util::future::join_all(burst).await;
    assert!(
        host.state.queue.waiting() <= 2,
        "{}",
        host.state.queue.waiting()
    );
    let queued = answers
        .iter()
        .filter(|(first, _)| first.as_deref().is_some_and(|f| f.contains("queued")))
        .count();
    assert!(queued <= 2, "{queued} queued");
    drop(answers);
    host.stop().await;
}

#[tokio::test]
async fn a_lease_larger_than_the_gpu_is_refused_before_anything_unloads() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    wait_status(&host, "a sample", |s| s["gpu"]["memory_total_mib"] == 32607).await;
    let pid = host.worker("w").await["pid"].as_u64();
    let r = lease_now(&host, "greedy", 1 << 40).await;
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "no_room", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("32607 MiB"),
        "{body}"
    );
    // Asked with `wait`, the same: 409 at once, not a stream holding one error.
    let r = host
        .post("/gpu/lease")
        .json(&json!({"holder": "greedy", "vram_mib": 1u64 << 40, "wait": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "no_room", "{body}");
    let w = host.worker("w").await;
    assert_eq!(w["pid"].as_u64(), pid, "the resident was left loaded: {w}");
    host.stop().await;
}

/// Waits until the server lists a lease (a `gpuhost lease` client got its grant).
async fn lease_shows(host: &TestHost) {
    wait_for("the lease to show", Duration::from_secs(10), || async {
        !leases(host).await.is_empty()
    })
    .await;
}

async fn lease_now(host: &TestHost, holder: &str, mib: u64) -> reqwest::Response {
    host.post("/gpu/lease")
        .json(&json!({"holder": holder, "vram_mib": mib}))
        .send()
        .await
        .unwrap()
}

/// A host on `gpu` (32 607 MiB) under `share = "vram"` with 1 024 MiB of headroom, whose
/// stages are the resident workers `workers` (name, extra config), `arbiter` more of
/// `[arbiter]`, once a sample is in.
async fn vram_host(gpu: &FakeGpu, workers: &[(&str, &str)], arbiter: &str) -> TestHost {
    let names: Vec<&str> = workers.iter().map(|(name, _)| *name).collect();
    let defined: String = workers
        .iter()
        .map(|(name, extra)| fake_worker(name, extra))
        .collect();
    let config = format!(
        "[pipeline]\nstages = {names:?}\n{defined}\n[arbiter]\nteardown_timeout_s = 3\n{arbiter}\n{}",
        gpu.config("").replace(
            "[gpu.status]",
            "[gpu]\nshare = \"vram\"\nheadroom_mib = 1024\n[gpu.status]"
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    wait_status(&host, "a sample", |s| s["gpu"]["memory_total_mib"] == 32607).await;
    host
}

#[tokio::test]
async fn share_vram_packs_holders_that_fit_and_keeps_fifo() {
    let gpu = FakeGpu::new(IDLE);
    // 32 607 MiB, 1 024 headroom: 31 583 to share; the resident worker counts 4 000.
    let host = vram_host(&gpu, &[("w", "vram_mib = 4000\n")], "").await;
    let a = lease_now(&host, "a", 10_000).await;
    assert_eq!(a.status(), 200);
    let a: Value = a.json().await.unwrap();
    // Beside the first: 10 000 + 4 000 + 10 000 fits.
    let b = lease_now(&host, "b", 10_000).await;
    assert_eq!(b.status(), 200, "{:?}", b.text().await);
    // A third does not, even with the resident unloaded (32 000 > 31 583): taken.
    let c = lease_now(&host, "c", 12_000).await;
    assert_eq!(c.status(), 409);
    // A speech job needs nothing beyond its resident worker: it runs beside both leases.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    result_of(&events);
    let w: Value = host
        .get("/workers")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(w["workers"][0]["state"], "ready", "nobody unloaded: {w:#}");
    // FIFO: a waiting 12 000 MiB lease (too much beside a and b even with the resident
    // unloaded) is not overtaken by a small one…
    let waiting_c = tokio::spawn(
        host.post("/gpu/lease")
            .json(&json!({"holder": "c", "vram_mib": 12_000, "wait": true}))
            .send(),
    );
    wait_status(&host, "c to wait", |s| s["queue"]["waiting"] == 1).await;
    let waiting_d = tokio::spawn(
        host.post("/gpu/lease")
            .json(&json!({"holder": "d", "vram_mib": 1_000, "wait": true}))
            .send(),
    );
    wait_status(&host, "d to wait", |s| s["queue"]["waiting"] == 2).await;
    // …and once `a` leaves, both fit and both are granted.
    host.client()
        .delete(format!("{}/gpu/lease/{}", host.url, a["lease_id"]))
        .send()
        .await
        .unwrap();
    for waiter in [waiting_c, waiting_d] {
        let events = grant_events(waiter.await.unwrap().unwrap()).await;
        assert_granted(&events);
    }
    let holders = leases(&host).await;
    assert_eq!(
        holders.len(),
        3,
        "b, c and d hold the GPU together: {holders:?}"
    );
    host.stop().await;
}

#[tokio::test]
async fn share_vram_unloads_an_idle_resident_for_a_waiter_that_fits_beside_the_holders() {
    // A 20 000 MiB resident, a 10 000 MiB lease held: a second 10 000 MiB lease fits beside the
    // first only without the resident. It waited for the first to end (a service in its place
    // was stopped for it, a restart of minutes) while unloading the resident makes room.
    let gpu = FakeGpu::new(IDLE);
    let host = vram_host(&gpu, &[("w", "vram_mib = 20000\n")], "reload = \"eager\"").await;
    let a = lease_now(&host, "a", 10_000).await;
    assert_eq!(a.status(), 200, "{:?}", a.text().await);
    let a: Value = a.json().await.unwrap();
    assert_eq!(host.worker("w").await["state"], "ready");
    let b = host
        .post("/gpu/lease")
        .json(&json!({"holder": "b", "vram_mib": 10_000, "wait": true}))
        .send()
        .await
        .unwrap();
    let events = tokio::time::timeout(Duration::from_secs(10), grant_events(b))
        .await
        .expect("b granted beside a while a holds the GPU");
    let b = lease_id_of(&events);
    assert_eq!(host.worker("w").await["state"], "unloaded");
    assert_eq!(
        leases(&host).await.len(),
        2,
        "a and b hold the GPU together"
    );
    // Both gone, the resident comes back.
    assert_eq!(release(&host, a["lease_id"].as_u64().unwrap()).await, 200);
    assert_eq!(release(&host, b).await, 200);
    wait_for("w loaded again", Duration::from_secs(10), || async {
        host.worker("w").await["state"] == "ready"
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn share_vram_unloads_an_idle_resident_for_a_lease_that_does_not_wait() {
    // As above, but b does not send `wait`: it waits for no other holder, and the resident is
    // the host's own to unload (a lease granted alone gets it unloaded too). It was a 409.
    let gpu = FakeGpu::new(IDLE);
    let host = vram_host(&gpu, &[("w", "vram_mib = 20000\n")], "").await;
    let a = lease_now(&host, "a", 10_000).await;
    assert_eq!(a.status(), 200, "{:?}", a.text().await);
    let b = lease_now(&host, "b", 10_000).await;
    assert_eq!(b.status(), 200, "{:?}", b.text().await);
    assert_eq!(host.worker("w").await["state"], "unloaded");
    assert_eq!(leases(&host).await.len(), 2);
    // Nothing left to unload: a third does not fit (32 000 > 31 583), and is told so at once.
    let c = lease_now(&host, "c", 12_000).await;
    assert_eq!(c.status(), 409);
    let c: Value = c.json().await.unwrap();
    assert_eq!(c["error"], "gpu_busy", "{c}");
    host.stop().await;
}

/// A job of 0.2 s of audio that is told it waits in the queue: its stream, past that event.
async fn queued_job(host: &TestHost) -> EventReader {
    let mut job = EventReader::new(
        host.post("/transcribe")
            .body(wav(0.2, 16_000, 1))
            .send()
            .await
            .unwrap(),
    );
    let first = job.next().await;
    assert!(
        matches!(first, Some(ClientEvent::Queued { .. })),
        "{first:?}"
    );
    job
}

/// A `vram_host` whose resident w (20 000 MiB) the sample lists with its memory (it stays listed
/// whatever w does, until the state changes), and a 10 000 MiB lease `a` granted.
async fn w_on_the_gpu_and_a_leased(gpu: &FakeGpu) -> TestHost {
    let host = vram_host(gpu, &[("w", "vram_mib = 20000\n")], "").await;
    let pid = host.worker("w").await["pid"].as_u64().unwrap();
    gpu.set_state(&format!(
        "gpu: NVIDIA GeForce RTX 5090, 0, 20512, 32607, 41, 28.5\nproc: {pid}, python3, 20000\n"
    ));
    wait_status(&host, "w on the GPU", |s| {
        s["gpu"]["memory_used_mib"] == 20512
    })
    .await;
    let a = lease_now(&host, "a", 10_000).await;
    assert_eq!(a.status(), 200, "{:?}", a.text().await);
    host
}

#[tokio::test]
async fn share_vram_grants_no_memory_of_an_unloaded_resident_before_a_sample_shows_it_back() {
    // The resident's 20 000 MiB stay on the GPU after its process stopped (the sample still
    // lists it). Counted neither as a resident's nor free, they were settled onto lease a as
    // memory it had taken: b was granted 13 ms after the unload began, 23 000 MiB promised
    // with 12 095 free (helper 80).
    let gpu = FakeGpu::new(IDLE);
    let host = w_on_the_gpu_and_a_leased(&gpu).await;
    let b = lease_now(&host, "b", 10_000).await;
    assert_eq!(b.status(), 409, "granted on memory still in use");
    let b: Value = b.json().await.unwrap();
    let why = b["message"].as_str().unwrap();
    assert!(why.contains("did not make room"), "{b}");
    assert_eq!(leases(&host).await.len(), 1);
    // Nor is a job that loads w again on top of that memory (it went in for free, helper 81).
    let mut job = queued_job(&host).await;
    // Its memory back, the job runs; then w, idle again, makes room for b as it should.
    gpu.set_state(IDLE);
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    let b = lease_now(&host, "b", 10_000).await;
    assert_eq!(b.status(), 200, "{:?}", b.text().await);
    host.stop().await;
}

#[tokio::test]
async fn share_vram_counts_a_stopped_residents_process_after_it_loads_again() {
    // w unloaded by hand, its process P1 still listed; lease a granted; a job loads w again as
    // P2. P1's footprint was forgotten and its memory settled onto a as taken: b was granted
    // on memory a had yet to take (helper 82).
    let gpu = FakeGpu::new(IDLE);
    let host = vram_host(&gpu, &[("w", "vram_mib = 8000\n")], "").await;
    let p1 = host.worker("w").await["pid"].as_u64().unwrap();
    let listed = |pids: &[u64]| {
        let procs: String = pids
            .iter()
            .map(|p| format!("proc: {p}, python3, 8000\n"))
            .collect();
        format!("gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n{procs}")
    };
    let count = |n: usize| move |s: &Value| s["processes"].as_array().is_some_and(|p| p.len() == n);
    gpu.set_state(&listed(&[p1]));
    wait_status(&host, "P1 listed", count(1)).await;
    assert_eq!(
        host.post("/workers/w/unload")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let a = lease_now(&host, "a", 10_000).await;
    assert_eq!(a.status(), 200, "{:?}", a.text().await);
    let mut job = running_job(&host, "?prompt=fake:sleep=3000").await;
    let p2 = host.worker("w").await["pid"].as_u64().unwrap();
    assert_ne!(p1, p2);
    gpu.set_state(&listed(&[p1, p2]));
    wait_status(&host, "P1 and P2 listed", count(2)).await;
    // a's 10 000 not taken yet: 32 607 - 16 512 - 10 000 < 12 000 + 1 024.
    let b = lease_now(&host, "b", 12_000).await;
    assert_eq!(b.status(), 409, "P1's memory credited to a");
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    host.stop().await;
}

#[tokio::test]
async fn share_vram_a_resident_on_gpu_1_is_not_held_unloaded_by_gpu_0_without_figures() {
    // GPU 0 (the configured one) lists no memory figures, so every sample carries an error;
    // GPU 1's figures are sound. w on GPU 1, unloaded by hand, lingered for good (helper 82).
    let gpu = FakeGpu::new(
        "gpu: NVIDIA GB10, [N/A], [N/A], [N/A], 45, [N/A]\ngpu: NVIDIA RTX A4000, 0, 300, 16376, 35, 20.0\n",
    );
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}\n[arbiter]\nteardown_timeout_s = 3\n{}",
        fake_worker("w", "vram_mib = 8000\ndevice = 1\n"),
        gpu.config("").replace(
            "[gpu.status]",
            "[gpu]\ndevices = [0, 1]\nshare = \"vram\"\nheadroom_mib = 1024\n[gpu.status]"
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    assert_eq!(
        host.post("/workers/w/unload")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let lease = |holder: &'static str, mib: u64| {
        host.post("/gpu/lease")
            .json(&json!({"holder": holder, "vram_mib": mib, "device": 1}))
            .send()
    };
    assert_eq!(lease("a", 1_000).await.unwrap().status(), 200);
    // 1 000 + 8 000 + 6 000 > 15 352 while w counts; it does not once a sample shows it gone.
    wait_for("b granted beside a", Duration::from_secs(5), || async {
        lease("b", 6_500).await.unwrap().status() == 200
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn share_vram_counts_a_resident_unloaded_by_hand_until_its_memory_is_back() {
    // Unloaded by hand (or idle), its memory still listed: a lease was granted on it at once.
    let gpu = FakeGpu::new(IDLE);
    let host = w_on_the_gpu_and_a_leased(&gpu).await;
    let unloaded = host.post("/workers/w/unload").send().await.unwrap();
    assert_eq!(unloaded.status(), 200);
    let b = lease_now(&host, "b", 10_000).await;
    assert_eq!(b.status(), 409, "granted on memory still in use");
    gpu.set_state(IDLE);
    wait_status(&host, "w's memory back", |s| {
        s["gpu"]["memory_used_mib"] == 512
    })
    .await;
    wait_for("b granted", Duration::from_secs(5), || async {
        lease_now(&host, "b", 10_000).await.status() == 200
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn share_vram_unloads_no_resident_a_running_job_would_load_again() {
    // A job holds the GPU (stage w runs, x comes next); a 15 000 MiB lease waits: 21 000
    // resident + 15 000 > 31 583. Without x it would seem to fit, but a job on the GPU loads its
    // unloaded residents again: x was unloaded for nothing, one after another (helper 78).
    let gpu = FakeGpu::new(IDLE);
    let workers = [("w", "vram_mib = 1000\n"), ("x", "vram_mib = 20000\n")];
    let host = vram_host(&gpu, &workers, "").await;
    let mut job = running_job(&host, "?prompt=fake:sleep=2000").await;
    let waiting = host
        .post("/gpu/lease")
        .json(&json!({"holder": "b", "vram_mib": 15_000, "wait": true}))
        .send()
        .await
        .unwrap();
    // The job ends while b waits; then b is granted (alone: nothing to unload for it).
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    let lease_id = lease_id_of(&grant_events(waiting).await);
    let history = host.get_json("/gpu/history").await;
    let unloads: Vec<&Value> = history["grants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "unload")
        .collect();
    assert!(unloads.is_empty(), "{unloads:#?}");
    assert_eq!(host.worker("x").await["state"], "ready");
    assert_eq!(release(&host, lease_id).await, 200);
    host.stop().await;
}

#[tokio::test]
async fn share_vram_counts_no_memory_for_a_resident_on_the_cpu() {
    let gpu = FakeGpu::new(IDLE);
    // A `vram_mib` left from when it ran on CUDA: now it says it runs on the CPU.
    let cpu = format!("vram_mib = 20000\n{SAYS_CPU}");
    let host = vram_host(&gpu, &[("c", &cpu)], "").await;
    // A first lease is granted alone in any case; a second beside it only if they fit:
    // 5 000 + 10 000 do in 31 583, but not with the resident's 20 000 counted.
    let first = lease_now(&host, "a", 5_000).await;
    assert_eq!(first.status(), 200, "{:?}", first.text().await);
    let second = lease_now(&host, "b", 10_000).await;
    assert_eq!(second.status(), 200, "{:?}", second.text().await);
    assert_eq!(host.worker("c").await["state"], "ready");
    host.stop().await;
}

#[tokio::test]
async fn fallback_oneshot_serves_a_job_without_bringing_the_resident_back() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, "").replace(
        "[arbiter]\n",
        "[arbiter]\nreload = \"on_demand\"\nfallback = \"oneshot\"\n",
    );
    let host = TestHost::start(&config).await.ready().await;
    let unloaded = host.post("/workers/w/unload").send().await.unwrap();
    assert_eq!(unloaded.status(), 200);
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    result_of(&events);
    let w: Value = host
        .get("/workers")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let worker = &w["workers"][0];
    assert_eq!(worker["state"], "unloaded", "{w:#}");
    assert_eq!(worker["pid"], Value::Null, "{w:#}");
    assert_eq!(worker["tasks_done"], 1, "{w:#}");
    // A crash of such a run leaves it unloaded: it was not loaded again on its own (beside the
    // lease or service it was unloaded for), so the next job is a one-shot run too.
    let (code, _) = error_of(
        &host
            .transcribe("?prompt=fake:crash", wav(0.2, 16000, 1))
            .await,
    );
    assert_eq!(code, "worker_crashed");
    result_of(&host.transcribe("", wav(0.2, 16000, 1)).await);
    let w = host.get_json("/workers").await;
    assert_eq!(w["workers"][0]["state"], "unloaded", "{w:#}");
    // `/load` still brings it back for good.
    host.post("/workers/w/load").send().await.unwrap();
    let host = host.ready().await;
    host.stop().await;
}

#[tokio::test]
async fn a_service_whose_url_already_answers_is_not_started_again() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, &service(&gpu, "llm", "--load-s 0.1", ""));
    // A copy started by hand on the service's port (its own state folder: gpuhost's starts
    // are counted apart).
    let port: String = config
        .split("http://127.0.0.1:")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let outside = tempfile::tempdir().unwrap();
    let mut copy = std::process::Command::new(python())
        .arg(fixture("fake_service.py"))
        .args([
            port.as_str(),
            outside.path().to_str().unwrap(),
            "--load-s",
            "0",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/health");
    wait_for("the copy to serve", Duration::from_secs(10), || async {
        reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "llm").await;
    let _ = copy.kill();
    let _ = copy.wait();
    // Called healthy, it was the copy that answered: a second one was started beside it.
    assert!(
        matches!(events.last(), Some(GrantEvent::Error { code, message }) if code == "service_failed" && message.contains("already answers")),
        "{events:?}"
    );
    assert_eq!(starts(&gpu), 0, "nothing started beside the copy");
    host.stop().await;
}

#[tokio::test]
async fn a_service_that_cannot_run_fails_before_anything_is_unloaded() {
    let gpu = FakeGpu::new(IDLE);
    let missing = "[[services]]\nname = \"missing\"\ncommand = [\"no-such-program-gpuhost\"]\nhealth_url = \"http://127.0.0.1:9/health\"\n";
    let nowhere = "[[services]]\nname = \"nowhere\"\ncommand = [\"sh\"]\ncwd = \"/nonexistent/folder\"\nhealth_url = \"http://127.0.0.1:9/health\"\n";
    let host = TestHost::start(&arbiter_config(&gpu, &format!("{missing}{nowhere}")))
        .await
        .ready()
        .await;
    let pid = host.worker("w").await["pid"].as_u64().unwrap();
    for (name, said) in [
        ("missing", "no executable of that name on gpuhost's PATH"),
        ("nowhere", "/nonexistent/folder does not exist"),
    ] {
        let events = start_service(&host, name).await;
        assert!(
            matches!(events.last(), Some(GrantEvent::Error { code, message }) if code == "service_unavailable" && message.contains(said)),
            "{name}: {events:?}"
        );
        // Said before the queue: the resident worker was not unloaded for it.
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, GrantEvent::MakingRoom { .. })),
            "{name}: {events:?}"
        );
        let worker = host.worker("w").await;
        assert_eq!(
            (worker["state"].as_str(), worker["pid"].as_u64()),
            (Some("ready"), Some(pid)),
            "{name}"
        );
    }
    host.stop().await;
}

#[tokio::test]
async fn a_service_that_dies_while_healthy_is_failed_not_stopped() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &service(
            &gpu,
            "crash",
            "--load-s 0.1 --mib 2000 --fail-after-s 0.5",
            "",
        ),
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "crash").await;
    assert_healthy(&events);
    // It read `stopped`, as if someone had stopped it.
    wait_status(&host, "crash failed", |s| {
        service_state(s, "crash") == "failed"
    })
    .await;
    let services: Value = host
        .get("/services")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let crash = &services["services"][0];
    let why = crash["last_error"].as_str().unwrap();
    assert!(
        why.contains("exited by itself") && why.contains("exit code 3"),
        "{crash}"
    );
    // Its last words, written just before it exited, are the error's (they were often still
    // in the pipe when the exit was seen, and lost).
    assert!(why.contains("CUDA out of memory"), "{crash}");
    host.stop().await;
}

#[tokio::test]
async fn a_start_whose_callers_all_left_leaves_the_queue() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, &service(&gpu, "vllm", "--load-s 0.1 --mib 2000", ""));
    let host = TestHost::start(&config).await.ready().await;
    let lease: Value = lease_as(&host, "alice").await.json().await.unwrap();
    let id = lease["lease_id"].as_u64().expect("a lease id");
    // A caller who gives up while the start waits for the GPU (a Ctrl-C, a client timeout).
    let mut start = host.post("/services/vllm/start").send().await.unwrap();
    let queued = start.chunk().await.unwrap().expect("an event");
    let queued = String::from_utf8_lossy(&queued);
    assert!(queued.contains("\"queued\""), "{queued}");
    drop(start);
    wait_status(&host, "the start to leave the queue", |s| {
        service_state(s, "vllm") == "stopped" && s["queue"]["waiting"] == 0
    })
    .await;
    let released = host
        .client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200);
    // The GPU goes to the next one (once a sample shows alice's memory back, so it waits):
    // the service did not start for nobody.
    let granted = host
        .post("/gpu/lease")
        .json(&json!({"holder": "bob", "wait": true}))
        .send()
        .await
        .unwrap();
    let events = grant_events(granted).await;
    assert!(
        matches!(events.last(), Some(GrantEvent::Granted { .. })),
        "{events:?}"
    );
    assert_eq!(starts(&gpu), 0);
    host.stop().await;
}

#[tokio::test]
async fn a_shutdown_does_not_wait_for_memory_a_service_leaves_behind() {
    // The driver keeps the service's memory after it exits. At shutdown nothing is granted
    // after it: gpuhost waited the whole teardown_timeout_s (60 s by default) and overran
    // systemd's stop timeout.
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &service(&gpu, "leaky", "--load-s 0.1 --mib 6000 --leak 6000", ""),
    )
    .replace("teardown_timeout_s = 3", "teardown_timeout_s = 60");
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "leaky").await;
    assert_healthy(&events);
    let started = Instant::now();
    host.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_service_that_dies_loading_tells_why_every_time() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(
        &gpu,
        &service(&gpu, "oom", "--load-s 0.2 --die-loading", ""),
    );
    let host = TestHost::start(&config).await.ready().await;
    // A race: it lost the lines in about half the tries. (Each start frees the health port
    // for a while, where another test's free port may land: a few tries only.)
    for _ in 0..4 {
        let events = start_service(&host, "oom").await;
        let Some(GrantEvent::Error { code, message }) = events.last() else {
            panic!("{events:?}");
        };
        assert_eq!(code, "service_failed");
        assert!(
            message.contains("exit code 1") && message.contains("CUDA out of memory"),
            "{message}"
        );
    }
    // A command that detaches (exit 0 at once, its daemon stopped as an orphan) is told how to
    // run it, not only "exit code 0".
    let port = free_port();
    let daemon = format!(
        "[[services]]\nname = \"daemon\"\ncommand = [\"sh\", \"-c\", \"exit 0\"]\nhealth_url = \"http://127.0.0.1:{port}/health\"\npoll_interval_s = 0.1\n"
    );
    let other = TestHost::start(&arbiter_config(&gpu, &daemon))
        .await
        .ready()
        .await;
    let events = start_service(&other, "daemon").await;
    let Some(GrantEvent::Error { message, .. }) = events.last() else {
        panic!("{events:?}");
    };
    assert!(message.contains("daemonizes"), "{message}");
    other.stop().await;
    // Stopped by hand, it reads stopped, its last error kept; `gpuhost stop` succeeds (it said
    // the stop had failed, for a service that had failed before).
    let (code, err, _) = cli(&host, &["stop", "oom"]).await;
    assert_eq!(code, Some(0), "{err}");
    let services = host.get_json("/services").await;
    let oom = &services["services"][0];
    assert_eq!(oom["state"], "stopped", "{oom}");
    assert!(
        oom["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("CUDA out of memory")),
        "{oom}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_worker_is_not_loaded_by_hand_beside_a_lease() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // A lease that names no memory unloads every idle resident.
    let lease: Value = host
        .post("/gpu/lease")
        .json(&json!({"holder": "notebook", "ttl_s": 60}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = lease["lease_id"].as_u64().unwrap();
    wait_for("w to be unloaded", Duration::from_secs(10), || async {
        host.worker("w").await["state"] == "unloaded"
    })
    .await;
    // Loaded by hand it would sit in the lease holder's memory (it did).
    let refused = host.post("/workers/w/load").send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "cannot_load", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("notebook"),
        "{body}"
    );
    assert_eq!(host.worker("w").await["state"], "unloaded");
    // Released, it comes back by itself, and a load by hand is fine again.
    let released = host.client().delete(format!("{}/gpu/lease/{id}", host.url));
    assert_eq!(released.send().await.unwrap().status(), 200);
    wait_for("w to be back", Duration::from_secs(10), || async {
        host.worker("w").await["state"] == "ready"
    })
    .await;
    assert_eq!(
        host.post("/workers/w/load").send().await.unwrap().status(),
        200
    );
    host.stop().await;
}

#[tokio::test]
async fn several_gpus_get_a_queue_each() {
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n{}",
        arbiter_config(
            &gpu,
            &service(&gpu, "llm", "--load-s 0.2 --mib 12000", "device = 1"),
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = start_service(&host, "llm").await;
    assert_healthy(&events);
    // gpuhost pointed the service at GPU 1 (CUDA_VISIBLE_DEVICES): its memory shows there.
    let s = wait_status(&host, "the service's memory on GPU 1", |s| {
        s["gpus"][1]["memory_used_mib"].as_u64() > Some(12_000)
    })
    .await;
    assert_eq!(s["gpus"][0]["memory_used_mib"], 512, "{s:#}");
    let devices = s["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{s:#}");
    assert_eq!(devices[1]["holders"][0]["label"], "service llm", "{s:#}");
    assert!(
        devices[0]["holders"].as_array().unwrap().is_empty(),
        "{s:#}"
    );
    // GPU 0 stays free for speech: the resident was not unloaded, and a job runs at once.
    assert_eq!(s["workers"][0]["state"], "ready", "{s:#}");
    assert_eq!(s["decision"], "idle", "GPU 0 is the reported device: {s:#}");
    result_of(&host.transcribe("", wav(0.2, 16000, 1)).await);
    // A lease for GPU 1 finds it taken; "any" picks the free GPU 0; an unknown GPU is a 400.
    let taken = host
        .post("/gpu/lease")
        .json(&json!({"holder": "x", "vram_mib": 1000, "device": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), 409);
    let any = host
        .post("/gpu/lease")
        .json(&json!({"holder": "y", "vram_mib": 1000, "device": "any"}))
        .send()
        .await
        .unwrap();
    assert_eq!(any.status(), 200);
    let held = leases(&host).await;
    assert_eq!(held[0]["device"], 0, "{held:?}");
    let unknown = host
        .post("/gpu/lease")
        .json(&json!({"holder": "z", "device": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);
    let body: Value = unknown.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("devices: 0, 1"),
        "{body}"
    );
    host.stop().await;
}

#[tokio::test]
async fn an_idle_resident_is_unloaded_and_comes_back_for_the_next_job() {
    let gpu = FakeGpu::new(IDLE);
    let config =
        arbiter_config(&gpu, "").replace("[arbiter]\n", "[arbiter]\nidle_unload_after_s = 0.5\n");
    let host = TestHost::start(&config).await.ready().await;
    let state = |host: &TestHost| {
        let request = host.get("/workers");
        async move {
            let w: Value = request.send().await.unwrap().json().await.unwrap();
            w["workers"][0]["state"].as_str().unwrap().to_string()
        }
    };
    wait_for("the idle worker to unload", Duration::from_secs(10), || {
        let host = &host;
        async move { state(host).await == "unloaded" }
    })
    .await;
    // The next job loads it again (keep-alive, like Ollama's) and works.
    result_of(&host.transcribe("", wav(0.2, 16000, 1)).await);
    let h: Value = host
        .get("/gpu/history")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        h["grants"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["kind"] == "unload" && g["holder"] == "worker w"),
        "{h:#}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_caller_joining_a_failed_starts_teardown_gets_a_start_of_its_own() {
    // The first start times out (3 s: long enough for the fake service's first line on a busy
    // machine) and its process ignores SIGTERM for the 4 s grace: a caller who comes meanwhile
    // was told the dying process was `starting`, then got the old start's error, and the first
    // caller's queued request started a process nobody wanted.
    let gpu = FakeGpu::new(IDLE);
    let slow = service(&gpu, "slow", "--load-s 100 --ignore-term --mib 1000", "")
        .replace("start_timeout_s = 20", "start_timeout_s = 3")
        .replace("stop_grace_s = 1", "stop_grace_s = 4");
    let host = TestHost::start(&arbiter_config(&gpu, &slow))
        .await
        .ready()
        .await;
    let first = host.post("/services/slow/start").send().await.unwrap();
    let first = tokio::spawn(grant_events(first));
    wait_status(&host, "the timed-out start being stopped", |s| {
        service_state(s, "slow") == "stopping"
    })
    .await;
    let joined = host.post("/services/slow/start").send().await.unwrap();
    let joined = grant_events(joined).await;
    // Told at once what it waits for (it heard nothing for the whole grace before).
    assert!(
        matches!(joined.first(), Some(GrantEvent::Queued { waiting_for: Some(w), .. })
        if w.contains("service slow to finish stopping")),
        "{joined:?}"
    );
    let first = first.await.unwrap();
    assert!(
        matches!(first.last(), Some(GrantEvent::Error { code, .. }) if code == "service_timeout"),
        "{first:?}"
    );
    // The joiner's own start: a new process, its own timeout, its own last lines.
    let old: Vec<u32> = first
        .iter()
        .filter_map(|e| match e {
            GrantEvent::Starting { pid } => Some(*pid),
            _ => None,
        })
        .collect();
    let pids: Vec<u32> = joined
        .iter()
        .filter_map(|e| match e {
            GrantEvent::Starting { pid } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(old.len(), 1, "{first:?}");
    assert!(pids.len() == 1 && pids != old, "{joined:?}");
    // Its own log (one process's first line) and its own timeout.
    let first_lines = joined
        .iter()
        .filter(|e| matches!(e, GrantEvent::Log { line } if line == "loading model weights"))
        .count();
    assert_eq!(first_lines, 1, "{joined:?}");
    assert!(
        matches!(joined.last(), Some(GrantEvent::Error { code, .. }) if code == "service_timeout"),
        "{joined:?}"
    );
    let before = starts(&gpu);
    assert_eq!(
        before, 2,
        "one process per start asked for, none for an answered caller"
    );
    wait_status(&host, "the second start torn down", |s| {
        service_state(s, "slow") == "failed"
    })
    .await;
    assert_eq!(starts(&gpu), 2, "no third process");
    host.stop().await;
}

#[tokio::test]
async fn ready_counts_a_worker_unloaded_for_a_lease() {
    // Jobs queue (bounded by max_queue) and reload it once the lease is gone: a 503 kept away
    // the very job that would bring it back.
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let (id, _) = granted_lease(&host, json!({"holder": "bob", "wait": true, "ttl_s": 60})).await;
    assert_eq!(host.worker("w").await["state"], "unloaded");
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);
    assert_eq!(release(&host, id).await, 200);
    host.stop().await;
}

#[tokio::test]
async fn a_failing_worker_unloaded_for_a_lease_stays_failed_and_is_retried_after_it() {
    // Its load fails until a flag file exists. Unloaded to make room, it read `unloaded` (and
    // ready) while every job failed; kept `exited`, nothing retried it with on_demand reload.
    let gpu = FakeGpu::new(IDLE);
    let flag = tempfile::tempdir().unwrap();
    let ok = flag.path().join("ok");
    let script = format!(
        "[ -e {ok} ] || {{ echo not yet >&2; exit 2; }}; exec {py} {fake} w",
        ok = ok.display(),
        py = python(),
        fake = fixture("fake_worker.py").display()
    );
    let worker = fake_worker("w", "").replace(
        &format!(
            "command = [{:?}, {:?}, \"w\"]",
            python(),
            fixture("fake_worker.py").display().to_string()
        ),
        &format!("command = [\"sh\", \"-c\", {script:?}]"),
    );
    assert!(worker.contains("\"sh\""), "{worker}");
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{worker}\n[arbiter]\nteardown_timeout_s = 3\nreload = \"on_demand\"\n{}\n",
        gpu.config("")
    );
    let host = TestHost::start(&config).await;
    wait_for("the load to fail", Duration::from_secs(20), || async {
        host.worker("w").await["state"] == "exited"
    })
    .await;
    let (id, _) = granted_lease(&host, json!({"holder": "bob", "wait": true, "ttl_s": 60})).await;
    let w = host.worker("w").await;
    assert_eq!(w["state"], "exited", "{w}");
    assert_eq!(host.get("/ready").send().await.unwrap().status(), 503);
    std::fs::write(&ok, "").unwrap(); // the cause is gone
    assert_eq!(release(&host, id).await, 200);
    // Its restarts were paused for the lease and resume after it, on_demand or not.
    wait_for("the worker back", Duration::from_secs(20), || async {
        host.worker("w").await["state"] == "ready"
    })
    .await;
    assert_eq!(host.get("/ready").send().await.unwrap().status(), 200);
    host.stop().await;
}

#[tokio::test]
async fn a_lease_id_of_an_earlier_run_is_nobody_elses() {
    // Ids counted from 1 in every run: after a restart, alice's client renewed (and at its end
    // released) bob's lease, which had her old id.
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, "");
    let first = TestHost::start(&config).await.ready().await;
    let (alice, _) = granted_lease(
        &first,
        json!({"holder": "alice", "vram_mib": 100, "wait": true}),
    )
    .await;
    first.stop().await;
    let second = TestHost::start(&config).await.ready().await;
    let (bob, _) = granted_lease(
        &second,
        json!({"holder": "bob", "vram_mib": 100, "wait": true}),
    )
    .await;
    assert_ne!(alice, bob);
    let renew = second
        .post(&format!("/gpu/lease/{alice}/renew"))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), 404, "alice renewed bob's lease");
    assert!(bob < 1 << 53, "ids stay exact in JavaScript: {bob}");
    second.stop().await;
}

#[tokio::test]
async fn a_job_whose_worker_is_pinned_to_another_gpu_waits_for_that_gpus_lease() {
    // Jobs queued on [gpu] device only: a lease holding GPU 1 (its resident unloaded for it)
    // did not stop a job from loading the GPU 1 worker beside it.
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n[pipeline]\nstages = [\"w\"]\n{}\n[arbiter]\nteardown_timeout_s = 3\n{}",
        fake_worker("w", "device = 1\n"),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let (id, _) = granted_lease(
        &host,
        json!({"holder": "y", "device": 1, "wait": true, "ttl_s": 60}),
    )
    .await;
    assert_eq!(host.worker("w").await["state"], "unloaded");
    let job = {
        let request = host.post("/transcribe").body(wav(0.2, 16000, 1));
        tokio::spawn(async move { read_events(request.send().await.unwrap()).await })
    };
    // It waits in GPU 1's queue, behind the lease.
    wait_for(
        "the job in GPU 1's queue",
        Duration::from_secs(10),
        || async {
            host.get_json("/gpu/leases").await["devices"][1]["waiting"]
                .as_array()
                .is_some_and(|w| !w.is_empty())
        },
    )
    .await;
    assert!(!job.is_finished());
    assert_eq!(
        host.worker("w").await["state"],
        "unloaded",
        "loaded under the lease"
    );
    assert_eq!(release(&host, id).await, 200);
    let events = job.await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, gpuhost::protocol::ClientEvent::Queued { .. })),
        "{events:?}"
    );
    result_of(&events);
    host.stop().await;
}

#[tokio::test]
async fn a_job_whose_workers_are_all_on_another_gpu_leaves_the_main_gpu_to_its_lease() {
    // Jobs queued on [gpu] device first: a job whose every worker runs on GPU 1 waited for a
    // lease on GPU 0, and held GPU 0 while it ran.
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", "device = 1\n"),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let (id, _) = granted_lease(
        &host,
        json!({"holder": "y", "device": 0, "wait": true, "ttl_s": 60}),
    )
    .await;
    let response = host
        .post("/transcribe")
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    let events = tokio::time::timeout(Duration::from_secs(20), read_events(response))
        .await
        .expect("the job waited for GPU 0's lease");
    result_of(&events);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, gpuhost::protocol::ClientEvent::Queued { .. })),
        "{events:?}"
    );
    let history = host.get_json("/gpu/history").await;
    let jobs: Vec<&Value> = history["grants"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "job")
        .collect();
    assert_eq!(jobs.len(), 1, "{history}");
    assert_eq!(jobs[0]["device"], 1, "{history}");
    assert_eq!(release(&host, id).await, 200);
    host.stop().await;
}

/// Lease `a` granted on GPU 1 and lease `b` waiting behind it there: a's id, and b's request
/// (its grant events once it ends).
async fn a_holds_gpu_1_and_b_waits(
    host: &TestHost,
) -> (u64, tokio::task::JoinHandle<Vec<GrantEvent>>) {
    let (a, _) = granted_lease(
        host,
        json!({"holder": "a", "device": 1, "wait": true, "ttl_s": 60}),
    )
    .await;
    let b = {
        let request = host
            .post("/gpu/lease")
            .json(&json!({"holder": "b", "device": 1, "wait": true, "ttl_s": 60}));
        tokio::spawn(async move { grant_events(request.send().await.unwrap()).await })
    };
    wait_for("b waiting on GPU 1", Duration::from_secs(10), || async {
        host.get_json("/gpu/leases").await["devices"][1]["waiting"]
            .as_array()
            .map_or(0, Vec::len)
            == 1
    })
    .await;
    (a, b)
}

/// The lease id a waiting request ended with (its last event a grant).
async fn granted_id(request: tokio::task::JoinHandle<Vec<GrantEvent>>) -> u64 {
    lease_id_of(&request.await.unwrap())
}

#[tokio::test]
async fn leases_waiting_on_a_gpu_no_speech_job_uses_leave_ready_and_health_alone() {
    // Every GPU's queue counted: leases waiting on GPU 1 made /ready 503 ("the GPU 1 queue is
    // full") for a pipeline on GPU 0, whose jobs ran meanwhile.
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n[limits]\nmax_queue = 1\n[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", ""),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let (id, waiting) = a_holds_gpu_1_and_b_waits(&host).await;
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);
    let health = host.get_json("/health").await;
    assert_eq!(health["queue"]["waiting"], 0, "{health}");
    result_of(&host.transcribe("", wav(0.2, 16000, 1)).await);
    assert_eq!(release(&host, id).await, 200);
    let lease_id = granted_id(waiting).await;
    assert_eq!(release(&host, lease_id).await, 200);
    host.stop().await;
}

#[tokio::test]
async fn a_pipeline_on_the_cpu_is_unready_when_its_jobs_queue_is_full() {
    // Jobs on the CPU wait for a job place in [gpu] device's queue: /ready said 200 while the
    // next /transcribe got a 429.
    let gpu = FakeGpu::new(IDLE);
    let config = format!(
        "[limits]\nmax_queue = 1\n[pipeline]\nstages = [\"c\"]\n{}\n{}",
        fake_worker("c", SAYS_CPU),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let mut first = running_job(&host, "?prompt=fake:sleep=3000").await;
    let mut second = queued_job(&host).await;
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.unwrap();
    assert!(
        body["reasons"][0].as_str().unwrap().contains("is full"),
        "{body}"
    );
    let third = host.post_body("/transcribe", wav(0.2, 16_000, 1)).await;
    assert_eq!(third.status(), 429);
    for job in [&mut first, &mut second] {
        let last = job.until(ClientEvent::is_final).await;
        assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    }
    host.stop().await;
}

#[tokio::test]
async fn a_job_waiting_on_its_second_gpu_hears_its_place_change() {
    // On a job's second GPU only the first place was said; PROTOCOL promises `queued` again
    // whenever it changes.
    let gpu = FakeGpu::new(TWO_GPUS);
    let config = format!(
        "[gpu]\ndevices = [0, 1]\n[pipeline]\nstages = [\"w0\", \"w1\"]\nparallel = []\n{}\n{}\n[arbiter]\nteardown_timeout_s = 3\n{}",
        fake_worker("w0", ""),
        fake_worker("w1", "device = 1\n"),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    let (a, b) = a_holds_gpu_1_and_b_waits(&host).await;
    let mut job = EventReader::new(
        host.post("/transcribe")
            .body(wav(0.2, 16_000, 1))
            .send()
            .await
            .unwrap(),
    );
    let first = job.next().await;
    assert!(
        matches!(first, Some(ClientEvent::Queued { position: 2, .. })),
        "{first:?}"
    );
    assert_eq!(release(&host, a).await, 200);
    let lease_id = granted_id(b).await;
    // (What it waits for may be said first: a's memory being checked.)
    let next = job
        .until(|e| !matches!(e, ClientEvent::Queued { position: 2, .. }))
        .await;
    assert!(
        matches!(next, ClientEvent::Queued { position: 1, .. }),
        "{next:?}"
    );
    assert_eq!(release(&host, lease_id).await, 200);
    let last = job.until(ClientEvent::is_final).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    host.stop().await;
}

#[tokio::test]
async fn a_query_on_a_control_endpoint_is_refused_by_name() {
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    // `wait` is a body field: as a query it was ignored, and the lease not waited for.
    let refused = host
        .post("/gpu/lease?wait=true")
        .json(&json!({"holder": "alice"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("given: wait") && message.contains("JSON body"),
        "{body}"
    );
    let leases = host.get_json("/gpu/leases").await;
    assert_eq!(leases["leases"], json!([]), "{leases}");
    let refused = host.post("/workers/w/unload?force=1").send().await.unwrap();
    assert_eq!(refused.status(), 400);
    // Without one, as before.
    assert_eq!(lease_as(&host, "alice").await.status(), 200);
    host.stop().await;
}

#[tokio::test]
async fn a_lease_client_whose_stderr_is_closed_still_runs_and_gives_the_lease_back() {
    // `gpuhost lease -- cmd 2>&1 | head -1`: the reader goes after a line, and the client's
    // next line panicked it, leaving the lease held for its TTL and the program killed.
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let mut child = lease_command(&host, &[], &["sh", "-c", "sleep 1; exit 5"])
        .spawn()
        .unwrap();
    drop(child.stderr.take()); // the reader is gone
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(5), "the program's own status");
    wait_for(
        "the lease to be given back",
        Duration::from_secs(10),
        || {
            let host = &host;
            async move { leases(host).await.is_empty() }
        },
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn an_interrupted_lease_client_that_waits_leaves_the_queue_with_130() {
    // Ctrl-C while the lease waits behind another holder: the client ends as a shell's
    // interrupted command does, and nothing of its request stays queued.
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    assert_eq!(lease_as(&host, "alice").await.status(), 200);
    let mut child = lease_command(&host, &[], &["true"]).spawn().unwrap();
    wait_for("the lease to wait", Duration::from_secs(10), || async {
        host.get_json("/status").await["queue"]["waiting"] == 1
    })
    .await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(130));
    wait_for("the queue to empty", Duration::from_secs(10), || async {
        host.get_json("/status").await["queue"]["waiting"] == 0
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_lease_whose_program_just_ended_is_checked_on_a_later_sample() {
    // Memory taken in a lease's last moments (its program handing work to a server as it
    // exits) was missed: the last sample, taken before, looked free, and the next holder was
    // granted at once beside it. A release that says when its program ended (as `gpuhost
    // lease` does) is checked on a sample taken after that.
    let gpu = FakeGpu::new(IDLE);
    let host = arbiter_host(&gpu).await;
    let granted: Value = lease_as(&host, "alice").await.json().await.unwrap();
    let id = granted["lease_id"].as_u64().expect("a lease id");
    gpu.set_state("gpu: NVIDIA GeForce RTX 5090, 0, 9512, 32607, 41, 28.5\n");
    let ended = host
        .client()
        .delete(format!("{}/gpu/lease/{id}", host.url))
        .header("gpuhost-program-ended-ms-ago", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    let next = lease_as(&host, "bob").await;
    assert_ne!(next.status(), 200, "granted beside 9 GB nobody gave back");
    // Refused for what it is: a lease that ended whose memory is awaited, not one held.
    let why = next.text().await.unwrap();
    assert!(
        why.contains("ended: waiting for a sample") || why.contains("did not come back"),
        "{why}"
    );
    // Given back, the GPU goes on.
    gpu.set_state(IDLE);
    wait_for("bob's grant", Duration::from_secs(20), || async {
        lease_as(&host, "bob").await.status() == 200
    })
    .await;
    // A header that is no number of milliseconds is refused by name.
    let refused = host
        .client()
        .delete(format!("{}/gpu/lease/1", host.url))
        .header("gpuhost-program-ended-ms-ago", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    host.stop().await;
}

#[tokio::test]
async fn touch_marks_a_running_service_used_and_refuses_a_stopped_one() {
    let gpu = FakeGpu::new(IDLE);
    let config = arbiter_config(&gpu, &service(&gpu, "vllm", "--load-s 0.1 --mib 2000", ""));
    let host = TestHost::start(&config).await.ready().await;
    // Stopped: a 200 would tell a caller about to use it that all is well.
    let refused = host.post("/services/vllm/touch").send().await.unwrap();
    assert_eq!(refused.status(), 409);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "not_running", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("stopped") && message.contains("/services/vllm/start"),
        "{message}"
    );
    assert_healthy(&start_service(&host, "vllm").await);
    let idle_for = |s: &Value| -> f64 {
        s["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "vllm")
            .and_then(|v| v["last_use_s_ago"].as_f64())
            .unwrap_or(0.0)
    };
    wait_status(&host, "the service to sit unused a while", |s| {
        idle_for(s) >= 0.5
    })
    .await;
    let touched = host.post("/services/vllm/touch").send().await.unwrap();
    assert_eq!(touched.status(), 200);
    wait_status(&host, "the touch to count as use", |s| idle_for(s) < 0.5).await;
    host.stop().await;
}
