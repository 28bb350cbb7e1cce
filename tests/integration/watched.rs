//! Grants that hang on what the GPU sample shows: a program gpuhost did not start
//! (`[[gpu.watch]]`) that loads holds every grant on its GPU until it answers its health URL, or
//! until its `load_timeout_s`; a sample that failed unloads nothing for a grant.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gpuhost::protocol::{ClientEvent, GrantEvent};
use serde_json::json;

use super::arbiter::{arbiter_config, assert_granted, grant_events};
use super::gpu_status::{health_server, wait_decision, wait_status, FakeGpu};
use super::support::*;

const IDLE: &str = "gpu: NVIDIA GeForce RTX 5090, 0, 512, 32607, 41, 28.5\n";

/// A watched vLLM whose health URL answers once `ready` is set, beside a server whose one stage
/// is worker `w` (`worker` its extra config).
async fn watched_vllm_with(
    load_timeout_s: f64,
    worker: &str,
) -> (FakeGpu, TestHost, Arc<AtomicBool>) {
    let gpu = FakeGpu::new(IDLE);
    let ready = Arc::new(AtomicBool::new(false));
    let health = health_server(ready.clone()).await;
    let watch = format!(
        "[[gpu.watch]]\nname = \"vllm\"\npattern = \"vllm.entrypoints\"\nhealth_url = {health:?}\nload_timeout_s = {load_timeout_s}\n"
    );
    let config = format!(
        "[pipeline]\nstages = [\"w\"]\n{}\n{}",
        fake_worker("w", worker),
        gpu.config(&watch)
    );
    let host = TestHost::start(&config).await.ready().await;
    (gpu, host, ready)
}

async fn watched_vllm(load_timeout_s: f64) -> (FakeGpu, TestHost, Arc<AtomicBool>) {
    watched_vllm_with(load_timeout_s, "").await
}

/// vLLM starts outside gpuhost: its process runs with 200 MiB (the rest still to come), and
/// `/status` reads `loading`.
async fn vllm_starts_loading(gpu: &FakeGpu, host: &TestHost) {
    gpu.process(
        4242,
        1,
        &["python3", "-m", "vllm.entrypoints.openai.api_server"],
    );
    gpu.set_state(&format!("{IDLE}proc: 4242, python3, 200\n"));
    wait_decision(host, "loading").await;
}

/// The next event of a grant stream.
async fn next_event(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> GrantEvent {
    let chunk = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("an event within 30 s")
        .unwrap()
        .unwrap();
    let line = String::from_utf8_lossy(&chunk);
    serde_json::from_str(line.lines().next().unwrap()).expect(&line)
}

#[tokio::test]
async fn a_loading_watched_program_holds_grants_until_it_answers() {
    let (gpu, host, ready) = watched_vllm(600.0).await;
    vllm_starts_loading(&gpu, &host).await;
    // A speech job whose worker is loaded takes no memory beyond it: not held.
    let events = tokio::time::timeout(
        Duration::from_secs(30),
        host.transcribe("", wav(1.0, 16000, 1)),
    )
    .await
    .expect("a job of loaded workers held while vllm loads");
    result_of(&events);
    // A lease that the memory shown free would take was granted at once.
    let response = host
        .post("/gpu/lease")
        .json(&json!({"holder": "bob", "vram_mib": 16_000, "wait": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    match next_event(&mut stream).await {
        GrantEvent::Queued {
            waiting_for: Some(why),
            ..
        } => assert!(why.contains("vllm loads"), "{why}"),
        other => panic!("not held while vllm loads: {other:?}"),
    }
    // Without waiting: refused, saying why.
    let now = host
        .post("/gpu/lease")
        .json(&json!({"holder": "carol", "vram_mib": 1_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(now.status(), 409);
    // It answers: its memory is taken, and the lease is granted.
    gpu.set_state(&format!("{IDLE}proc: 4242, python3, 9000\n"));
    ready.store(true, Ordering::SeqCst);
    loop {
        match next_event(&mut stream).await {
            GrantEvent::Granted { .. } => break,
            GrantEvent::Queued { .. } | GrantEvent::MakingRoom { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    drop(stream);
    host.stop().await;
}

#[tokio::test]
async fn a_program_loading_past_its_load_timeout_holds_nothing_more() {
    let (gpu, host, _ready) = watched_vllm(1.0).await;
    vllm_starts_loading(&gpu, &host).await;
    // It never answers: held at first, then after its second of loading grants go on by
    // memory.
    let events = grant_events(
        host.post("/gpu/lease")
            .json(&json!({"holder": "bob", "vram_mib": 1_000, "wait": true}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        events.iter().any(
            |e| matches!(e, GrantEvent::Queued { waiting_for: Some(why), .. }
            if why.contains("vllm loads"))
        ),
        "never held: {events:?}"
    );
    assert_granted(&events);
    host.stop().await;
}

#[tokio::test]
async fn a_failed_sample_unloads_nothing_for_a_grant() {
    let gpu = FakeGpu::new(IDLE);
    let host = TestHost::start(&arbiter_config(&gpu, ""))
        .await
        .ready()
        .await;
    gpu.set_flag("fail", true);
    wait_decision(&host, "unknown").await;
    // It unloaded the worker, waited out the teardown deadline and then said the worker's
    // memory did not come back.
    let refused = host
        .post("/gpu/lease")
        .json(&json!({"holder": "bob", "vram_mib": 1_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let body: serde_json::Value = refused.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("status is unknown"), "{body}");
    assert_eq!(host.worker("w").await["state"], "ready");
    host.stop().await;
}

#[tokio::test]
async fn a_server_that_answered_and_stops_answering_holds_nothing() {
    let (gpu, host, ready) = watched_vllm(600.0).await;
    gpu.process(
        4242,
        1,
        &["python3", "-m", "vllm.entrypoints.openai.api_server"],
    );
    gpu.set_state(&format!("{IDLE}proc: 4242, python3, 9000\n"));
    ready.store(true, Ordering::SeqCst);
    // Serving for a few samples, as a server does (each one taken after the one before).
    let first = wait_decision(&host, "busy").await["sampled_at"]
        .as_f64()
        .unwrap();
    wait_status(&host, "three samples of it serving", |s| {
        s["decision"] == "busy" && s["sampled_at"].as_f64().unwrap() > first + 0.25
    })
    .await;
    // Its engine died, the process lives on and the health URL fails: its memory is taken,
    // nothing loads, and a lease that fits is granted (it was held for the 600 s).
    ready.store(false, Ordering::SeqCst);
    wait_decision(&host, "loading").await;
    let granted = host
        .post("/gpu/lease")
        .json(&json!({"holder": "bob", "vram_mib": 1_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), 200, "{:?}", granted.text().await);
    host.stop().await;
}

/// A server whose one stage is a one-shot worker, beside a watched vLLM that has begun to load.
async fn oneshot_beside_a_loading_vllm(
    load_timeout_s: f64,
) -> (FakeGpu, TestHost, Arc<AtomicBool>) {
    let (gpu, host, ready) =
        watched_vllm_with(load_timeout_s, "mode = \"oneshot\"\nvram_mib = 2000").await;
    vllm_starts_loading(&gpu, &host).await;
    (gpu, host, ready)
}

#[tokio::test]
async fn a_job_whose_stage_loads_a_model_waits_for_a_loading_program() {
    // A one-shot stage loads its model for the job: beside a vLLM that is still taking its
    // memory, that is the double load this arbiter exists to prevent.
    let (gpu, host, ready) = oneshot_beside_a_loading_vllm(600.0).await;
    let response = host.post_body("/transcribe", wav(1.0, 16000, 1)).await;
    assert_eq!(response.status(), 200);
    let job = tokio::spawn(read_events(response));
    wait_status(&host, "the job to wait", |s| s["queue"]["waiting"] == 1).await;
    // vLLM answers: the job goes on.
    gpu.set_state(&format!("{IDLE}proc: 4242, python3, 9000\n"));
    ready.store(true, Ordering::SeqCst);
    let events = tokio::time::timeout(Duration::from_secs(30), job)
        .await
        .expect("the job granted once vllm answered")
        .unwrap();
    assert!(
        events.iter().any(
            |e| matches!(e, ClientEvent::Queued { waiting_for: Some(why), .. }
            if why.contains("vllm loads"))
        ),
        "{events:?}"
    );
    result_of(&events);
    host.stop().await;
}

#[tokio::test]
async fn failing_samples_keep_the_hold_until_the_load_timeout() {
    // nvidia-smi fails, but `/proc` still shows vLLM running and its health URL still fails: the
    // job is held (its stage would load beside a loading vLLM), and load_timeout_s bounds that.
    let (gpu, host, _ready) = oneshot_beside_a_loading_vllm(2.0).await;
    gpu.set_flag("fail", true);
    wait_decision(&host, "unknown").await;
    let events = tokio::time::timeout(
        Duration::from_secs(30),
        host.transcribe("", wav(1.0, 16000, 1)),
    )
    .await
    .expect("the job still held after vllm's load_timeout_s");
    assert!(
        events.iter().any(
            |e| matches!(e, ClientEvent::Queued { waiting_for: Some(why), .. }
            if why.contains("vllm loads"))
        ),
        "not held while samples failed: {events:?}"
    );
    result_of(&events);
    host.stop().await;
}
