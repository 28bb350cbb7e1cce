//! `gpuhost speakers list|add|delete`: enrolled voices on a server, a thin client of
//! `/speakers`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

#[derive(clap::Args)]
pub(crate) struct SpeakersArgs {
    #[command(subcommand)]
    action: SpeakersAction,
    /// Base URL of the server; default: the config's listen address.
    #[arg(long, global = true)]
    server: Option<String>,
    /// Bearer token (default: the config's `token`).
    #[arg(long, global = true, env = "GPUHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

#[derive(clap::Subcommand)]
enum SpeakersAction {
    /// The enrolled voices.
    List,
    /// Enrol a voice (or add a sample to it) from audio with that voice in it.
    Add {
        /// The name transcripts will use.
        name: String,
        /// Audio with the voice: a few seconds of it alone, or a recording plus --segments or
        /// --transcript/--speaker; `-` reads it from stdin.
        file: PathBuf,
        /// JSON `[[start, end], …]` seconds where the voice speaks.
        #[arg(long, conflicts_with = "transcript")]
        segments: Option<String>,
        /// A finished transcript (JSON result) of FILE; with --speaker.
        #[arg(long, requires = "speaker")]
        transcript: Option<PathBuf>,
        /// The voice's label in that transcript (`SPEAKER_01`).
        #[arg(long, requires = "transcript")]
        speaker: Option<String>,
    },
    /// Forget a voice for good.
    Delete { name: String },
}

pub(crate) async fn speakers(
    config: &gpuhost::Config,
    args: SpeakersArgs,
) -> anyhow::Result<ExitCode> {
    let remote = super::Remote::new(config, args.server.as_deref(), args.token.as_deref())?;
    let mut url = remote.base.join("speakers")?;
    let client = remote.client.clone();
    let request = match args.action {
        SpeakersAction::List => client.get(url.clone()).timeout(super::QUICK),
        SpeakersAction::Delete { name } => {
            url.path_segments_mut()
                .map_err(|()| anyhow::anyhow!("{} cannot be a base URL", remote.base))?
                .push(&name);
            client.delete(url.clone()).timeout(super::QUICK)
        }
        SpeakersAction::Add {
            name,
            file,
            segments,
            transcript,
            speaker,
        } => {
            let audio = if file == std::path::Path::new("-") {
                let mut audio = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut audio)
                    .await
                    .context("cannot read the audio from stdin")?;
                audio
            } else {
                anyhow::ensure!(
                    !file.is_dir(),
                    "{} is a folder: give an audio file with the voice in it",
                    file.display()
                );
                tokio::fs::read(&file)
                    .await
                    .with_context(|| format!("cannot read {}", file.display()))?
            };
            let file_name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "audio".into());
            let mut form = reqwest::multipart::Form::new().text("name", name).part(
                "file",
                reqwest::multipart::Part::bytes(audio).file_name(file_name),
            );
            if let Some(segments) = segments {
                form = form.text("segments", segments);
            }
            if let (Some(transcript), Some(speaker)) = (transcript, speaker) {
                let text = tokio::fs::read_to_string(&transcript)
                    .await
                    .with_context(|| format!("cannot read {}", transcript.display()))?;
                form = form.text("transcript", text).text("speaker", speaker);
            }
            client.post(url.clone()).multipart(form)
        }
    };
    let body: Value = remote
        .send(request)
        .await?
        .json()
        .await
        .context("the server's answer is not JSON: is --server a gpuhost?")?;
    super::print_result(&(serde_json::to_string_pretty(&body)? + "\n"))?;
    Ok(ExitCode::SUCCESS)
}
