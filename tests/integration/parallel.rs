//! Parallel stages: a `[pipeline] parallel` group of resident workers runs at the same time, sees
//! only the results before it, and a failure in it calls off its siblings.

use std::time::Duration;

use gpuhost::protocol::{ClientEvent, StageStatus};

use super::support::*;

fn position(events: &[ClientEvent], stage: &str, status: StageStatus) -> usize {
    events
        .iter()
        .position(|e| matches!(e, ClientEvent::Stage { stage: s, status: st, .. } if s == stage && *st == status))
        .unwrap_or_else(|| panic!("no {stage} {status:?} in {events:?}"))
}

#[tokio::test]
async fn a_parallel_group_runs_together_and_the_next_stage_sees_both() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\", \"c\"]\nparallel = [[\"a\", \"b\"]]\n{}{}{}",
        fake_worker("a", ""),
        fake_worker("b", ""),
        fake_worker("c", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host
        .transcribe("?prompt=fake:sleep=300", wav(0.2, 16000, 1))
        .await;
    let result = result_of(&events);
    // Both started before either finished.
    let a_done = position(&events, "a", StageStatus::Done);
    let b_done = position(&events, "b", StageStatus::Done);
    assert!(position(&events, "b", StageStatus::Started) < a_done);
    assert!(position(&events, "a", StageStatus::Started) < b_done);
    let stages = &result["stages"];
    assert_eq!(stages["a"]["earlier"], serde_json::json!([]));
    assert_eq!(
        stages["b"]["earlier"],
        serde_json::json!([]),
        "b does not wait for a"
    );
    assert_eq!(stages["c"]["earlier"], serde_json::json!(["a", "b"]));
    let stage_sum: f64 = ["a", "b", "c"]
        .iter()
        .map(|s| result["timings"][s].as_f64().unwrap())
        .sum();
    let wall = result["pipeline_seconds"].as_f64().unwrap();
    assert!(
        wall < stage_sum - 0.2,
        "overlapped: {wall} s wall, {stage_sum} s of stages"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_failing_stage_calls_off_its_parallel_sibling() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\nparallel = [[\"a\", \"b\"]]\n{}{}",
        fake_worker("a", "env = { FAKE_EXTRA = \"sleep=200+error\" }"),
        fake_worker(
            "b",
            "env = { FAKE_EXTRA = \"sleep=30000\", FAKE_CANCEL = \"handle\", FAKE_READY_META = '{\"protocol\":1,\"cancel\":true}' }"
        ),
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = tokio::time::timeout(
        Duration::from_secs(10),
        host.transcribe("", wav(0.2, 16000, 1)),
    )
    .await
    .expect("b was called off, not waited for");
    let (code, message) = error_of(&events);
    assert_eq!(
        code, "job_failed",
        "a's failure is reported, not b's cancel"
    );
    assert!(message.contains("stage `a`"), "{message}");
    assert!(
        events.iter().any(|e| matches!(e, ClientEvent::Stage { stage, status: StageStatus::CalledOff, .. } if stage == "b")),
        "b is reported as called off: {events:#?}"
    );
    // The failure is told at once; b's cancel is done a moment later.
    wait_for("b to give its task up", Duration::from_secs(10), || {
        let host = &host;
        async move { host.worker("b").await["tasks_cancelled"] == 1 }
    })
    .await;
    assert_eq!(host.worker("b").await["restarts"], 0);
    host.stop().await;
}

#[tokio::test]
async fn a_failure_beside_a_stage_that_cannot_cancel_is_told_at_once() {
    // b cannot cancel: it finishes its 8 s task. The client heard a's failure only then (with
    // task_timeout_s, up to an hour later), after b reported `done`.
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\nparallel = [[\"a\", \"b\"]]\n{}{}",
        fake_worker("a", "env = { FAKE_EXTRA = \"sleep=200+error\" }"),
        fake_worker(
            "b",
            "env = { FAKE_EXTRA = \"sleep=8000\", FAKE_CANCEL = \"handle\" }"
        ),
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = tokio::time::timeout(
        Duration::from_secs(5),
        host.transcribe("", wav(0.2, 16000, 1)),
    )
    .await
    .expect("a's failure was told before b's task ended");
    let (code, message) = error_of(&events);
    assert_eq!(code, "job_failed");
    assert!(message.contains("stage `a`"), "{message}");
    position(&events, "b", StageStatus::CalledOff);
    assert!(
        !events.iter().any(|e| matches!(e, ClientEvent::Stage { stage, status: StageStatus::Done, .. } if stage == "b")),
        "{events:#?}"
    );
    // The job keeps the GPU until b is through (its worker did the task: done there).
    wait_for("b's task to end", Duration::from_secs(20), || {
        let host = &host;
        async move { host.state.queue.running() == 0 && host.worker("b").await["state"] == "ready" }
    })
    .await;
    let b = host.worker("b").await;
    assert_eq!(
        (b["tasks_done"].as_u64(), b["restarts"].as_u64()),
        (Some(1), Some(0)),
        "{b}"
    );
    host.stop().await;
}

#[tokio::test]
async fn oneshot_workers_never_run_together() {
    // Oneshot exists to hold one model at a time: a parallel group of them runs in sequence.
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\nparallel = [[\"a\", \"b\"]]\n{}{}",
        fake_worker("a", "mode = \"oneshot\""),
        fake_worker("b", "mode = \"oneshot\"")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert!(
        position(&events, "a", StageStatus::Done) < position(&events, "b", StageStatus::Started)
    );
    assert_eq!(
        result_of(&events)["stages"]["b"]["earlier"],
        serde_json::json!(["a"])
    );
    host.stop().await;
}

#[tokio::test]
async fn a_stage_starts_once_what_it_needs_is_done() {
    // c needs only b: it runs beside a, which is still at work.
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\", \"c\"]\nparallel = [[\"a\", \"b\"]]\nneeds = {{ c = [\"b\"] }}\n{}{}{}",
        fake_worker("a", "env = { FAKE_EXTRA = \"sleep=1500\" }"),
        fake_worker("b", ""),
        fake_worker("c", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert!(
        position(&events, "c", StageStatus::Done) < position(&events, "a", StageStatus::Done),
        "c did not wait for a: {events:#?}"
    );
    let result = result_of(&events);
    assert_eq!(result["stages"]["c"]["earlier"], serde_json::json!(["b"]));
    assert_eq!(result["timings"].as_object().unwrap().len(), 3);
    host.stop().await;
}

#[tokio::test]
async fn a_failure_starts_nothing_that_needs_it() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\", \"c\"]\nparallel = [[\"a\", \"b\"]]\nneeds = {{ c = [\"b\"] }}\n{}{}{}",
        fake_worker("a", "env = { FAKE_EXTRA = \"sleep=1500\" }"),
        fake_worker("b", "env = { FAKE_EXTRA = \"error\" }"),
        fake_worker("c", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "job_failed");
    assert!(message.contains("stage `b`"), "{message}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ClientEvent::Stage { stage, .. } if stage == "c")),
        "c never started: {events:#?}"
    );
    assert_eq!(host.worker("c").await["tasks_done"], 0);
    host.stop().await;
}

#[tokio::test]
async fn a_request_naming_a_language_runs_the_asr_first_among_oneshot_stages() {
    // The ASR is the stage that may refuse a language (an English-only model): among stages
    // that run one at a time it goes first, so the refusal comes before the diarizer has spent
    // its time (a long recording's diarization, then "language `ko` is not supported").
    let config = format!(
        "[pipeline]\nstages = [\"diarizer\", \"asr\"]\nparallel = [[\"diarizer\", \"asr\"]]\n{}{}",
        fake_worker("diarizer", "mode = \"oneshot\""),
        fake_worker("asr", "mode = \"oneshot\"")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host
        .transcribe("?language=en&prompt=fake:error", wav(0.2, 16000, 1))
        .await;
    let (_, message) = error_of(&events);
    assert!(message.contains("stage `asr`"), "{message}");
    assert_eq!(host.worker("diarizer").await["tasks_done"], 0);
    assert_eq!(host.worker("diarizer").await["tasks_failed"], 0);
    // A one-shot ASR refuses a language itself (never loaded, it could not be asked before the
    // queue): the request's to change, a 400 as the host's own refusals are, not a failed job.
    let refused = host
        .post_body(
            "/transcribe?language=en&prompt=fake:refuse&format=json",
            wav(0.2, 16000, 1),
        )
        .await;
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "refused", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("English-only"),
        "{body}"
    );
    // Without a language the configured order stands.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert!(
        position(&events, "diarizer", StageStatus::Done)
            < position(&events, "asr", StageStatus::Started)
    );
    host.stop().await;
}
