//! Decoding in a child process (`gpuhost decode-audio`, hidden): symphonia sizes buffers by
//! lengths read from file headers, and a file of 100 bytes (an MP4 `hdlr` box, a CAF chunk, an
//! EBML string claiming petabytes) makes it ask for more memory than exists, which aborts the
//! process that asks. In a child that costs one upload, not the host and every job in it. The
//! child also runs under an address-space limit (a 175-byte Ogg Vorbis setup header may ask for
//! gigabytes within the format's rules) and a time limit.
//!
//! The child writes the normalized WAV itself and prints one [`Outcome`] line on stdout.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use super::{decode_here, decode_timeout, unless_stalled, AudioError, AudioInfo, Source};
use crate::process::{run_helper, HelperInput};

/// The child's address-space limit. Decoding streams (a 4-hour file needs a few MB of tables);
/// what asks for more is hostile or broken, and fails in the child.
const ADDRESS_SPACE: u64 = 1 << 30;

/// What the child reports.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum Outcome {
    Decoded {
        seconds: f64,
        source_rate: u32,
        source_channels: usize,
        /// Copied as it was, else decoded.
        copied: bool,
    },
    Empty,
    Undecodable {
        message: String,
    },
    BadFormat {
        message: String,
    },
    TooLong {
        seconds: f64,
        max: f64,
    },
    Io {
        message: String,
    },
}

impl From<Result<AudioInfo, AudioError>> for Outcome {
    fn from(result: Result<AudioInfo, AudioError>) -> Outcome {
        match result {
            Ok(info) => Outcome::Decoded {
                seconds: info.seconds,
                source_rate: info.source_rate.unwrap_or_default(),
                source_channels: info.source_channels.unwrap_or_default(),
                copied: info.decoder == "copy",
            },
            Err(AudioError::Empty) => Outcome::Empty,
            Err(AudioError::Undecodable(message)) => Outcome::Undecodable { message },
            Err(AudioError::BadFormat(message)) => Outcome::BadFormat { message },
            Err(AudioError::TooLong { seconds, max }) => Outcome::TooLong { seconds, max },
            Err(AudioError::Io(e)) => Outcome::Io {
                message: e.to_string(),
            },
            // Decided in the host, never in a child.
            Err(e @ (AudioError::ShuttingDown | AudioError::NoSpace(_))) => Outcome::Io {
                message: e.to_string(),
            },
        }
    }
}

impl From<Outcome> for Result<AudioInfo, AudioError> {
    fn from(outcome: Outcome) -> Result<AudioInfo, AudioError> {
        match outcome {
            Outcome::Decoded {
                seconds,
                source_rate,
                source_channels,
                copied,
            } => Ok(AudioInfo {
                seconds,
                source_rate: Some(source_rate),
                source_channels: Some(source_channels),
                decoder: if copied { "copy" } else { "symphonia" },
            }),
            Outcome::Empty => Err(AudioError::Empty),
            Outcome::Undecodable { message } => Err(AudioError::Undecodable(message)),
            Outcome::BadFormat { message } => Err(AudioError::BadFormat(message)),
            Outcome::TooLong { seconds, max } => Err(AudioError::TooLong { seconds, max }),
            Outcome::Io { message } => Err(AudioError::Io(std::io::Error::other(message))),
        }
    }
}

/// The child's side: decodes `input` (a path, or `-` for stdin) into `output` and prints the
/// outcome.
pub fn child_main(input: &Path, output: &Path, max_seconds: f64) -> ExitCode {
    let source = if input == Path::new("-") {
        let mut bytes = Vec::new();
        if let Err(e) = std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes) {
            crate::say!("gpuhost decode-audio: reading stdin: {e}");
            return ExitCode::FAILURE;
        }
        Source::Memory(bytes.into())
    } else {
        Source::File(input.to_path_buf())
    };
    let outcome = Outcome::from(decode_here(
        &source,
        output,
        max_seconds,
        &AtomicBool::new(false),
    ));
    match serde_json::to_string(&outcome) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::say!("gpuhost decode-audio: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The host's side: runs `program decode-audio` on `input`. A child that dies (an aborted
/// allocation, a crash) or runs out of time makes the upload undecodable, and only it.
pub(super) async fn decode_in_child(
    program: &Path,
    input: &Source,
    output: &Path,
    max_seconds: f64,
) -> Result<AudioInfo, AudioError> {
    let (path, stdin) = match input {
        Source::File(path) => (path.display().to_string(), None),
        Source::Memory(bytes) => ("-".to_string(), Some(bytes.clone())),
    };
    let args = [
        "decode-audio".to_string(),
        "--input".into(),
        path,
        "--output".into(),
        output.display().to_string(),
        "--max-seconds".into(),
        max_seconds.to_string(),
    ];
    let timeout = decode_timeout(input.len()?);
    let helper = HelperInput {
        stdin,
        address_space: Some(ADDRESS_SPACE),
    };
    let run = async {
        run_helper(program, &args, timeout, helper)
            .await
            .map_err(|e| match e {
                crate::process::RunError::Spawn { program, source } => {
                    AudioError::Io(std::io::Error::other(format!(
                        "cannot start the audio decoder {program}: {source}"
                    )))
                }
                e => {
                    tracing::warn!(error = %e, "the audio decoder did not finish");
                    AudioError::Undecodable(format!(
                        "the decoder did not finish on this file ({e})"
                    ))
                }
            })
    };
    let captured = unless_stalled(output, run).await?;
    let stdout = String::from_utf8_lossy(&captured.stdout);
    match stdout.lines().last().map(serde_json::from_str::<Outcome>) {
        Some(Ok(outcome)) => outcome.into(),
        _ => {
            // Died before it could say (an allocation it could not get aborts it): the reason
            // is on its stderr, for the server log only.
            let stderr = String::from_utf8_lossy(&captured.stderr);
            // Its first line says why ("memory allocation of … bytes failed", a panic's place).
            let first = stderr.lines().find(|l| !l.trim().is_empty());
            tracing::warn!(
                exit = %crate::process::describe_exit(&captured.status),
                said = first.unwrap_or(""),
                "the audio decoder failed on an upload"
            );
            Err(AudioError::Undecodable(
                "the decoder failed on this file (it is corrupt or not audio)".into(),
            ))
        }
    }
}
