//! Cancelling: a client that goes away mid-stage frees the GPU as soon as its worker allows,
//! without costing a resident worker its loaded model.

use std::time::{Duration, Instant};

use gpuhost::protocol::ClientEvent;

use super::support::*;

/// A worker that says it can cancel, with `FAKE_CANCEL` set to `mode`.
fn cancelling_worker(name: &str, mode: &str, extra: &str) -> String {
    fake_worker(
        name,
        &format!(
            "env = {{ FAKE_CANCEL = \"{mode}\", FAKE_READY_META = '{{\"protocol\":1,\"cancel\":true}}' }}\n{extra}"
        ),
    )
}

#[tokio::test]
async fn a_worker_that_can_cancel_gives_up_the_job_and_stays_loaded() {
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        cancelling_worker("w", "handle", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    let pid = host.worker("w").await["pid"].clone();
    assert_eq!(host.worker("w").await["loaded"]["cancel"], true);
    let left = Instant::now();
    abandon_job(&host, 30_000).await;
    wait_for("the GPU to be free again", Duration::from_secs(5), || {
        let queue = host.state.queue.clone();
        async move { queue.running() == 0 }
    })
    .await;
    assert!(
        left.elapsed() < Duration::from_secs(5),
        "the abandoned 30 s job was cut short"
    );
    let w = host.worker("w").await;
    assert_eq!(w["pid"], pid, "no restart: the model stayed loaded");
    assert_eq!(w["state"], "ready");
    assert_eq!(w["tasks_cancelled"], 1);
    assert_eq!(w["tasks_failed"], 0, "a cancelled job is not a failure");
    assert_eq!(w["restarts"], 0);

    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert_eq!(result_of(&events)["stages"]["w"]["seq"], 2);
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("gpuhost_jobs_total{outcome=\"cancelled\"} 1"),
        "{metrics}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_cancel_that_lands_before_the_worker_took_the_job_up_still_counts() {
    // The SIGINT arrives while the worker has not armed its handler for this job yet; the
    // marker file the host wrote first makes the worker give the job up when it starts it.
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        cancelling_worker("w", "handle", "")
    )
    .replace(
        "FAKE_CANCEL = ",
        "FAKE_START_DELAY_MS = \"1000\", FAKE_CANCEL = ",
    );
    let host = TestHost::start(&config).await.ready().await;
    let pid = host.worker("w").await["pid"].clone();
    abandon_job(&host, 30_000).await;
    wait_for("the GPU to be free again", Duration::from_secs(6), || {
        let queue = host.state.queue.clone();
        async move { queue.running() == 0 }
    })
    .await;
    let w = host.worker("w").await;
    assert_eq!(w["tasks_cancelled"], 1);
    assert_eq!(w["pid"], pid, "given up, not killed");
    host.stop().await;
}

#[tokio::test]
async fn a_worker_that_ignores_the_interrupt_is_killed_after_the_grace() {
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        cancelling_worker("w", "ignore", "cancel_grace_s = 0.5")
    );
    let host = TestHost::start(&config).await.ready().await;
    let pid = host.worker("w").await["pid"].as_u64().unwrap() as u32;
    abandon_job(&host, 30_000).await;
    wait_for(
        "the stubborn worker to be killed",
        Duration::from_secs(5),
        || async move { !pid_alive(pid) },
    )
    .await;
    // The next job gets a fresh worker.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    let result = result_of(&events);
    assert_eq!(result["stages"]["w"]["seq"], 1, "a new process");
    assert_ne!(result["stages"]["w"]["pid"].as_u64().unwrap() as u32, pid);
    let w = host.worker("w").await;
    assert_eq!(w["tasks_cancelled"], 1);
    assert!(
        w["last_error"]
            .as_str()
            .unwrap()
            .contains("did not stop in time"),
        "{w}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_worker_without_cancel_finishes_the_job_nobody_waits_for() {
    // Original-protocol workers are never interrupted: interrupting them would kill the model.
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "env = { FAKE_CANCEL = \"handle\" }")
    );
    let host = TestHost::start(&config).await.ready().await;
    abandon_job(&host, 600).await;
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert_eq!(result_of(&events)["stages"]["w"]["seq"], 2);
    let w = host.worker("w").await;
    assert_eq!(w["tasks_done"], 2, "the abandoned job ran to its end");
    assert_eq!(w["tasks_cancelled"], 0);
    host.stop().await;
}

#[tokio::test]
async fn a_task_whose_client_left_before_it_was_sent_is_never_run() {
    // Two jobs share the GPU; the second one's task waits behind the first's in the worker.
    // Its client leaves meanwhile: a worker that cannot cancel ran it in full, for nobody.
    let config = format!(
        "[gpu]\nmax_concurrent_jobs = 2\n[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "env = { FAKE_CANCEL = \"handle\" }")
    );
    let host = TestHost::start(&config).await.ready().await;
    let mut first = EventReader::new(
        host.post_body("/transcribe?prompt=fake:sleep=5000", wav(0.2, 16000, 1))
            .await,
    );
    first.until(started).await;
    let mut second = EventReader::new(
        host.post_body("/transcribe?prompt=fake:sleep=5000", wav(0.2, 16000, 1))
            .await,
    );
    second.next().await.expect("an event");
    drop(second);
    let last = first.until(|e| e.is_final()).await;
    assert!(matches!(last, ClientEvent::Result { .. }), "{last:?}");
    wait_for(
        "the second task to be answered",
        Duration::from_secs(10),
        || {
            let host = &host;
            async move { host.worker("w").await["tasks_cancelled"] == 1 }
        },
    )
    .await;
    let w = host.worker("w").await;
    assert_eq!(w["tasks_done"], 1, "{w}");
    assert_eq!(w["state"], "ready", "{w}");
    // The next job runs as usual.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    assert_eq!(result_of(&events)["stages"]["w"]["seq"], 2);
    host.stop().await;
}

#[tokio::test]
async fn a_oneshot_worker_loaded_for_a_job_called_off_meanwhile_ends_unused() {
    // The client leaves while the one-shot worker loads for its task: the process must not
    // stay up (it held the GPU with no permit, beside the next job's other model).
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker(
            "w",
            "mode = \"oneshot\"\nenv = { FAKE_LOAD_MS = \"1500\", FAKE_CANCEL = \"handle\" }"
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    let mut gone = EventReader::new(host.post_body("/transcribe", wav(0.2, 16000, 1)).await);
    gone.until(started).await;
    wait_for("the worker to load", Duration::from_secs(10), || {
        let host = &host;
        async move { host.worker("w").await["state"] == "starting" }
    })
    .await;
    drop(gone);
    wait_for("the process to end unused", Duration::from_secs(10), || {
        let host = &host;
        async move {
            let w = host.worker("w").await;
            w["state"] == "idle" && w["pid"].is_null() && w["tasks_cancelled"] == 1
        }
    })
    .await;
    assert_eq!(host.worker("w").await["tasks_done"], 0);
    assert_eq!(host.state.queue.running(), 0);
    result_of(&host.transcribe("", wav(0.2, 16000, 1)).await);
    host.stop().await;
}

#[tokio::test]
async fn a_job_that_fails_after_its_client_left_counts_as_failed() {
    // The worker cannot cancel; it crashes after the client has gone. A crash, not the
    // client's going away (it was counted as cancelled).
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "env = { FAKE_CANCEL = \"handle\" }")
    );
    let host = TestHost::start(&config).await.ready().await;
    let mut gone = EventReader::new(
        host.post_body(
            "/transcribe?prompt=fake:sleep=800+crash",
            wav(0.2, 16000, 1),
        )
        .await,
    );
    gone.until(started).await;
    drop(gone);
    wait_for("the crash to be counted", Duration::from_secs(10), || {
        let host = &host;
        async move {
            host.metrics()
                .await
                .contains("gpuhost_jobs_total{outcome=\"error\"} 1")
        }
    })
    .await;
    assert!(!host
        .metrics()
        .await
        .contains("gpuhost_jobs_total{outcome=\"cancelled\"} 1"));
    host.stop().await;
}

#[tokio::test]
async fn a_cancelled_stage_skips_the_rest_of_the_pipeline() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        cancelling_worker("a", "handle", ""),
        fake_worker("b", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    abandon_job(&host, 30_000).await;
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    let result = result_of(&events);
    assert_eq!(result["stages"]["a"]["seq"], 2);
    assert_eq!(
        result["stages"]["b"]["seq"], 1,
        "b never ran for the abandoned job"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e, ClientEvent::Error { .. })));
    host.stop().await;
}
