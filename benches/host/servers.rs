//! The two servers under test, each started as its own process: the seed anchor (FastAPI +
//! uvicorn, its venv made under `.bench/`) and the `gpuhost` binary.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "bench-token";

/// What both servers under test offer the benchmark.
pub trait Server {
    fn served(&self) -> &Served;
    fn long_job_url(&self) -> String;
    fn status_url(&self) -> String {
        format!("{}/status", self.served().base)
    }
    fn token(&self) -> &str {
        TOKEN
    }
    fn rss_mib(&self) -> f64 {
        status_mib(self.served().child.id(), "VmRSS:")
    }
    /// The part of the RSS that is the process's own memory (heap, stacks), without the pages
    /// of its program and libraries that it maps from files (shared, and dropped under pressure).
    fn rss_anon_mib(&self) -> f64 {
        status_mib(self.served().child.id(), "RssAnon:")
    }
}

/// A server process and its base URL; SIGTERMed (then killed) when stopped.
pub struct Served {
    child: Child,
    base: String,
}

impl Served {
    /// Spawns `command` and waits until `/health` on `port` answers.
    async fn start(mut command: Command, port: u16) -> Served {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        wait_healthy(&format!("{base}/health"), &mut child).await;
        Served { child, base }
    }

    pub fn stop(self) {
        stop(self.child)
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn anchor_dir() -> PathBuf {
    repo().join("../shared/bench/seed_anchor")
}

/// Whether the seed anchor (the baseline) sits beside the checkout; the bench needs it.
pub fn anchor_available() -> Result<(), String> {
    let dir = anchor_dir();
    if dir.join("server.py").exists() && dir.join("worker.py").exists() {
        Ok(())
    } else {
        Err(format!(
            "the seed anchor is not at {}: this benchmark compares gpuhost with it side by side, so it needs shared/ beside the checkout",
            dir.display()
        ))
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn worker_argv() -> [String; 3] {
    [
        "python3".into(),
        repo().join("benches/stamp_stderr.py").display().to_string(),
        anchor_dir().join("worker.py").display().to_string(),
    ]
}

async fn wait_healthy(url: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = reqwest::get(url).await {
            if r.status().is_success() {
                return;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{url}: server exited early: {status}");
        }
        assert!(Instant::now() < deadline, "{url} never became healthy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `kB` field of `/proc/PID/status`, in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024.0
}

fn stop(mut child: Child) {
    // SAFETY: plain kill(2) of our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub struct Anchor {
    served: Served,
}

impl Anchor {
    fn python() -> PathBuf {
        if let Ok(p) = std::env::var("GPUHOST_BENCH_ANCHOR_PYTHON") {
            return PathBuf::from(p);
        }
        let venv = repo().join(".bench/anchor-venv");
        let python = venv.join("bin/python");
        if !python.exists() {
            eprintln!(
                "creating {} (fastapi, uvicorn, python-multipart)…",
                venv.display()
            );
            let ok = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .unwrap()
                .success()
                && Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        "fastapi",
                        "uvicorn",
                        "python-multipart",
                    ])
                    .status()
                    .unwrap()
                    .success();
            assert!(ok, "could not set up the anchor's venv");
        }
        python
    }

    pub async fn start() -> Anchor {
        let port = free_port();
        let dir = anchor_dir();
        let mut command = Command::new(Anchor::python());
        command
            .args([
                "-m",
                "uvicorn",
                "server:app",
                "--host",
                "127.0.0.1",
                "--log-level",
                "warning",
                "--port",
            ])
            .arg(port.to_string())
            .current_dir(&dir)
            .env("WORKER_CMD", worker_argv().join(" "))
            .env("NVIDIA_SMI_PATH", dir.join("fake-nvidia-smi"))
            .env("GPU_API_TOKEN", TOKEN);
        Anchor {
            served: Served::start(command, port).await,
        }
    }

    pub fn transcribe_url(&self, work_ms: u32, log_lines: u32) -> String {
        format!(
            "{}/transcribe?work_ms={work_ms}&log_lines={log_lines}",
            self.served.base
        )
    }

    pub fn stop(self) {
        self.served.stop()
    }
}

impl Server for Anchor {
    fn served(&self) -> &Served {
        &self.served
    }
    fn long_job_url(&self) -> String {
        self.transcribe_url(20_000, 0)
    }
}

pub struct Gpuhost {
    served: Served,
    _dir: tempfile::TempDir,
}

impl Gpuhost {
    pub async fn start() -> Gpuhost {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let argv = worker_argv();
        let worker = |name: &str, work_ms: u32, log_lines: u32| {
            format!(
                "[workers.{name}]\ncommand = {argv:?}\nstop_grace_s = 1\n[workers.{name}.options]\nwork_ms = {work_ms}\nlog_lines = {log_lines}\n"
            )
        };
        let config = format!(
            "listen = \"127.0.0.1:{port}\"\ntoken = {TOKEN:?}\n[pipeline]\nstages = [\"seed\", \"seedlog\", \"long\"]\n{}{}{}\n[gpu.status]\nnvidia_smi = {:?}\nbackend = \"nvidia-smi\"\n",
            worker("seed", 0, 0),
            worker("seedlog", 200, 20),
            worker("long", 20_000, 0),
            anchor_dir().join("fake-nvidia-smi").display().to_string(),
        );
        let path = dir.path().join("gpuhost.toml");
        std::fs::write(&path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_gpuhost"));
        command
            .args(["serve", "--config"])
            .arg(&path)
            .env("GPUHOST_LOG", "warn");
        let served = Served::start(command, port).await;
        let base = served.base.clone();
        // Wait until every worker is loaded.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let h: serde_json::Value = reqwest::get(format!("{base}/health"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if h["workers"]["ready"] == 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "gpuhost workers never became ready: {h}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Gpuhost { served, _dir: dir }
    }

    pub fn transcribe_url(&self, stage: &str) -> String {
        format!("{}/transcribe?stages={stage}", self.served.base)
    }

    pub fn stop(self) {
        self.served.stop()
    }
}

impl Server for Gpuhost {
    fn served(&self) -> &Served {
        &self.served
    }
    fn long_job_url(&self) -> String {
        self.transcribe_url("long")
    }
}
