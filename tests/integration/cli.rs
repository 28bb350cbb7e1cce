//! The command line: `gpuhost run`, and `gpuhost transcribe` both locally and through a server.

use std::process::Command;

use super::support::*;

fn write_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let toml = format!(
        "listen = \"127.0.0.1:0\"\n{extra}\n[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", ""),
        fake_worker("b", "")
    );
    let path = dir.join("gpuhost.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn gpuhost() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuhost"))
}

#[test]
fn run_one_job_on_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let job = dir.path().join("job.json");
    std::fs::write(
        &job,
        r#"{"audio_path": "/x.wav", "language": "fake:logs=2"}"#,
    )
    .unwrap();
    let out = gpuhost()
        .args(["run", "b", "--config"])
        .arg(&config)
        .arg("--job")
        .arg(&job)
        .output()
        .unwrap();
    let result = json_stdout(&out);
    assert_eq!(result["worker"], "b");
    assert_eq!(result["audio_path"], "/x.wav");
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"fraction\":1.0"));

    let bad = gpuhost()
        .args(["run", "nope", "--config"])
        .arg(&config)
        .arg("--job")
        .arg(&job)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no worker `nope`"));
}

#[test]
fn transcribe_locally_runs_every_stage_oneshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let out = gpuhost()
        .args(["transcribe", "--config"])
        .arg(&config)
        .arg(fixture("audio/tone.flac"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stages"]["b"]["earlier"], serde_json::json!(["a"]));
    assert!(stderr.contains("✓ a") && stderr.contains("✓ b"), "{stderr}");
}

#[tokio::test]
async fn transcribe_through_a_server() {
    let host = TestHost::start(&format!(
        "token = \"tok\"\n[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", ""),
        fake_worker("b", "")
    ))
    .await
    .ready()
    .await;
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args([
                "transcribe",
                "--server",
                &url,
                "--token",
                "tok",
                "--stages",
                "b",
                "--format",
                "json",
            ])
            .arg(fixture("audio/tone.mp3"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let result = json_stdout(&out);
    assert!(result["stages"].get("a").is_none());
    assert_eq!(result["stages"]["b"]["worker"], "b");

    let url = host.url.clone();
    let denied = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args(["transcribe", "--server", &url])
            .env_remove("GPUHOST_TOKEN")
            .arg(fixture("audio/tone.mp3"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"));
    host.stop().await;
}

/// The JSON a successful command printed on stdout.
fn json_stdout(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
