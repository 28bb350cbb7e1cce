//! A worker that speaks only the original protocol (`tests/fixtures/original_worker.py`: plain
//! `ready`/`done`, no SDK) runs unmodified, resident and oneshot.

use super::support::*;

fn config(mode: &str) -> String {
    format!(
        "[pipeline]\nstages = [\"original\"]\n[workers.original]\ncommand = [{:?}, {:?}]\nmode = {mode:?}\nstop_grace_s = 1\n[workers.original.options]\nwork_ms = 30\nlog_lines = 3\n",
        python(),
        original_worker().display().to_string()
    )
}

#[tokio::test]
async fn original_worker_resident() {
    let host = TestHost::start(&config("resident")).await.ready().await;
    for _ in 0..3 {
        let events = host.transcribe("", wav(0.3, 16000, 1)).await;
        let result = result_of(&events);
        assert_eq!(
            result["stages"]["original"]["segments"][0]["speaker"],
            "SPEAKER_00"
        );
        assert!(result["stages"]["original"]["input"]
            .as_str()
            .unwrap()
            .ends_with("audio.wav"));
        let logs = events
            .iter()
            .filter(|e| matches!(e, gpuhost::protocol::ClientEvent::Log { line, .. } if line.starts_with("progress ")))
            .count();
        assert_eq!(
            logs, 3,
            "the original worker's stderr lines stream to the client"
        );
    }
    assert_eq!(host.worker("original").await["tasks_done"], 3);
    host.stop().await;
}

#[tokio::test]
async fn original_worker_oneshot() {
    let host = TestHost::start(&config("oneshot")).await;
    for _ in 0..2 {
        let result = result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
        assert_eq!(result["stages"]["original"]["segments"][0]["end"], 1.0);
    }
    let w = host.worker("original").await;
    assert_eq!(
        (w["state"].as_str(), w["tasks_done"].as_u64()),
        (Some("idle"), Some(2))
    );
    host.stop().await;
}
