//! GPU status with a fake `nvidia-smi` (`tests/fixtures/fake_nvidia_smi.py`, behind a per-test wrapper) and a fake
//! `/proc`: every line of host code runs for real.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::*;

pub struct FakeGpu {
    pub dir: tempfile::TempDir,
}

impl FakeGpu {
    pub fn new(state: &str) -> FakeGpu {
        let dir = tempfile::tempdir().unwrap();
        let fake = fixture("fake_nvidia_smi.py");
        let d = dir.path().display().to_string();
        let script = format!(
            "#!/bin/sh\nexport FAKE_GPU_STATE={d}/state\nexport FAKE_GPU_PROCS_DIR={d}/procs\n[ -f {d}/fail ] && export FAKE_NVIDIA_SMI_FAIL=1\n[ -f {d}/hang ] && export FAKE_NVIDIA_SMI_HANG=30\nexec {} -S {} \"$@\"\n",
            python_exe(),
            fake.display()
        );
        let smi = dir.path().join("nvidia-smi");
        std::fs::write(&smi, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        let gpu = FakeGpu { dir };
        gpu.set_state(state);
        gpu
    }

    pub fn set_state(&self, state: &str) {
        let tmp = self.dir.path().join("state.tmp");
        std::fs::write(&tmp, state).unwrap();
        std::fs::rename(tmp, self.dir.path().join("state")).unwrap();
    }

    pub fn set_flag(&self, name: &str, on: bool) {
        let path = self.dir.path().join(name);
        if on {
            std::fs::write(path, "").unwrap();
        } else {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Where the fake services write their GPU processes (and a `leak`).
    pub fn procs_dir(&self) -> PathBuf {
        self.dir.path().join("procs")
    }

    pub fn proc_root(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    /// Adds a process to the fake /proc.
    pub fn process(&self, pid: u32, ppid: u32, argv: &[&str]) {
        let dir = self.proc_root().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let cmdline: String = argv.iter().map(|a| format!("{a}\0")).collect();
        std::fs::write(dir.join("cmdline"), cmdline).unwrap();
        let comm = argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .unwrap_or("kworker");
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nPPid:\t{ppid}\n"),
        )
        .unwrap();
    }

    pub fn remove_process(&self, pid: u32) {
        let _ = std::fs::remove_dir_all(self.proc_root().join(pid.to_string()));
    }

    /// The `[gpu.status]` table for this fake, fast timings.
    pub fn config(&self, extra: &str) -> String {
        format!(
            "[gpu.status]\nbackend = \"auto\"\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\nnvidia_smi = {:?}\nproc_root = {:?}\ninterval_s = 0.1\nstale_after_s = 2.0\ntimeout_s = 1.0\nquiet_period_s = 0.3\n{extra}\n",
            self.dir.path().join("nvidia-smi").display().to_string(),
            self.proc_root().display().to_string(),
        )
    }
}

pub const IDLE: &str = "gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n";

async fn status(host: &TestHost) -> Value {
    let r = host.get("/status").send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

pub(super) async fn wait_status(
    host: &TestHost,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(host).await;
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "never saw {what}: {s:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn wait_decision(host: &TestHost, want: &str) -> Value {
    wait_status(host, want, |s| s["decision"] == want).await
}

fn no_workers(config: &str) -> String {
    format!("[pipeline]\nstages = []\n[workers]\n{config}")
}

/// No workers, `gpu` sampled, `device` the configured GPU.
fn on_device(device: u32, gpu: &FakeGpu) -> String {
    format!("[gpu]\ndevice = {device}\n{}", no_workers(&gpu.config("")))
}

/// The first sample of the configured GPU with a process listed (on a loaded machine the first
/// sample may come before the process list does).
async fn sample_with_a_process(host: &TestHost) -> Value {
    wait_status(host, "a sample with a process", |s| {
        !s["gpu"].is_null() && s["processes"].as_array().is_some_and(|p| !p.is_empty())
    })
    .await
}

#[tokio::test]
async fn idle_gpu_keeps_the_original_fields() {
    let gpu = FakeGpu::new(IDLE);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    let s = wait_decision(&host, "idle").await;
    assert_eq!(s["is_idle"], true);
    let g = &s["gpu"];
    assert_eq!(g["name"], "NVIDIA GeForce RTX 5090");
    assert_eq!(
        (
            g["utilization"].as_u64(),
            g["memory_used_mib"].as_u64(),
            g["memory_total_mib"].as_u64()
        ),
        (Some(0), Some(512), Some(32607))
    );
    assert_eq!(
        (g["temperature"].as_u64(), g["power_draw"].as_f64()),
        (Some(41), Some(28.5))
    );
    assert_eq!(s["processes"], serde_json::json!([]));
    assert_eq!(s["free_mib"], 32607 - 512);
    assert_eq!(s["backend"]["active"], "nvidia-smi");
    assert!(s["backend"]["unavailable"][0]["error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/libnvidia-ml.so.1"));
    host.stop().await;
}

/// A health endpoint that answers 503 until switched on.
pub(super) async fn health_server(ready: Arc<AtomicBool>) -> String {
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move || {
            let ready = ready.clone();
            async move {
                if ready.load(Ordering::SeqCst) {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/health", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn vllm_ramping_memory_while_loading_reads_loading_never_idle() {
    let gpu = FakeGpu::new(IDLE);
    let ready = Arc::new(AtomicBool::new(false));
    let health = health_server(ready.clone()).await;
    let watch = format!(
        "[[gpu.watch]]\nname = \"vllm\"\npattern = \"vllm.entrypoints\"\nhealth_url = {health:?}\n"
    );
    let host = TestHost::start(&no_workers(&gpu.config(&watch))).await;
    wait_decision(&host, "idle").await;
    // The server starts: its process exists before it touches the GPU.
    gpu.process(
        4242,
        1,
        &[
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "google/gemma-3-27b-it",
        ],
    );
    wait_decision(&host, "loading").await;
    let mut seen = Vec::new();
    for used in [0u64, 200, 2_000, 9_000, 18_000, 24_000] {
        let state = if used == 0 {
            IDLE.to_string()
        } else {
            format!("{IDLE}proc: 4242, python3, {used}\n")
        };
        gpu.set_state(&state);
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let s = status(&host).await;
            seen.push(s["decision"].as_str().unwrap().to_string());
            assert_ne!(s["decision"], "idle", "at {used} MiB: {s:#}");
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }
    let s = wait_decision(&host, "loading").await;
    assert!(
        s["reason"].as_str().unwrap().contains("vllm (pid 4242)"),
        "{s:#}"
    );
    assert_eq!(s["processes"][0]["watch"], "vllm");
    assert!(
        seen.iter().filter(|d| *d == "loading").count() > seen.len() / 2,
        "{seen:?}"
    );
    // Serving now.
    ready.store(true, Ordering::SeqCst);
    let s = wait_decision(&host, "busy").await;
    assert_eq!(s["is_idle"], false);
    // Killed afterwards: the GPU becomes idle after the quiet period.
    gpu.remove_process(4242);
    gpu.set_state(IDLE);
    wait_decision(&host, "idle").await;
    host.stop().await;
}

#[tokio::test]
async fn busy_with_command_lines_and_a_kernel_thread_resolved_through_ppid() {
    let gpu = FakeGpu::new(&format!(
        "{IDLE}proc: 700, python3, 14000\nproc: 901, [N/A], 3000\n"
    ));
    gpu.process(1, 0, &["/sbin/init"]);
    gpu.process(700, 1, &["/opt/asr/.venv/bin/python", "-m", "gpuhost_asr"]);
    gpu.process(
        800,
        1,
        &[
            "/usr/bin/python3",
            "/opt/comfyui/main.py",
            "--listen",
            "0.0.0.0",
        ],
    );
    gpu.process(900, 800, &[]);
    gpu.process(901, 900, &[]);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    let s = wait_status(&host, "two processes", |s| {
        s["processes"].as_array().is_some_and(|p| p.len() == 2)
    })
    .await;
    assert_eq!(s["decision"], "busy");
    assert_eq!(s["is_idle"], false);
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs[0]["pid"], 700);
    assert_eq!(procs[0]["name"], "python3");
    assert_eq!(procs[0]["used_memory_mib"], 14000);
    assert_eq!(
        procs[0]["command"],
        "/opt/asr/.venv/bin/python -m gpuhost_asr"
    );
    assert_eq!(
        procs[1]["command"],
        "/usr/bin/python3 /opt/comfyui/main.py --listen 0.0.0.0"
    );
    assert_eq!(procs[1]["command_pid"], 800);
    assert!(procs[1]["command_note"]
        .as_str()
        .unwrap()
        .contains("ancestor 800"));
    assert!(s["reason"].as_str().unwrap().contains("2 process(es)"));
    host.stop().await;
}

#[tokio::test]
async fn failing_and_hanging_nvidia_smi_read_unknown() {
    let gpu = FakeGpu::new(IDLE);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    wait_decision(&host, "idle").await;
    gpu.set_flag("fail", true);
    let s = wait_decision(&host, "unknown").await;
    assert_eq!(s["is_idle"], false);
    assert!(s["gpu"].is_null());
    assert!(
        s["error"].as_str().unwrap().contains("exit code 9"),
        "{s:#}"
    );
    let h: Value = reqwest::get(format!("{}/health", host.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["gpu"]["sampling"], "failing");
    // Open to anyone: without nvidia-smi's path or its stderr.
    let said = h["gpu"]["error"].as_str().unwrap();
    assert!(said.contains("/status says why"), "{h}");
    assert!(!said.contains("exit code") && !said.contains("smi"), "{h}");
    gpu.set_flag("fail", false);
    wait_decision(&host, "idle").await;

    gpu.set_flag("hang", true);
    let s = wait_decision(&host, "unknown").await;
    assert!(
        s["error"].as_str().unwrap().contains("did not finish"),
        "{s:#}"
    );
    // Requests never wait for the hung driver.
    let started = Instant::now();
    status(&host).await;
    reqwest::get(format!("{}/health", host.url)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    gpu.set_flag("hang", false);
    wait_decision(&host, "idle").await;

    // A listing longer than any GPU can run is garbage, not 5000 holders to describe.
    let garbage: String = (0..5000)
        .map(|i| format!("proc: {}, python, 10\n", 100_000 + i))
        .collect();
    gpu.set_state(&format!("{IDLE}{garbage}"));
    let s = wait_decision(&host, "unknown").await;
    assert!(
        s["error"].as_str().unwrap().contains("5000 GPU processes"),
        "{s:#}"
    );
    assert!(
        s["processes"].as_array().is_none_or(|p| p.is_empty()),
        "{s:#}"
    );
    gpu.set_state(IDLE);
    wait_decision(&host, "idle").await;
    host.stop().await;
}

/// A FIFO standing in for a `cmdline` that blocks its readers: dropped, it gives a reader
/// under way a line and puts a plain file in its place.
struct Unstick(PathBuf);

impl Drop for Unstick {
    fn drop(&mut self) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: with no reader waiting it fails, and nothing waits on it.
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.0);
        let fresh = self.0.with_extension("new");
        let _ = std::fs::write(&fresh, "/opt/asr/.venv/bin/python\0-m\0gpuhost_asr\0");
        let _ = std::fs::rename(&fresh, &self.0);
        if let Ok(mut writer) = writer {
            let _ = writer.write_all(b"x\0");
        }
    }
}

#[tokio::test]
async fn a_hanging_proc_read_reads_unknown_and_sampling_recovers() {
    // Reading /proc/PID/cmdline blocks while that process's memory map is locked (a process
    // stuck in the driver). Here the fake /proc's cmdline is a FIFO nobody writes: opening it
    // blocks the same way.
    let gpu = FakeGpu::new(&format!("{IDLE}proc: 700, python3, 14000\n"));
    gpu.process(700, 1, &["/opt/asr/.venv/bin/python", "-m", "gpuhost_asr"]);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    wait_status(&host, "the command line", |s| {
        s["processes"][0]["command"] == "/opt/asr/.venv/bin/python -m gpuhost_asr"
    })
    .await;
    let cmdline = gpu.proc_root().join("700/cmdline");
    std::fs::remove_file(&cmdline).unwrap();
    let c = std::ffi::CString::new(cmdline.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Frees the stuck read however the test ends (a runtime waits for its blocking threads).
    let stuck = Unstick(cmdline.clone());

    // The first sample to meet it waits its timeout ("did not finish within 1s"); later ones
    // do not wait on the stuck read, nor start a second one: they say how long.
    wait_status(&host, "the hung read", |s| {
        s["error"].as_str().is_some_and(|e| {
            e.contains("/proc/ did not finish within") || e.contains("/proc/ has not returned")
        })
    })
    .await;
    let s = wait_status(&host, "the stuck read's age", |s| {
        s["error"]
            .as_str()
            .is_some_and(|e| e.contains("has not returned for"))
    })
    .await;
    assert_eq!(s["decision"], "unknown");
    assert_eq!(s["is_idle"], false);
    assert_eq!(s["processes"][0]["pid"], 700);
    assert_eq!(s["processes"][0]["used_memory_mib"], 14000);
    assert_eq!(s["processes"][0]["command"], "");
    let started = Instant::now();
    status(&host).await;
    reqwest::get(format!("{}/health", host.url)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // The process comes loose: the blocked read gets its line, the next samples read /proc.
    drop(stuck);
    let s = wait_decision(&host, "busy").await;
    assert!(s["error"].is_null(), "{s:#}");
    assert_eq!(
        s["processes"][0]["command"],
        "/opt/asr/.venv/bin/python -m gpuhost_asr"
    );
    host.stop().await;
}

#[tokio::test]
async fn several_gpus_and_the_configured_device() {
    let state = "gpu: NVIDIA H200, 3, 1000, 143771, 35, 90.5\ngpu: NVIDIA GeForce RTX 5090, 97, 30000, 32607, 77, 480.0\nproc: 55, python3, 29000, 1\n";
    let gpu = FakeGpu::new(state);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    let s = sample_with_a_process(&host).await;
    assert_eq!(s["decision"], "busy");
    assert_eq!(s["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(
        s["gpus"][1]["uuid"],
        "GPU-fa4e0000-0000-4000-8000-000000000001"
    );
    assert_eq!(s["gpu"]["name"], "NVIDIA H200");
    assert_eq!(s["processes"][0]["gpu_index"], 1);
    assert_eq!(
        s["processes"][0]["command"], "",
        "pid 55 is not in the fake /proc"
    );
    host.stop().await;

    let host = TestHost::start(&on_device(1, &gpu)).await;
    let s = wait_status(&host, "a sample", |s| !s["gpu"].is_null()).await;
    assert_eq!(s["gpu"]["name"], "NVIDIA GeForce RTX 5090");
    assert_eq!(s["gpu"]["index"], 1);
    host.stop().await;
}

#[tokio::test]
async fn a_gpu_without_memory_figures_fails_only_its_own_sample() {
    // A unified-memory board (GB10) beside the configured GPU: nvidia-smi gives it no memory
    // figures. The configured GPU is judged as usual (the whole sample failed before), the
    // other is listed as unmeasured with its processes on it.
    let state = "gpu: NVIDIA H200, 0, 10, 143771, 35, 90.5\ngpu: NVIDIA GB10, [N/A], [N/A], [N/A], 45, [N/A]\nproc: 55, python3, 29000, 1\n";
    let gpu = FakeGpu::new(state);
    let host = TestHost::start(&no_workers(&gpu.config(""))).await;
    let s = sample_with_a_process(&host).await;
    assert!(s["error"].is_null(), "{s:#}");
    assert_ne!(s["decision"], "unknown", "{s:#}");
    assert_eq!(s["gpu"]["name"], "NVIDIA H200");
    assert_eq!(s["gpus"].as_array().unwrap().len(), 1);
    let unmeasured = &s["gpus_unmeasured"][0];
    assert_eq!(unmeasured["index"], 1, "{s:#}");
    assert_eq!(unmeasured["name"], "NVIDIA GB10");
    assert!(
        unmeasured["why"]
            .as_str()
            .unwrap()
            .contains("no memory figures"),
        "{s:#}"
    );
    assert_eq!(s["processes"][0]["gpu_index"], 1);
    host.stop().await;

    // Configured on the unmeasured GPU: unknown, and why.
    let host = TestHost::start(&on_device(1, &gpu)).await;
    let s = wait_status(&host, "the missing figures", |s| {
        s["error"]
            .as_str()
            .is_some_and(|e| e.contains("no memory figures"))
    })
    .await;
    assert_eq!(s["decision"], "unknown");
    assert_eq!(s["is_idle"], false);
    host.stop().await;
}

#[tokio::test]
async fn auth_hide_commands_and_own_workers() {
    let gpu = FakeGpu::new(IDLE);
    let config = format!(
        "token = \"t0k\"\n[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", ""),
        gpu.config("hide_commands = true")
    );
    let host = TestHost::start(&config).await.ready().await;
    let plain = reqwest::Client::new();
    for path in ["/status", "/metrics", "/workers"] {
        assert_eq!(
            plain
                .get(format!("{}{path}", host.url))
                .send()
                .await
                .unwrap()
                .status(),
            401,
            "{path}"
        );
    }
    assert_eq!(
        plain
            .get(format!("{}/health", host.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The worker's real pid shows up on the (fake) GPU.
    let pid = host.worker("w").await["pid"].as_u64().unwrap();
    gpu.process(pid as u32, 1, &["python3", "fake_worker.py", "w"]);
    gpu.set_state(&format!("{IDLE}proc: {pid}, python3, 1500\n"));
    let s = wait_status(&host, "the worker on the GPU", |s| {
        s["processes"][0]["pid"] == pid
    })
    .await;
    assert_eq!(s["decision"], "busy");
    assert_eq!(s["processes"][0]["worker"], "w");
    assert_eq!(s["processes"][0]["command"], "", "hidden by config");
    assert_eq!(s["reclaimable_mib"], 1500);
    host.stop().await;
}

#[tokio::test]
async fn a_worker_is_named_and_measured_while_it_loads() {
    let gpu = FakeGpu::new(IDLE);
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", "load_timeout_s = 60\nenv = { FAKE_NO_READY = \"1\" }"),
        gpu.config("")
    );
    let host = TestHost::start(&config).await;
    wait_for(
        "the worker to be loading",
        Duration::from_secs(10),
        || async { host.worker("w").await["pid"].is_u64() },
    )
    .await;
    let pid = host.worker("w").await["pid"].as_u64().unwrap();
    gpu.process(pid as u32, 1, &["python3", "fake_worker.py", "w"]);
    gpu.set_state(&format!("{IDLE}proc: {pid}, python3, 2500\n"));
    // A model may take most while it loads: /status says whose that memory is, and the peak is
    // the worker's footprint.
    let s = wait_status(&host, "the loading worker on the GPU", |s| {
        s["processes"][0]["worker"] == "w"
    })
    .await;
    assert_eq!(s["processes"][0]["pid"], pid, "{s:#}");
    wait_for("its footprint", Duration::from_secs(10), || async {
        host.worker("w").await["measured_vram_mib"] == 2500
    })
    .await;
    assert_eq!(host.worker("w").await["state"], "starting");
    host.stop().await;
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text() {
    let gpu = FakeGpu::new(&format!("{IDLE}proc: 31, python3, 700\n"));
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", ""),
        gpu.config("")
    );
    let host = TestHost::start(&config).await.ready().await;
    result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
    wait_status(&host, "pid 31", |s| s["processes"][0]["pid"] == 31).await;
    let r = host.get("/metrics").send().await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text; version=1.0.0"));
    let text = r.text().await.unwrap();
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics ends with # EOF:\n{text}"
    );
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("{name} {label:?} missing in\n{text}"));
        match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        }
    };
    assert_eq!(
        value("gpuhost_gpu_memory_total_bytes", Some(("gpu", "0"))),
        32607.0 * 1048576.0
    );
    assert_eq!(value("gpuhost_gpu_temperature_celsius", None), 41.0);
    assert_eq!(
        value("gpuhost_gpu_process_memory_bytes", Some(("pid", "31"))),
        700.0 * 1048576.0
    );
    assert_eq!(
        value("gpuhost_gpu_decision", Some(("decision", "busy"))),
        1.0
    );
    assert_eq!(value("gpuhost_worker_state", Some(("state", "ready"))), 1.0);
    assert_eq!(
        value("gpuhost_worker_tasks_total", Some(("outcome", "ok"))),
        1.0
    );
    assert_eq!(value("gpuhost_jobs_total", Some(("outcome", "ok"))), 1.0);
    assert_eq!(value("gpuhost_queue_waiting", None), 0.0);
    assert!(scrape.samples.iter().any(|s| s.metric == "gpuhost_job_duration_seconds"
        && matches!(&s.value, prometheus_parse::Value::Histogram(h) if h.iter().any(|b| b.count == 1.0))));
    // One pid listed twice on one GPU (MIG instances): its memory is the sum, as /status's.
    gpu.set_state(&format!(
        "{IDLE}proc: 31, python3, 700\nproc: 31, python3, 500\n"
    ));
    wait_status(&host, "pid 31 twice", |s| {
        s["processes"].as_array().is_some_and(|p| p.len() == 2)
    })
    .await;
    let text = host.metrics().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("gpuhost_gpu_process_memory_bytes{") && l.contains("pid=\"31\""))
        .unwrap();
    let bytes: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(bytes, 1200.0 * 1048576.0, "{line}");
    host.stop().await;
}

#[tokio::test]
async fn no_backend_reads_unknown_with_reasons() {
    let host = TestHost::start(&no_workers(
        "[gpu.status]\nbackend = \"nvml\"\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n",
    ))
    .await;
    let s = status(&host).await;
    assert_eq!(s["decision"], "unknown");
    assert_eq!(s["is_idle"], false);
    assert_eq!(s["backend"]["active"], "none");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("no NVIDIA GPU: NVML library not found"),
        "{s:#}"
    );
    assert!(
        !reason.contains("/nonexistent"),
        "one line, no probe list: {s:#}"
    );
    let unavailable = s["backend"]["unavailable"].as_array().unwrap();
    assert!(
        unavailable.iter().any(|u| u["backend"] == "nvml"
            && u["error"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/libnvidia-ml.so.1")),
        "the full probe list stays in backend.unavailable: {s:#}"
    );
    host.stop().await;
}

#[tokio::test]
async fn status_command_renders_a_terminal_view() {
    let gpu = FakeGpu::new(&format!("{IDLE}proc: 700, python3, 14000\n"));
    gpu.process(700, 1, &["/usr/bin/python3", "/opt/comfyui/main.py"]);
    let host = TestHost::start(&format!("token = \"k\"\n{}", no_workers(&gpu.config("")))).await;
    wait_status(&host, "pid 700", |s| s["processes"][0]["pid"] == 700).await;
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"))
            .args(["status", "--server", &url, "--token", "k"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("BUSY"), "{text}");
    assert!(
        text.contains("/opt/comfyui/main.py")
            && text.contains("14000 MiB")
            && text.contains("NVIDIA GeForce RTX 5090"),
        "{text}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_watched_programs_health_is_asked_directly_not_through_a_proxy() {
    // A proxy from the environment answered for the program (or, a real one, failed it).
    let gpu = FakeGpu::new(IDLE);
    let health = health_server(Arc::new(AtomicBool::new(false))).await;
    let watch = format!(
        "[[gpu.watch]]\nname = \"vllm\"\npattern = \"vllm.entrypoints\"\nhealth_url = {health:?}\n"
    );
    let proxy = health_server(Arc::new(AtomicBool::new(true))).await;
    let proxy = proxy.trim_end_matches("/health").to_string();
    let served = Binary::start(
        &no_workers(&gpu.config(&watch)),
        &[
            ("HTTP_PROXY", proxy.as_str()),
            ("http_proxy", proxy.as_str()),
        ],
    );
    gpu.process(
        4242,
        1,
        &["python3", "-m", "vllm.entrypoints.openai.api_server"],
    );
    gpu.set_state(&format!("{IDLE}proc: 4242, python3, 9000\n"));
    let url = format!("{}/status", served.url);
    // The program says 503: still loading, whatever the proxy would say.
    wait_for(
        "the watched program's state",
        Duration::from_secs(20),
        || async {
            let s: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
            s["decision"] == "loading"
        },
    )
    .await;
    let s: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(s["watched"][0]["healthy"], false, "{s:#}");
}
