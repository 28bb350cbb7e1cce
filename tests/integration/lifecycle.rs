//! The real `gpuhost serve` process: SIGTERM stops every worker; SIGKILL takes them along within 2 s.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::support::*;

struct Served {
    child: Child,
    url: String,
    pid_dir: tempfile::TempDir,
    _config_dir: tempfile::TempDir,
}

/// Starts the binary with two resident fake workers and one oneshot; waits until both are ready.
async fn serve() -> Served {
    let pid_dir = tempfile::tempdir().unwrap();
    let config_dir = tempfile::tempdir().unwrap();
    let env = format!(
        "env = {{ FAKE_PID_DIR = {:?} }}",
        pid_dir.path().display().to_string()
    );
    let toml = format!(
        "listen = \"127.0.0.1:0\"\n[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", &env),
        fake_worker("b", &env),
    );
    let config = config_dir.path().join("gpuhost.toml");
    std::fs::write(&config, toml).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuhost"))
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("gpuhost listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the server announces its address");
    let served = Served {
        child,
        url,
        pid_dir,
        _config_dir: config_dir,
    };
    let health = format!("{}/health", served.url);
    wait_for("both workers ready", Duration::from_secs(20), || {
        let health = health.clone();
        async move {
            match reqwest::get(&health).await {
                Ok(r) => r
                    .json::<serde_json::Value>()
                    .await
                    .map(|h| h["workers"]["ready"] == 2)
                    .unwrap_or(false),
                Err(_) => false,
            }
        }
    })
    .await;
    served
}

/// Waits until one worker of the served binary is busy with a job.
async fn wait_busy(url: &str) {
    let workers = format!("{url}/workers");
    wait_for("a worker to be busy", Duration::from_secs(20), || {
        let workers = workers.clone();
        async move {
            let Ok(r) = reqwest::get(&workers).await else {
                return false;
            };
            let w: serde_json::Value = r.json().await.unwrap_or_default();
            w["workers"]
                .as_array()
                .is_some_and(|ws| ws.iter().any(|w| w["state"] == "busy"))
        }
    })
    .await;
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

#[tokio::test]
async fn sigterm_stops_every_worker_and_ends_running_jobs() {
    let mut served = serve().await;
    let pids = read_pids(served.pid_dir.path());
    assert_eq!(pids.len(), 2, "{pids:?}");
    // A job in flight when SIGTERM arrives ends with an error event, not a hang.
    let url = format!("{}/transcribe?language=fake:sleep=30000", served.url);
    let job = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .body(wav(0.2, 16000, 1))
            .send()
            .await
            .unwrap();
        read_events(response).await
    });
    wait_busy(&served.url).await;
    signal(served.child.id(), libc::SIGTERM);
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || served.child.wait().map(|s| (s, served)))
        .await
        .unwrap()
        .unwrap();
    let (status, served) = status;
    assert!(status.success(), "clean exit: {status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    for pid in read_pids(served.pid_dir.path()) {
        assert!(!pid_alive(pid), "worker {pid} survived SIGTERM of the host");
    }
    let events = job.await.unwrap();
    let (code, _) = error_of(&events);
    assert_eq!(code, "shutting_down");
}

#[tokio::test]
async fn sigkill_of_the_host_takes_workers_within_two_seconds() {
    let mut served = serve().await;
    let pids = read_pids(served.pid_dir.path());
    assert_eq!(pids.len(), 2);
    // One worker is busy when the host dies.
    let url = format!("{}/transcribe?language=fake:sleep=30000", served.url);
    tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(url)
            .body(wav(0.2, 16000, 1))
            .send()
            .await;
    });
    wait_busy(&served.url).await;
    signal(served.child.id(), libc::SIGKILL);
    served.child.wait().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(2);
    while pids.iter().any(|&p| pid_alive(p)) {
        assert!(
            Instant::now() < deadline,
            "workers {pids:?} outlived the SIGKILLed host by 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
