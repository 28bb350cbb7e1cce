//! `POST /workers/{name}/unload`: it stops a worker that hangs while loading at once, every
//! caller hears the same answer, and a one-shot worker stays idle.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::*;

fn one_stage(extra: &str) -> String {
    format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", extra))
}

async fn unload(host: &TestHost) -> Value {
    let response = host.post("/workers/w/unload").send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test]
async fn a_worker_that_hangs_while_loading_is_unloaded_at_once() {
    let host = TestHost::start(&one_stage(
        "load_timeout_s = 60\nenv = { FAKE_NO_READY = \"1\" }",
    ))
    .await;
    // Its pid is known while it loads (for /status to name its GPU process).
    wait_for(
        "the worker to be loading",
        Duration::from_secs(10),
        || async {
            let w = host.worker("w").await;
            w["state"] == "starting" && w["pid"].is_u64()
        },
    )
    .await;
    let pid = host.worker("w").await["pid"].as_u64();
    let asked = Instant::now();
    let answer = unload(&host).await;
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "it waited for the load: {:?}",
        asked.elapsed()
    );
    assert_eq!(answer["state"], "unloaded", "{answer}");
    assert_eq!(answer["stopped_pid"].as_u64(), pid, "{answer}");
    until_dead(pid.unwrap() as u32, "the loading worker").await;
    host.stop().await;
}

#[tokio::test]
async fn two_unloads_during_a_task_both_hear_what_was_stopped() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let pid = host.worker("w").await["pid"].as_u64();
    let job = {
        let host_url = host.url.clone();
        let client = host.client();
        tokio::spawn(async move {
            client
                .post(format!("{host_url}/transcribe?prompt=fake:sleep=1500"))
                .body(wav(0.5, 16000, 1))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    wait_for("the task to run", Duration::from_secs(10), || async {
        host.worker("w").await["state"] == "busy"
    })
    .await;
    let (first, second) = tokio::join!(unload(&host), unload(&host));
    for answer in [&first, &second] {
        assert_eq!(answer["state"], "unloaded", "{answer}");
        assert_eq!(answer["stopped_pid"].as_u64(), pid, "{answer}");
    }
    assert!(job.await.unwrap().contains("\"result\""));
    host.stop().await;
}

#[tokio::test]
async fn a_one_shot_worker_unloaded_stays_idle() {
    let host = TestHost::start(&one_stage("mode = \"oneshot\"")).await;
    let _ = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    let answer = unload(&host).await;
    assert_eq!(answer["state"], "idle", "{answer}");
    assert_eq!(host.worker("w").await["state"], "idle");
    host.stop().await;
}

#[tokio::test]
async fn two_unloads_of_an_idle_worker_both_hear_what_was_stopped() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let pid = host.worker("w").await["pid"].as_u64();
    let (first, second) = tokio::join!(unload(&host), unload(&host));
    for answer in [&first, &second] {
        assert_eq!(answer["state"], "unloaded", "{answer}");
        assert_eq!(answer["stopped_pid"].as_u64(), pid, "{answer}");
    }
    host.stop().await;
}

#[tokio::test]
async fn a_worker_that_once_crashed_and_recovered_is_unloaded_not_failed() {
    let host = TestHost::start(&one_stage("env = { FAKE_LOAD_MS = \"1500\" }"))
        .await
        .ready()
        .await;
    let (code, _) = error_of(
        &host
            .transcribe("?prompt=fake:crash", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "worker_crashed");
    let _ = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    unload(&host).await;
    assert_eq!(
        host.post("/workers/w/load").send().await.unwrap().status(),
        200
    );
    wait_for(
        "the worker to be loading",
        Duration::from_secs(10),
        || async { host.worker("w").await["state"] == "starting" },
    )
    .await;
    // Stopped while it loads again, it is an unloaded worker, not a failing one.
    let answer = unload(&host).await;
    assert_eq!(answer["state"], "unloaded", "{answer}");
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 200, "{:?}", ready.text().await);
    host.stop().await;
}
