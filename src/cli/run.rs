//! `gpuhost run <worker> --task task.json`: one task, one worker, oneshot; the result goes to stdout.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use gpuhost::config::Mode;
use gpuhost::worker::{TaskRequest, WorkerHandle};

pub(crate) async fn run(
    config: &gpuhost::Config,
    worker: &str,
    task: &Path,
) -> anyhow::Result<ExitCode> {
    let Some(mut spec) = config.worker_spec(worker) else {
        let known: Vec<&str> = config.workers.keys().map(String::as_str).collect();
        bail!(
            "no worker `{worker}` in the config (configured: {})",
            known.join(", ")
        );
    };
    spec.mode = Mode::Oneshot;
    let text = if task == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the task from stdin")?
    } else {
        std::fs::read_to_string(task).with_context(|| format!("reading {}", task.display()))?
    };
    let serde_json::Value::Object(mut fields) =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", task.display()))?
    else {
        bail!("the task must be a JSON object");
    };
    // Paths in the task are the user's, relative to where the command runs, not to the worker's
    // own folder.
    for key in ["audio_path", "wav_path"] {
        if let Some(serde_json::Value::String(path)) = fields.get_mut(key) {
            if let Ok(absolute) = std::path::absolute(&*path) {
                *path = absolute.display().to_string();
            }
        }
    }
    gpuhost::setup::ensure_these(config, &[worker.to_string()], &|line| {
        gpuhost::say!("{line}")
    })
    .await?;
    let dir = super::job_folder(config)?;
    super::adopt_orphans();
    let (handle, task) = WorkerHandle::spawn(spec);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let printer = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            gpuhost::say!("{}", serde_json::to_string(&event).unwrap_or_default());
        }
    });
    let run = handle.run(TaskRequest {
        task: fields,
        output_path: dir.path().join("result.json"),
        events: tx,
        cancel: Default::default(),
    });
    let outcome = tokio::select! {
        outcome = run => Ok(outcome),
        status = super::interrupted() => Err(status),
    };
    handle.stop().await;
    let _ = task.await;
    super::sweep_orphans().await;
    let _ = printer.await;
    drop(dir);
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(status) => return Ok(ExitCode::from(status)),
    };
    let result = outcome?;
    super::print_result(&(serde_json::to_string_pretty(&result)? + "\n"))?;
    Ok(ExitCode::SUCCESS)
}
