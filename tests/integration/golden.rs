//! The golden transcripts in protocol/golden: the host parses every worker line as recorded, and a
//! real worker process replaying each transcript yields the recorded results and events.

use std::path::PathBuf;
use std::time::Duration;

use gpuhost::config::{Mode, WorkerSpec};
use gpuhost::protocol::{Signal, TaskLine, WorkerEvent};
use gpuhost::worker::{TaskRequest, WorkerHandle};
use serde_json::Value;

use super::support::*;

fn transcripts() -> Vec<(PathBuf, Vec<Value>)> {
    let mut out: Vec<_> = std::fs::read_dir(repo().join("protocol/golden"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
        .map(|p| {
            let lines = std::fs::read_to_string(&p)
                .unwrap()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            (p, lines)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 3, "golden transcripts present");
    out
}

#[test]
fn host_parses_every_worker_line_as_recorded() {
    for (path, lines) in transcripts() {
        for entry in &lines[1..] {
            let Some(parsed) = entry.get("parsed") else {
                continue;
            };
            let line = entry["line"].as_str().unwrap();
            let got = match entry["channel"].as_str().unwrap() {
                "stdout" => serde_json::to_value(Signal::parse(line)).unwrap(),
                "stderr" => serde_json::to_value(WorkerEvent::parse(line)).unwrap(),
                other => panic!("{}: parsed on channel {other}", path.display()),
            };
            assert_eq!(&got, parsed, "{}: {line}", path.display());
        }
    }
}

#[tokio::test]
async fn replayed_transcripts_give_the_recorded_outcomes() {
    for (path, lines) in transcripts() {
        let spec = WorkerSpec {
            name: "replay".into(),
            argv: vec![
                python(),
                fixture("replay_worker.py").display().to_string(),
                path.display().to_string(),
            ],
            cwd: repo(),
            env: Default::default(),
            mode: Mode::Resident,
            vram_mib: 0,
            load_timeout: Duration::from_secs(20),
            task_timeout: Duration::from_secs(20),
            stop_grace: Duration::from_secs(1),
            cancel_grace: Duration::from_secs(1),
            options: Default::default(),
            unloaded_fallback: Default::default(),
            device: 0,
        };
        let (worker, task) = WorkerHandle::spawn(spec);
        let dir = tempfile::tempdir().unwrap();
        // Split the transcript into tasks: each starts at a host line and ends at done/error.
        let entries = &lines[1..];
        let starts: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i]["from"] == "host")
            .collect();
        for (n, &start) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(entries.len());
            let task_entries = &entries[start..end];
            // The recorded host line is a `TaskLine`; the host must write it back the same way
            // (the replay worker compares what it reads with the recording).
            let line: TaskLine =
                serde_json::from_str(task_entries[0]["line"].as_str().unwrap()).unwrap();
            let job = line.fields;
            let (tx, mut rx) = tokio::sync::mpsc::channel(64);
            let outcome = worker
                .run(TaskRequest {
                    task: job,
                    output_path: dir.path().join(format!("out{n}.json")),
                    events: tx,
                    cancel: Default::default(),
                })
                .await;
            let mut events = Vec::new();
            while let Ok(e) = rx.try_recv() {
                events.push(serde_json::to_value(e).unwrap());
            }
            let want_events: Vec<Value> = task_entries
                .iter()
                .filter(|e| e["channel"] == "stderr")
                .map(|e| e["parsed"].clone())
                .collect();
            assert_eq!(events, want_events, "{} task {n}: events", path.display());
            match task_entries.iter().find(|e| e["channel"] == "result") {
                Some(result) => assert_eq!(
                    outcome.unwrap(),
                    result["json"],
                    "{} task {n}",
                    path.display()
                ),
                None => {
                    let err = outcome.unwrap_err();
                    let want = task_entries.iter().find_map(|e| e.get("outcome")).unwrap();
                    assert_eq!(
                        err.code().as_str(),
                        want["error"],
                        "{} task {n}: {err}",
                        path.display()
                    );
                }
            }
        }
        worker.stop().await;
        task.await.unwrap();
    }
}
