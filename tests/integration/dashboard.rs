//! The dashboard page in headless Chromium (Debian's `chromium`): it shows what `/status` says,
//! with the token taken from the URL fragment.

use std::process::Command;

use super::gpu_status::FakeGpu;
use super::support::*;

fn chromium() -> String {
    let path =
        std::env::var("GPUHOST_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: apt-get install chromium (.ci/run does)"
    );
    path
}

/// Runs headless Chromium on `url`; `extra` selects --dump-dom or --screenshot.
fn headless(url: &str, extra: &[&str]) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,820",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap()
}

#[tokio::test]
async fn dashboard_shows_status_with_the_token() {
    let gpu = FakeGpu::new(
        "gpu: NVIDIA GeForce RTX 5090, 87, 27000, 32607, 71, 455.5\nproc: 4242, python3, 24000\nproc: 5151, python3, 2900\n",
    );
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
    gpu.process(
        5151,
        1,
        &[
            "/usr/bin/python3",
            "/opt/ComfyUI/main.py",
            "--listen",
            "0.0.0.0",
        ],
    );
    let config = format!(
        "token = \"dash-token\"\n[pipeline]\nstages = [\"asr\"]\n{}\n{}",
        fake_worker("asr", ""),
        gpu.config("[[gpu.watch]]\nname = \"vllm\"\npattern = \"vllm.entrypoints\"\n")
    );
    let host = TestHost::start(&config).await.ready().await;
    let url = format!("{}/#token=dash-token", host.url);
    let dump = tokio::task::spawn_blocking({
        let url = url.clone();
        move || headless(&url, &["--dump-dom"])
    })
    .await
    .unwrap();
    let dom = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dom.contains("vllm.entrypoints.openai.api_server --model google/gemma-3-27b-it"),
        "{dom}"
    );
    assert!(dom.contains("/opt/ComfyUI/main.py"), "{dom}");
    assert!(dom.contains("class=\"busy\""), "decision badge: {dom}");
    assert!(
        dom.contains("87%") && dom.contains("71 °C") && dom.contains("456 W"),
        "{dom}"
    );
    assert!(dom.contains("27000 / 32607 MiB"), "{dom}");
    assert!(
        dom.contains(">asr<") && dom.contains(">ready<"),
        "workers table: {dom}"
    );
    assert!(
        dom.contains("background: var(--orange)"),
        "83% VRAM is orange: {dom}"
    );

    // Without the token the page asks for one instead of showing data.
    let denied = tokio::task::spawn_blocking({
        let url = host.url.clone();
        move || headless(&format!("{url}/"), &["--dump-dom"])
    })
    .await
    .unwrap();
    let dom = String::from_utf8_lossy(&denied.stdout);
    assert!(
        dom.contains("id=\"auth\" style=\"display: block;\""),
        "{dom}"
    );
    assert!(!dom.contains("gemma-3-27b"), "{dom}");

    // A screenshot for the docs when asked (GPUHOST_SCREENSHOT=path).
    if let Ok(path) = std::env::var("GPUHOST_SCREENSHOT") {
        let shot =
            tokio::task::spawn_blocking(move || headless(&url, &[&format!("--screenshot={path}")]))
                .await
                .unwrap();
        assert!(
            shot.status.success(),
            "{}",
            String::from_utf8_lossy(&shot.stderr)
        );
    }
    host.stop().await;
}

#[tokio::test]
async fn dashboard_shows_services_holders_buttons_and_the_history_chart() {
    use super::arbiter::{arbiter_config, service};
    let gpu = FakeGpu::new("gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n");
    let config = arbiter_config(&gpu, &service(&gpu, "llm", "--load-s 0.2 --mib 9000", ""));
    let host = TestHost::start(&config).await.ready().await;
    let text = host
        .post("/services/llm/start")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"healthy\""), "{text}");
    let url = format!("{}/", host.url);
    let dump = tokio::task::spawn_blocking(move || headless(&url, &["--dump-dom"]))
        .await
        .unwrap();
    let dom = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dom.contains(">llm<") && dom.contains(">healthy<"),
        "services: {dom}"
    );
    assert!(
        dom.contains(">stop</button>"),
        "a stop button for the service: {dom}"
    );
    // The start made room: the idle resident was unloaded, so its button loads it.
    assert!(
        dom.contains(">unloaded<") && dom.contains(">load</button>"),
        "worker: {dom}"
    );
    assert!(
        dom.contains("<title>worker w (unload)"),
        "the unload in the chart: {dom}"
    );
    assert!(
        dom.contains(">service llm<") && dom.contains("holding"),
        "holders: {dom}"
    );
    assert!(
        dom.contains("<title>service llm (service)"),
        "a band in the chart: {dom}"
    );
    assert!(dom.contains("<path d=\"M "), "the memory area: {dom}");
    host.stop().await;
}

/// Runs the menu-bar plugin against `url` and returns its output.
fn menubar(url: &str, token: Option<&str>) -> String {
    let mut c = Command::new(python());
    c.arg(repo().join("deploy/menubar/gpuhost.5s.py"))
        .env("GPUHOST_URL", url)
        .env_remove("GPUHOST_TOKEN");
    if let Some(t) = token {
        c.env("GPUHOST_TOKEN", t);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn the_menu_bar_plugin_shows_decision_vram_queue_and_processes() {
    let gpu = FakeGpu::new(
        "gpu: NVIDIA GeForce RTX 5090, 87, 27000, 32607, 71, 455.5\nproc: 4242, python3, 24000\n",
    );
    gpu.process(
        4242,
        1,
        &["python3", "-m", "vllm.entrypoints.openai.api_server"],
    );
    let config = format!(
        "token = \"bar-token\"\n[pipeline]\nstages = [\"asr\"]\n{}\n{}",
        fake_worker("asr", ""),
        gpu.config("[[gpu.watch]]\nname = \"vllm\"\npattern = \"vllm.entrypoints\"\n")
    );
    let host = TestHost::start(&config).await.ready().await;
    wait_for("a sample", std::time::Duration::from_secs(10), || {
        let host = &host;
        async move {
            let s: serde_json::Value = host
                .get("/status")
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            s["gpu"]["memory_used_mib"] == 27000
        }
    })
    .await;
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || menubar(&url, Some("bar-token")))
        .await
        .unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "GPU BUSY 26.4/32 GiB | color=#f85149", "{out}");
    assert_eq!(lines[1], "---", "{out}");
    assert!(
        out.contains("NVIDIA GeForce RTX 5090: 27000/32607 MiB (82%), 87% util"),
        "{out}"
    );
    assert!(out.contains("queue: 0 running, 0 waiting"), "{out}");
    assert!(
        out.contains("24000 MiB  vllm (pid 4242) | font=Menlo size=11"),
        "{out}"
    );
    assert!(
        out.contains(&format!("Open dashboard | href={}/", host.url)),
        "{out}"
    );
    // Every menu line is either plain text or `text | key=value…` (xbar's format).
    for line in &lines {
        assert!(line.matches(" | ").count() <= 1, "{line}");
    }
    // Without the token: one line saying what to do, not a traceback.
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || menubar(&url, None))
        .await
        .unwrap();
    assert!(out.starts_with("GPU ? | color="), "{out}");
    assert!(out.contains("answered 401 (set GPUHOST_TOKEN"), "{out}");
    host.stop().await;
}
