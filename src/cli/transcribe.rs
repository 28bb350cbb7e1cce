//! `gpuhost transcribe <file>`: through a server (`--server`), or locally with every worker in
//! oneshot mode, stage after stage, with progress on stderr and the result on stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use gpuhost::job::{self, start_job, PreparedJob};
use gpuhost::pipeline::JobOptions;
use gpuhost::protocol::ClientEvent;
use gpuhost::render::{render_named, Format};

use super::progress::Progress;

#[derive(clap::Args)]
pub(crate) struct TranscribeArgs {
    /// Audio or video file.
    file: PathBuf,
    /// Base URL of a running gpuhost, e.g. http://127.0.0.1:9090
    #[arg(long)]
    server: Option<String>,
    /// Bearer token for --server (default: the config's `token`, as for every client command).
    #[arg(long, env = "GPUHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// What to print: the whole result (`json`), text, subtitles (`srt`, `vtt`) or the
    /// speakers' turns (`rttm`).
    #[arg(long, value_enum, ignore_case = true, default_value = "json")]
    format: Format,
    /// Comma-separated subset of the pipeline's stages.
    #[arg(long)]
    stages: Option<String>,
    /// Language spoken: a code (`ko`, `en-US`) or an English name (`korean`); left out, the ASR
    /// detects it (a multilingual model) or takes English (an English-only one).
    #[arg(long)]
    language: Option<String>,
    /// How many people speak, when known (the diarizer counts them otherwise).
    #[arg(long)]
    num_speakers: Option<u32>,
    /// At least this many people speak.
    #[arg(long)]
    min_speakers: Option<u32>,
    /// At most this many people speak.
    #[arg(long)]
    max_speakers: Option<u32>,
    /// Text that primes the ASR: names, terms, spelling.
    #[arg(long)]
    prompt: Option<String>,
    /// Translate the speech to English instead of transcribing it (a multilingual ASR model).
    #[arg(long)]
    translate: bool,
    /// Also show the workers' log lines and the host's own log.
    #[arg(long, short)]
    verbose: bool,
}

impl TranscribeArgs {
    pub(crate) fn verbose(&self) -> bool {
        self.verbose
    }
}

pub(crate) async fn transcribe(
    config: gpuhost::Config,
    args: TranscribeArgs,
) -> anyhow::Result<ExitCode> {
    // `-` is stdin. Relative names are made absolute: the decoder child and ffmpeg must not read
    // `-x.wav` as an option or `clip:1.webm` as a protocol.
    let mut args = args;
    if args.file == std::path::Path::new("-") {
        args.file = PathBuf::from("/dev/stdin");
    }
    args.file = std::path::absolute(&args.file).unwrap_or(args.file);
    // A file that is not there is the user's to fix, whichever way the job would run (a pipe,
    // `/dev/stdin` or `<(…)`, is fine).
    let meta = std::fs::metadata(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    anyhow::ensure!(
        !meta.is_dir(),
        "{} is a folder: give an audio or video file",
        args.file.display()
    );
    if meta.is_file() {
        // Unreadable is said here: the decoder would report it as a failed write.
        std::fs::File::open(&args.file)
            .with_context(|| format!("cannot read {}", args.file.display()))?;
    }
    let mut progress = Progress::new(args.verbose);
    let last = match &args.server {
        Some(server) => {
            let server = super::Remote::new(&config, Some(server), args.token.as_deref())?;
            remote(&server, &args, &mut progress).await?
        }
        None => match local(config, &args, &mut progress).await? {
            Ok(last) => last,
            Err(status) => {
                gpuhost::say!(
                    "gpuhost: interrupted; the workers are stopped and the job folder removed"
                );
                return Ok(ExitCode::from(status));
            }
        },
    };
    match last {
        ClientEvent::Result { result } => {
            // RTTM names the recording by its file name (`-`: `audio`).
            let id = args
                .file
                .file_stem()
                .filter(|_| args.file.as_os_str() != "-")
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default();
            super::print_result(&render_named(&result, args.format, &id))?;
            Ok(ExitCode::SUCCESS)
        }
        // The message may carry a worker's stderr: shown, not passed to the terminal raw.
        ClientEvent::Error { code, message } => bail!("{code}: {}", super::shown(&message)),
        _ => bail!("the job ended without a result"),
    }
}

fn options(args: &TranscribeArgs) -> JobOptions {
    JobOptions {
        language: args.language.clone(),
        num_speakers: args.num_speakers,
        min_speakers: args.min_speakers,
        max_speakers: args.max_speakers,
        prompt: args.prompt.clone(),
        translate: args.translate,
    }
}

/// The job run here, every stage one-shot. `Err(status)`: interrupted (Ctrl-C, SIGTERM; the
/// exit status to give), after the workers are stopped and the job folder is gone.
async fn local(
    config: gpuhost::Config,
    args: &TranscribeArgs,
    progress: &mut Progress,
) -> anyhow::Result<Result<ClientEvent, u8>> {
    let stages = job::select_stages(&config.pipeline.stages, args.stages.as_deref())
        .map_err(anyhow::Error::msg)?;
    gpuhost::render::fits(args.format, &stages).map_err(anyhow::Error::msg)?;
    let opts = options(args).validated(config.limits.max_field_bytes)?;
    job::options_for_stages_run(&opts, &config.pipeline.stages, &stages)?;
    // Only the venvs of the stages that run: `--stages asr` needs no diarizer.
    gpuhost::setup::ensure_these(&config, &stages, &|line| gpuhost::say!("{line}")).await?;
    super::adopt_orphans();
    let app = gpuhost::App::start_oneshot(config);
    let run = async {
        let dir = super::job_folder(&app.config)?;
        let source = spilled(&args.file, dir.path(), app.config.limits.max_upload_bytes).await?;
        let prepared = PreparedJob::from_upload(&app, dir, source, opts, stages)
            .await
            .with_context(|| format!("reading {}", args.file.display()))?;
        let mut events = start_job(Arc::clone(&app), prepared)
            .map_err(|_| anyhow::anyhow!("the GPU queue is full"))?;
        let mut last = None;
        while let Some(event) = events.recv().await {
            progress.show(&event);
            last = Some(event);
        }
        last.context("the job ended without a final event")
    };
    let last = tokio::select! {
        last = run => Ok(last),
        status = super::interrupted() => Err(status),
    };
    // Interrupted, the job's future is gone with its folder and the workers stop here.
    app.supervisor.stop_all().await;
    super::sweep_orphans().await;
    match last {
        Ok(last) => last.map(Ok),
        Err(status) => Ok(Err(status)),
    }
}

/// The input as the decoder can read it: a regular file as it is; a pipe, `/dev/stdin` or
/// `<(…)` read once into the job folder (the decoder child and ffmpeg cannot share this
/// process's stdin, and a pipe has no length to check), at most `max` bytes; so is a file whose
/// name is not UTF-8 (the decoder's command line is text).
async fn spilled(
    file: &std::path::Path,
    dir: &std::path::Path,
    max: u64,
) -> anyhow::Result<gpuhost::audio::Source> {
    use tokio::io::AsyncReadExt;
    // Standard input is this process's even when it is a file (`< clip.wav`): the decoder's
    // `/dev/stdin` would be its own, /dev/null.
    let stdin = ["/dev/stdin", "/dev/fd/", "/proc/self/fd/"]
        .iter()
        .any(|p| file.to_str().is_some_and(|f| f.starts_with(p)));
    if !stdin && std::fs::metadata(file).is_ok_and(|m| m.is_file()) && file.to_str().is_some() {
        return Ok(gpuhost::audio::Source::File(file.to_path_buf()));
    }
    let copy = dir.join("input");
    let mut from = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("cannot read {}", file.display()))?
        .take(max + 1);
    let mut to = tokio::fs::File::create(&copy).await?;
    let n = tokio::io::copy(&mut from, &mut to)
        .await
        .with_context(|| format!("reading {}", file.display()))?;
    anyhow::ensure!(n > 0, "{} is empty: nothing to transcribe", file.display());
    anyhow::ensure!(
        n <= max,
        "{} is larger than limits.max_upload_bytes ({max} bytes)",
        file.display()
    );
    Ok(gpuhost::audio::Source::File(copy))
}

async fn remote(
    server: &super::Remote,
    args: &TranscribeArgs,
    progress: &mut Progress,
) -> anyhow::Result<ClientEvent> {
    // The server checks the stages it is asked for, but not the format, which is rendered here:
    // `--stages diarizer --format txt` is refused as the server and the local run refuse it.
    if let Some(named) = &args.stages {
        let named: Vec<String> = named
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if !named.is_empty() {
            gpuhost::render::fits(args.format, &named).map_err(anyhow::Error::msg)?;
        }
    }
    let mut url = server.base.join("transcribe")?;
    {
        let mut q = url.query_pairs_mut();
        let o = options(args);
        for (k, v) in [
            ("stages", args.stages.clone()),
            ("language", o.language),
            ("num_speakers", o.num_speakers.map(|n| n.to_string())),
            ("min_speakers", o.min_speakers.map(|n| n.to_string())),
            ("max_speakers", o.max_speakers.map(|n| n.to_string())),
            ("prompt", o.prompt),
            ("translate", o.translate.then(|| "true".to_string())),
        ] {
            if let Some(v) = v {
                q.append_pair(k, &v);
            }
        }
    }
    let file = tokio::fs::File::open(&args.file)
        .await
        .with_context(|| format!("opening {}", args.file.display()))?;
    let client = server.client.clone();
    // A refused request is answered before the upload is read, and the connection closes under
    // the upload: ask a small protected endpoint first, so a wrong token reads as a 401, not as
    // a broken pipe. Within QUICK: a server that takes the connection and never answers is
    // told at once, not after the upload.
    server
        .send(
            client
                .get(server.base.join("workers")?)
                .timeout(super::QUICK),
        )
        .await
        .context("asking the server before the upload")?;
    let (body, watch) = super::upload::watched(file);
    let response = tokio::select! {
        response = server.send(client.post(url).body(body)) => response?,
        why = watch.stalled(super::STREAM_SILENCE) => return Err(why),
    };
    let mut stream = response.bytes_stream();
    let mut buf = Vec::new();
    let mut last = None;
    while let Some(chunk) = super::next_chunk(&mut stream).await? {
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let event: ClientEvent =
                serde_json::from_slice(&line).context("the server sent a malformed event")?;
            progress.show(&event);
            last = Some(event);
        }
    }
    last.context("the server closed the stream without a final event")
}
