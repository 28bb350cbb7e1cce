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
        let known: Vec<&String> = config.workers.keys().collect();
        bail!("no worker `{worker}` in the config (known: {known:?})");
    };
    spec.mode = Mode::Oneshot;
    gpuhost::setup::ensure(config, &|line| eprintln!("{line}")).await?;
    let text = if task == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the task from stdin")?
    } else {
        std::fs::read_to_string(task).with_context(|| format!("reading {}", task.display()))?
    };
    let serde_json::Value::Object(fields) =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", task.display()))?
    else {
        bail!("the task must be a JSON object");
    };
    let dir = tempfile::tempdir()?;
    super::adopt_orphans();
    let (handle, task) = WorkerHandle::spawn(spec);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let printer = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            eprintln!("{}", serde_json::to_string(&event).unwrap_or_default());
        }
    });
    let outcome = handle
        .run(TaskRequest {
            task: fields,
            output_path: dir.path().join("result.json"),
            events: tx,
            cancel: Default::default(),
        })
        .await;
    handle.stop().await;
    let _ = task.await;
    super::sweep_orphans().await;
    let _ = printer.await;
    let result = outcome?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(ExitCode::SUCCESS)
}
