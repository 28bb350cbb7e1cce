//! Fault injection with the stdlib fake worker: every failure ends only its own job, and the next
//! job works.

use std::time::{Duration, Instant};

use gpuhost::protocol::ClientEvent;

use super::support::*;

fn one_stage(extra: &str) -> String {
    format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", extra))
}

#[tokio::test]
async fn ready_timeout_fails_the_job_with_the_reason() {
    let host = TestHost::start(&one_stage(
        // Long enough for Python to start and say it is loading on a slow machine.
        "load_timeout_s = 3\nenv = { FAKE_NO_READY = \"1\" }",
    ))
    .await;
    let events = host.transcribe("", wav(0.5, 16000, 1)).await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "worker_unavailable");
    assert!(
        message.contains("not ready within load_timeout_s"),
        "{message}"
    );
    assert!(
        message.contains("w: loading"),
        "stderr tail is shown: {message}"
    );
    let w = host.worker("w").await;
    assert!(
        w["last_error"].as_str().unwrap().contains("not ready"),
        "{w}"
    );
    host.stop().await;
}

#[tokio::test]
async fn worker_that_dies_while_loading_reports_its_stderr() {
    let host = TestHost::start(&one_stage("env = { FAKE_EXIT_AT_LOAD = \"4\" }")).await;
    let events = host.transcribe("", wav(0.5, 16000, 1)).await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "worker_unavailable");
    assert!(message.contains("exit code 4"), "{message}");
    assert!(message.contains("weights missing"), "{message}");
    host.stop().await;
}

#[tokio::test]
async fn worker_that_dies_while_loading_is_seen_at_once_when_its_child_holds_stdout() {
    // The child (as a data loader would) keeps the stdout pipe open: the host must watch the
    // process, not wait for the pipe to close or for the load timeout.
    let extra =
        "load_timeout_s = 120\nenv = { FAKE_EXIT_AT_LOAD = \"4\", FAKE_GRANDCHILD = \"1\" }";
    let host = TestHost::start(&one_stage(extra)).await;
    let started = std::time::Instant::now();
    let events = host.transcribe("", wav(0.5, 16000, 1)).await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "worker_unavailable");
    assert!(message.contains("exit code 4"), "{message}");
    assert!(message.contains("weights missing"), "{message}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "not the load timeout"
    );
    host.stop().await;
}

#[tokio::test]
async fn crash_mid_job_fails_that_job_and_the_next_works() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let first_pid = host.worker("w").await["pid"].as_u64().unwrap();
    // Another client's job first, whose lines name its audio.
    let earlier = result_of(
        &host
            .transcribe("?prompt=fake:logs=2", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(earlier["stages"]["w"]["seq"], 1);
    let events = host
        .transcribe("?prompt=fake:crash", wav(0.5, 16000, 1))
        .await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "worker_crashed");
    assert!(
        message.contains("`w`") && message.contains("exit code 3"),
        "{message}"
    );
    assert!(
        message.contains("segmentation fault (simulated)"),
        "last stderr lines: {message}"
    );
    // This task's lines only: the earlier job's were shown to this client.
    assert!(
        message.contains("job 2 started") && !message.contains("job 1"),
        "{message}"
    );
    assert!(!pid_alive(first_pid as u32));

    let result = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    assert_eq!(result["stages"]["w"]["seq"], 1, "a fresh process ran it");
    let w = host.worker("w").await;
    assert_eq!(w["restarts"], 1);
    assert_eq!(w["tasks_failed"], 1);
    assert_eq!(w["tasks_done"], 2);
    assert_ne!(w["pid"].as_u64().unwrap(), first_pid);
    host.stop().await;
}

#[tokio::test]
async fn hung_job_times_out_is_killed_and_the_next_works() {
    // `job_timeout_s`: the name before `task_timeout_s`, still read.
    let host = TestHost::start(&one_stage("job_timeout_s = 1"))
        .await
        .ready()
        .await;
    let pid = host.worker("w").await["pid"].as_u64().unwrap() as u32;
    let started = std::time::Instant::now();
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:hang", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "worker_timeout");
    assert!(message.contains("within 1 s"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!pid_alive(pid), "the hung process was killed");
    result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    // A `done` the host cannot take for one: the timeout says what it was.
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:wrongdone", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "worker_timeout");
    assert!(message.contains("\"DONE\", was no signal"), "{message}");
    host.stop().await;
}

#[tokio::test]
async fn a_worker_that_stops_reading_its_stdin_times_out() {
    // Stage `a` answers 100 KB of text, so `b`'s task line (which carries it) is larger than a
    // pipe holds; `b` never reads. Its task times out instead of holding the GPU for good.
    let text = "word ".repeat(20_000);
    let host = TestHost::start(&format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", &format!("env = {{ FAKE_TEXT = {text:?} }}")),
        fake_worker("b", "task_timeout_s = 2\nenv = { FAKE_DEAF = \"1\" }")
    ))
    .await
    .ready()
    .await;
    let started = std::time::Instant::now();
    let (code, message) = error_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    assert_eq!(code, "worker_timeout", "{message}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // The GPU is free again: the next job is not queued behind it.
    let (code, _) = error_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    assert_eq!(code, "worker_timeout");
    host.stop().await;
}

#[tokio::test]
async fn garbage_and_partial_lines_on_stdout_never_break_a_job() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let result = result_of(
        &host
            .transcribe("?prompt=fake:garbage%2Bstdoutlog", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(result["stages"]["w"]["worker"], "w");
    result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    host.stop().await;
}

#[tokio::test]
async fn megabyte_stderr_line_is_truncated_not_fatal() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let events = host
        .transcribe("?prompt=fake:bigline", wav(0.5, 16000, 1))
        .await;
    result_of(&events);
    let big = events
        .iter()
        .find_map(|e| match e {
            ClientEvent::Log { line, .. } if line.starts_with("xxxx") => Some(line.clone()),
            _ => None,
        })
        .expect("the long line is forwarded");
    assert!(big.len() < 70_000, "kept at most 64 KiB: {}", big.len());
    assert!(big.ends_with("more bytes dropped]"));
    host.stop().await;
}

#[tokio::test]
async fn logs_and_progress_stream_in_order() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let events = host
        .transcribe("?prompt=fake:logs=5", wav(0.5, 16000, 1))
        .await;
    result_of(&events);
    let fractions: Vec<f64> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Progress {
                fraction, stage, ..
            } if stage == "w" => *fraction,
            _ => None,
        })
        .collect();
    assert_eq!(fractions, [0.2, 0.4, 0.6, 0.8, 1.0]);
    let logs = events
        .iter()
        .filter(|e| matches!(e, ClientEvent::Log { line, .. } if line.contains("log ")))
        .count();
    assert_eq!(logs, 5);
    // A line naming a file of the job names its folder `<job>`, as the final error does.
    let reading = events
        .iter()
        .find_map(|e| match e {
            ClientEvent::Log { line, .. } if line.contains("reading") => Some(line.clone()),
            _ => None,
        })
        .expect("the worker's line about its audio");
    assert!(reading.starts_with("w: reading <job>/"), "{reading}");
    host.stop().await;
}

#[tokio::test]
async fn a_burst_of_logs_does_not_crowd_out_stage_events() {
    // A worker writing progress (16 MB) faster than its client reads: once the socket buffers
    // and the channel to it are full the client misses progress, never `started` / `done`
    // (clients and the CLI go by those).
    let host = TestHost::start(&one_stage("")).await.ready().await;
    for _ in 0..2 {
        let response = host
            .post_body("/transcribe?prompt=fake:chatter=4000", wav(0.5, 16000, 1))
            .await;
        let mut reader = EventReader::new(response);
        let mut events = Vec::new();
        while let Some(event) = reader.next().await {
            events.push(event);
            if events.len() % 2 == 0 {
                // Reading on, but slower than the worker writes (one event per 0.5 ms).
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        result_of(&events);
        let stages: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                ClientEvent::Stage { stage, status, .. } => Some(format!("{stage} {status:?}")),
                _ => None,
            })
            .collect();
        assert_eq!(stages, ["w Started", "w Done"]);
    }
    host.stop().await;
}

#[tokio::test]
async fn error_signal_fails_the_job_but_keeps_the_worker() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let pid = host.worker("w").await["pid"].clone();
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:error", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "job_failed");
    assert!(
        message.contains("ValueError: simulated failure"),
        "{message}"
    );
    // As one answer: a failure on the server's side (worth a retry), not a 4xx that blames
    // the upload (input a model cannot take is `refused`, 400).
    let response = host
        .post_body(
            "/transcribe?format=json&prompt=fake:error",
            wav(0.5, 16000, 1),
        )
        .await;
    assert_eq!(response.status(), 500);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "job_failed", "{body}");
    let result = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    assert_eq!(result["stages"]["w"]["seq"], 3, "same process, third job");
    assert_eq!(host.worker("w").await["pid"], pid);
    // A worker whose disk is full says so (`kind: "no_space"`): 507, as the host's own full
    // disk, not a 4xx that blames the upload.
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:nospace", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "insufficient_storage");
    assert!(message.contains("No space left"), "{message}");
    let response = host
        .post_body(
            "/transcribe?format=json&prompt=fake:nospace",
            wav(0.5, 16000, 1),
        )
        .await;
    assert_eq!(response.status(), 507);
    assert_eq!(host.worker("w").await["pid"], pid, "the worker stays up");
    host.stop().await;
}

#[tokio::test]
async fn done_without_result_file_is_bad_output() {
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:noresult", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "bad_output");
    assert!(message.contains("w.result.json"), "{message}");
    // Valid JSON that is not an object is bad output too, not an empty transcript.
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:listresult", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "bad_output");
    assert!(message.contains("array, not an object"), "{message}");
    // A new process takes the next job (a `done` without a result restarts the worker).
    result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    // A link to nowhere is bad output, but something the worker wrote for this task: it is
    // kept, and not told it said `done` without writing anything.
    let pid = host.worker("w").await["pid"].clone();
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:danglingresult", wav(0.5, 16000, 1))
            .await,
    );
    assert_eq!(code, "bad_output");
    assert!(!message.contains("without writing"), "{message}");
    assert_eq!(host.worker("w").await["pid"], pid, "the worker stays up");
    // A result past the size read inline is read on a blocking thread, the same.
    let events = host
        .transcribe("?prompt=fake:bigresult", wav(0.5, 16000, 1))
        .await;
    let pad = result_of(&events)["stages"]["w"]["pad"]
        .as_str()
        .unwrap()
        .len();
    assert_eq!(pad, 100_000);
    host.stop().await;
}

#[tokio::test]
async fn an_asr_result_without_a_transcript_is_bad_output_not_an_empty_one() {
    // A worker in the asr stage that answers no `segments`: the job was a 200 with an empty
    // transcript (and `?format=srt` an empty file).
    let config = format!("[pipeline]\nstages = [\"asr\"]\n{}", fake_worker("asr", ""));
    let host = TestHost::start(&config).await.ready().await;
    let (code, message) = error_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    assert_eq!(code, "bad_output");
    assert!(message.contains("no `segments`"), "{message}");
    let r = host
        .post_body("/transcribe?format=srt", wav(0.5, 16000, 1))
        .await;
    assert_eq!(r.status(), 502);
    host.stop().await;
}

#[tokio::test]
async fn slow_loading_worker_is_waited_for_and_health_stays_fast() {
    let host = TestHost::start(&one_stage("env = { FAKE_LOAD_MS = \"1500\" }")).await;
    let request = host.transcribe("", wav(0.5, 16000, 1));
    let health = async {
        let started = std::time::Instant::now();
        let h: serde_json::Value = reqwest::get(format!("{}/health", host.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(h["workers"]["loading"], 1, "{h}");
    };
    let (events, ()) = tokio::join!(request, health);
    result_of(&events);
    host.stop().await;
}

#[tokio::test]
async fn oneshot_worker_runs_a_fresh_process_per_job_and_exits() {
    let host = TestHost::start(&one_stage("mode = \"oneshot\"")).await;
    assert_eq!(host.worker("w").await["state"], "idle");
    let a = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    let b = result_of(&host.transcribe("", wav(0.5, 16000, 1)).await);
    let (pa, pb) = (
        a["stages"]["w"]["pid"].as_u64().unwrap(),
        b["stages"]["w"]["pid"].as_u64().unwrap(),
    );
    assert_ne!(pa, pb);
    assert_eq!(b["stages"]["w"]["seq"], 1);
    assert!(
        !pid_alive(pa as u32) && !pid_alive(pb as u32),
        "oneshot processes exit after their job"
    );
    let w = host.worker("w").await;
    assert_eq!(w["state"], "idle");
    assert_eq!(w["tasks_done"], 2);
    host.stop().await;
}

#[tokio::test]
async fn stages_see_earlier_results_and_options() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", "[workers.a.options]\noption = \"from-config\""),
        fake_worker("b", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    let events = host
        .transcribe("?num_speakers=2&language=en", wav(1.0, 16000, 1))
        .await;
    let result = result_of(&events);
    assert_eq!(result["stages"]["a"]["earlier"], serde_json::json!([]));
    assert_eq!(result["stages"]["b"]["earlier"], serde_json::json!(["a"]));
    assert_eq!(result["stages"]["a"]["option"], "from-config");
    assert_eq!(result["stages"]["b"]["num_speakers"], 2);
    assert_eq!(result["stages"]["b"]["language"], "en");
    assert!((result["duration"].as_f64().unwrap() - 1.0).abs() < 0.01);
    let order: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            ClientEvent::Stage { stage, status, .. } => Some(format!("{stage}:{status:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["a:Started", "a:Done", "b:Started", "b:Done"]);
    // Only stage b:
    let result = result_of(&host.transcribe("?stages=b", wav(0.5, 16000, 1)).await);
    assert!(result["stages"].get("a").is_none());
    host.stop().await;
}

#[tokio::test]
async fn a_silent_stage_and_a_long_wait_keep_their_streams_alive() {
    // Heartbeats every 0.2 s: the first job's stage works 1.5 s without a word, the second job
    // waits for it in the queue. Both streams hear again what is going on.
    let host = TestHost::start(&format!("[http]\nheartbeat_s = 0.2\n{}", one_stage("")))
        .await
        .ready()
        .await;
    // A streamed answer starts once its job is queued: the first is ahead of the second.
    let first = host
        .post_body("/transcribe?prompt=fake:sleep=1500", wav(0.3, 16000, 1))
        .await;
    let second = host.post_body("/transcribe", wav(0.3, 16000, 1)).await;
    let (first, second) = tokio::join!(read_events(first), read_events(second));
    result_of(&first);
    result_of(&second);
    let again = first
        .iter()
        .filter(|e| {
            matches!(e, ClientEvent::Progress { stage, fraction: None, message: None, partial: None } if stage == "w")
        })
        .count();
    assert!(again >= 3, "a silent stage is said again: {first:?}");
    let waiting = second
        .iter()
        .filter(|e| matches!(e, ClientEvent::Queued { position: 1, .. }))
        .count();
    assert!(waiting >= 3, "a long wait is said again: {second:?}");
    host.stop().await;
}

#[tokio::test]
async fn a_ready_line_with_unreadable_metadata_fails_the_load_at_once() {
    // `"protocol": "1"` is the worker's own ready with a key of the wrong type: it was taken
    // for a stray line, and the worker killed as never ready after load_timeout_s (600 s).
    let host = TestHost::start(&one_stage(
        "env = { FAKE_READY_META = '{\"protocol\":\"1\"}' }",
    ))
    .await;
    wait_for("the load to fail", Duration::from_secs(20), || async {
        host.worker("w").await["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("`ready` line has metadata gpuhost cannot read"))
    })
    .await;
    let worker = host.worker("w").await;
    assert!(
        worker["last_error"].as_str().unwrap().contains("protocol"),
        "{worker}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_worker_that_exits_right_after_ready_is_restarted_with_backoff() {
    // Its `ready` reset the count of failures in a row: every restart was the first, at once,
    // 25 Python starts a second.
    let host = TestHost::start(&one_stage("env = { FAKE_EXIT_AFTER_READY = \"0\" }")).await;
    let started = Instant::now();
    wait_for("five restarts", Duration::from_secs(30), || async {
        host.worker("w").await["restarts"].as_u64().unwrap_or(0) >= 5
    })
    .await;
    // The fifth exit comes after restarts at once, then after 0.5 s, 1 s and 2 s.
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    host.stop().await;
}

#[tokio::test]
async fn a_task_that_cannot_reach_its_worker_goes_to_a_new_one() {
    // The worker closes its stdin after a job and stays up: the next job's line cannot be
    // written. It failed as a crash, though nothing had reached the worker.
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let pid = host.worker("w").await["pid"].clone();
    result_of(
        &host
            .transcribe("?prompt=fake:closestdin", wav(0.3, 16000, 1))
            .await,
    );
    let result = result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
    assert_eq!(result["stages"]["w"]["seq"], 1, "a new process's first job");
    let w = host.worker("w").await;
    assert_ne!(w["pid"], pid);
    assert_eq!(
        (w["tasks_done"].as_u64(), w["tasks_failed"].as_u64()),
        (Some(2), Some(0)),
        "{w}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_stray_done_fails_one_task_and_restarts_the_worker() {
    // The worker says `done` once more as the next task arrives: that task takes it for its
    // own. Every answer after it then ended the task after its own.
    let host = TestHost::start(&one_stage("")).await.ready().await;
    let pid = host.worker("w").await["pid"].clone();
    result_of(
        &host
            .transcribe("?prompt=fake:straydone", wav(0.3, 16000, 1))
            .await,
    );
    let (code, message) = error_of(
        &host
            .transcribe("?prompt=fake:sleep=3000", wav(0.3, 16000, 1))
            .await,
    );
    assert_eq!(code, "bad_output");
    assert!(message.contains("restarted"), "{message}");
    let result = result_of(
        &host
            .transcribe("?prompt=fake:sleep=2500", wav(0.3, 16000, 1))
            .await,
    );
    assert_eq!(result["stages"]["w"]["seq"], 1, "a new process's first job");
    assert_ne!(host.worker("w").await["pid"], pid);
    host.stop().await;
}
