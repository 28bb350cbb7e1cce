//! The original-protocol seed worker (`shared/bench/seed_anchor/worker.py`) runs unmodified.

use super::support::*;

fn config(mode: &str) -> String {
    format!(
        "[pipeline]\nstages = [\"seed\"]\n[workers.seed]\ncommand = [{:?}, {:?}]\nmode = {mode:?}\nstop_grace_s = 1\n[workers.seed.options]\nwork_ms = 30\nlog_lines = 3\n",
        python(),
        seed_worker().display().to_string()
    )
}

#[tokio::test]
async fn seed_worker_resident() {
    let host = TestHost::start(&config("resident")).await.ready().await;
    for _ in 0..3 {
        let events = host.transcribe("", wav(0.3, 16000, 1)).await;
        let result = result_of(&events);
        assert_eq!(
            result["stages"]["seed"]["segments"][0]["speaker"],
            "SPEAKER_00"
        );
        assert!(result["stages"]["seed"]["input"]
            .as_str()
            .unwrap()
            .ends_with("audio.wav"));
        let logs = events
            .iter()
            .filter(|e| matches!(e, gpuhost::protocol::ClientEvent::Log { line, .. } if line.starts_with("progress ")))
            .count();
        assert_eq!(
            logs, 3,
            "the seed worker's stderr lines stream to the client"
        );
    }
    assert_eq!(host.worker("seed").await["jobs_done"], 3);
    host.stop().await;
}

#[tokio::test]
async fn seed_worker_oneshot() {
    let host = TestHost::start(&config("oneshot")).await;
    for _ in 0..2 {
        let result = result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
        assert_eq!(result["stages"]["seed"]["segments"][0]["end"], 1.0);
    }
    let w = host.worker("seed").await;
    assert_eq!(
        (w["state"].as_str(), w["jobs_done"].as_u64()),
        (Some("idle"), Some(2))
    );
    host.stop().await;
}
