//! Race benchmark: N clients at once try to start the same GPU service, round after round.
//!
//! - gpuhost: every client calls `POST /services/llm/start` (single flight through the queue).
//! - the original pattern: every client reads `GET /status` and, when `is_idle`, starts the
//!   service itself (the homelab's double-start → OOM failure).
//!
//! Both run against the same fake GPU (the tests' fake `nvidia-smi`, which lists the fake
//! service's process — 200 MiB while loading, like vLLM — only while it lives). Prints double
//! starts per 1000 rounds (gpuhost must be 0) and the median / p90 time from request to healthy.
//! `RACE_ROUNDS` sets the rounds per N (default 1000; the docs say which count a run used).
#![allow(clippy::unwrap_used, unreachable_pub)] // test and bench code: a panic is the failure report
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)] // the original pattern starts the service itself

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> String {
    std::env::var("GPUHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn starts(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn service_argv(port: u16, dir: &Path) -> Vec<String> {
    vec![
        python(),
        repo()
            .join("tests/fixtures/fake_service.py")
            .display()
            .to_string(),
        port.to_string(),
        dir.display().to_string(),
        "--load-s".into(),
        "0.2".into(),
        "--mib".into(),
        "20000".into(),
    ]
}

struct Fake {
    dir: tempfile::TempDir,
    port: u16,
}

impl Fake {
    fn new() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let exe = std::process::Command::new(python())
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| python());
        let smi = format!(
            "#!/bin/sh\nexport FAKE_GPU_STATE={d}/state\nexport FAKE_GPU_PROCS_DIR={d}/procs\nexec {exe} -S {} \"$@\"\n",
            repo().join("tests/fixtures/fake_nvidia_smi.py").display()
        );
        std::fs::write(dir.path().join("nvidia-smi"), smi).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            dir.path().join("nvidia-smi"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("state"),
            "gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        Fake {
            dir,
            port: free_port(),
        }
    }

    fn config(&self) -> String {
        let d = self.dir.path();
        format!(
            "state_dir = {state:?}\n[pipeline]\nstages = [\"w\"]\n[workers.w]\ncommand = [{py:?}, {fw:?}, \"w\"]\n\
             [gpu.status]\nbackend = \"nvidia-smi\"\nnvidia_smi = {smi:?}\nproc_root = {proc:?}\ninterval_s = 0.05\nstale_after_s = 5\ntimeout_s = 2\nquiet_period_s = 0\n\
             [arbiter]\nteardown_timeout_s = 10\n\
             [[services]]\nname = \"llm\"\ncommand = {argv:?}\nhealth_url = \"http://127.0.0.1:{port}/health\"\npoll_interval_s = 0.05\nstop_grace_s = 2\n",
            state = d.join("gpuhost-state").display().to_string(),
            py = python(),
            fw = repo().join("tests/fixtures/fake_worker.py").display().to_string(),
            smi = d.join("nvidia-smi").display().to_string(),
            proc = d.join("proc").display().to_string(),
            argv = service_argv(self.port, d),
            port = self.port,
        )
    }
}

async fn is_healthy(client: &reqwest::Client, url: &str) -> bool {
    client
        .get(url)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

async fn healthy(client: &reqwest::Client, url: &str) {
    while !is_healthy(client, url).await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn status(client: &reqwest::Client, base: &str) -> Value {
    client
        .get(format!("{base}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Waits until the sample shows no process on the GPU (the previous round is gone).
async fn until_idle(client: &reqwest::Client, base: &str) {
    loop {
        let s = status(client, base).await;
        if s["processes"].as_array().is_some_and(|p| p.is_empty())
            && s["holders"].as_array().is_some_and(|h| h.is_empty())
            && s["is_idle"] == true
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One round through gpuhost: N starts, then a stop. Returns each client's time to healthy, or
/// the answer of a start that did not end `healthy`.
async fn gpuhost_round(client: &reqwest::Client, base: &str, n: usize) -> Vec<Result<f64, String>> {
    let calls = (0..n).map(|_| async {
        let started = Instant::now();
        let text = client
            .post(format!("{base}/services/llm/start"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("\"healthy\"") {
            Ok(started.elapsed().as_secs_f64())
        } else {
            Err(text)
        }
    });
    let times = futures_util::future::join_all(calls).await;
    client
        .post(format!("{base}/services/llm/stop"))
        .send()
        .await
        .unwrap();
    times
}

/// One round of the original pattern: each client checks `is_idle` and starts the service itself.
async fn original_round(client: &reqwest::Client, base: &str, fake: &Fake, n: usize) -> Vec<f64> {
    let health = format!("http://127.0.0.1:{}/health", fake.port);
    let children = std::sync::Mutex::new(Vec::new());
    let calls = (0..n).map(|_| async {
        let started = Instant::now();
        // The check-then-act loop of the original clients: healthy → done; idle → start it.
        loop {
            if is_healthy(client, &health).await {
                break;
            }
            if status(client, base).await["is_idle"] == true {
                let argv = service_argv(fake.port, fake.dir.path());
                let child = std::process::Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                children.lock().unwrap().push(child);
                healthy(client, &health).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        started.elapsed().as_secs_f64()
    });
    let times = futures_util::future::join_all(calls).await;
    for mut child in children.into_inner().unwrap() {
        let _ = child.kill();
        let _ = child.wait();
        // SIGKILL skips the fake's own cleanup: drop its line from the fake GPU, or a later
        // process given the same pid (pids wrap fast here) would show up as holding memory.
        let line = fake.dir.path().join("procs").join(child.id().to_string());
        let _ = std::fs::remove_file(line.with_extension("tmp"));
        let _ = std::fs::remove_file(line);
    }
    times
}

fn median_p90(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.9))
}

fn main() {
    let rounds: usize = std::env::var("RACE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(1000);
    if std::env::var("RACE_LOG").is_ok() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .init();
    }
    // RACE_ONLY=gpuhost|original runs one pattern; RACE_N=8 one client count.
    let only = std::env::var("RACE_ONLY").unwrap_or_default();
    let ns: Vec<usize> = std::env::var("RACE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .map_or(vec![2, 8, 32], |n| vec![n]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let fake = Fake::new();
        let config = gpuhost::Config::from_toml(&fake.config(), fake.dir.path().to_path_buf()).unwrap();
        let mut config = config;
        config.listen = "127.0.0.1:0".parse().unwrap();
        let server = gpuhost::bind(config).await.unwrap();
        let base = format!("http://{}", server.local_addr());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();
        eprintln!("gpuhost under test: {base}");
        println!("# Race: N clients start one GPU service at once, {rounds} rounds per N (same fake GPU)\n");
        println!("| N | pattern | double starts / 1000 rounds | failed starts | to healthy p50 | p90 |");
        println!("|---|---|---|---|---|---|");
        for &n in &ns {
            for pattern in ["original (is_idle, then start)", "gpuhost (POST /services/llm/start)"] {
                if !only.is_empty() && !pattern.starts_with(only.as_str()) {
                    continue;
                }
                let before = starts(fake.dir.path());
                let mut times = Vec::new();
                let mut failed = 0;
                for _ in 0..rounds {
                    until_idle(&client, &base).await;
                    let round_start = starts(fake.dir.path());
                    if pattern.starts_with("gpuhost") {
                        for outcome in gpuhost_round(&client, &base, n).await {
                            match outcome {
                                Ok(t) => times.push(t),
                                Err(answer) => {
                                    failed += 1;
                                    eprintln!("a start did not end healthy:\n{answer}");
                                }
                            }
                        }
                    } else {
                        times.extend(original_round(&client, &base, &fake, n).await);
                    }
                    assert!(starts(fake.dir.path()) > round_start, "someone started it");
                }
                let extra = starts(fake.dir.path()) - before - rounds;
                let (p50, p90) = median_p90(times);
                // The original pattern has no answer that could say a start failed: each client
                // waits for the health URL whoever started it.
                let failed = if pattern.starts_with("gpuhost") {
                    failed.to_string()
                } else {
                    "—".to_string()
                };
                println!(
                    "| {n} | {pattern} | {:.0} | {failed} | {:.0} ms | {:.0} ms |",
                    extra as f64 * 1000.0 / rounds as f64,
                    p50 * 1000.0,
                    p90 * 1000.0
                );
            }
        }
        let _ = stop.send(());
        let _ = task.await;
    });
}
