//! `gpuhost run <worker> --job job.json`: one job, one worker, oneshot; the result goes to stdout.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use gpuhost::config::Mode;
use gpuhost::worker::{JobRequest, WorkerHandle};

pub(crate) async fn run(
    config: &gpuhost::Config,
    worker: &str,
    job: &Path,
) -> anyhow::Result<ExitCode> {
    let Some(mut spec) = config.worker_spec(worker) else {
        let known: Vec<&String> = config.workers.keys().collect();
        bail!("no worker `{worker}` in the config (known: {known:?})");
    };
    spec.mode = Mode::Oneshot;
    gpuhost::setup::ensure(config, &|line| eprintln!("{line}")).await?;
    let text = if job == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the job from stdin")?
    } else {
        std::fs::read_to_string(job).with_context(|| format!("reading {}", job.display()))?
    };
    let serde_json::Value::Object(fields) =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", job.display()))?
    else {
        bail!("the job must be a JSON object");
    };
    let dir = tempfile::tempdir()?;
    let (handle, task) = WorkerHandle::spawn(spec);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let printer = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            eprintln!("{}", serde_json::to_string(&event).unwrap_or_default());
        }
    });
    let outcome = handle
        .run(JobRequest {
            job: fields,
            output_path: dir.path().join("result.json"),
            events: tx,
            cancel: Default::default(),
        })
        .await;
    handle.stop().await;
    let _ = task.await;
    let _ = printer.await;
    let result = outcome?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(ExitCode::SUCCESS)
}
