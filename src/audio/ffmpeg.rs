//! The `ffmpeg` decoder, for what symphonia cannot read (Opus, WebM, AMR, …): a time- and
//! memory-bounded child that may read only the upload, never more than a bounded expansion of it.

use std::path::Path;

use super::{decode_timeout, downmix, unless_stalled, wav, AudioError, AudioInfo, TARGET_RATE};
use crate::process::{run_helper, HelperInput, RunError};

/// The demuxers ffmpeg may use on an upload: audio and audio-video containers that hold their
/// media themselves. Playlists (HLS, `concat`) are left out: they make ffmpeg open further files
/// or streams (any audio file the server can read, or a live list it reloads without end).
const FFMPEG_FORMATS: &str = "aac,ac3,aiff,amr,ape,asf,au,avi,caf,dts,eac3,flac,flv,gsm,matroska,mov,mp3,mpc,mpc8,mpeg,mpegts,ogg,tta,voc,w64,wav,wv";

/// Most times its own size an upload may grow into normalized audio (32 KB a second) through
/// ffmpeg. Real codecs stay far below (8 kbps MP3: 32×, the 700 bps Codec2 mode: 366×); a
/// format declaring 1 Hz turns 28 KB into 4 hours. symphonia's path is bounded by the declared
/// format checks (4 kHz at least) instead.
const FFMPEG_MAX_EXPANSION: f64 = 1000.0;

/// ffmpeg's address-space limit: decoding audio takes tens of MB; a file whose tables ask for
/// gigabytes fails in ffmpeg instead of pressing the machine's memory.
const FFMPEG_ADDRESS_SPACE: u64 = 2 << 30;

pub(super) async fn decode_with_ffmpeg(
    ffmpeg: &Path,
    input: &Path,
    output: &Path,
    max_seconds: f64,
    symphonia_said: &str,
) -> Result<AudioInfo, AudioError> {
    let input_bytes = std::fs::metadata(input)?.len();
    // ffmpeg stops writing at this length: a hostile upload costs no more disk than twice that
    // (two outputs, below), and `limits.min_free_bytes` is watched meanwhile.
    let expansion_cap =
        (input_bytes as f64 * FFMPEG_MAX_EXPANSION / (2.0 * f64::from(TARGET_RATE))).max(1.0);
    // Two outputs: ffmpeg's downmix (its matrix: a 5.1 track's centre, where speech is, weighs
    // most), and the first channel alone for when that downmix cancels out (`downmix.rs`).
    let first = output.with_extension("first.wav");
    let cap = format!("{}", (max_seconds + 1.0).min(expansion_cap));
    let to = |downmix: [&str; 2], path: &Path| {
        [
            "-vn",
            downmix[0],
            downmix[1],
            "-ar",
            "16000",
            "-c:a",
            "pcm_s16le",
            "-f",
            "wav",
            "-t",
        ]
        .map(String::from)
        .into_iter()
        .chain([cap.clone(), path.display().to_string()])
    };
    let args: Vec<String> = [
        "-nostdin",
        "-hide_banner",
        "-v",
        "error",
        "-y",
        "-protocol_whitelist",
        "file",
        "-format_whitelist",
        FFMPEG_FORMATS,
        "-i",
    ]
    .map(String::from)
    .into_iter()
    .chain([input.display().to_string()])
    .chain(to(["-ac", "1"], output))
    .chain(to(["-af", "pan=mono|c0=c0"], &first))
    .collect();
    let decoded = run(ffmpeg, &args, input_bytes, output, symphonia_said).await;
    let kept = match decoded {
        Ok(()) => {
            let (mean, first) = (output.to_path_buf(), first.clone());
            tokio::task::spawn_blocking(move || keep_first_if_cancelled(&mean, &first))
                .await
                .map_err(std::io::Error::other)
                .and_then(|kept| kept)
                .map_err(AudioError::Io)
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&first); // moved already where it was kept
    if kept? {
        tracing::info!("the upload's channels cancel out (one is phase-inverted); its first channel is transcribed");
    }
    let samples = wav::data_bytes(output)? / 2;
    if samples == 0 {
        return Err(AudioError::Undecodable(format!(
            "{symphonia_said}; ffmpeg found no audio"
        )));
    }
    let seconds = samples as f64 / f64::from(TARGET_RATE);
    if seconds > max_seconds {
        return Err(AudioError::TooLong {
            seconds,
            max: max_seconds,
        });
    }
    if expansion_cap < max_seconds && seconds >= expansion_cap - 0.01 {
        return Err(AudioError::BadFormat(format!(
            "the upload ({input_bytes} bytes) decodes into more than {FFMPEG_MAX_EXPANSION:.0} times its size; its sample rate or codec is not one real audio uses"
        )));
    }
    Ok(AudioInfo {
        seconds,
        source_rate: None,
        source_channels: None,
        decoder: "ffmpeg",
    })
}

/// Runs ffmpeg with `args`; its failure in words a client can act on.
async fn run(
    ffmpeg: &Path,
    args: &[String],
    input_bytes: u64,
    output: &Path,
    symphonia_said: &str,
) -> Result<(), AudioError> {
    let timeout = decode_timeout(input_bytes);
    let limits = HelperInput {
        stdin: None,
        address_space: Some(FFMPEG_ADDRESS_SPACE),
    };
    let run = async {
        run_helper(ffmpeg, args, timeout, limits)
            .await
            .map_err(|e| {
                // Without the server's path to ffmpeg.
                let why = match e {
                    RunError::Timeout { timeout, .. } => {
                        format!("did not finish within {} s", timeout.as_secs())
                    }
                    RunError::Io { .. } => {
                        "wrote more messages than are kept (the file is likely corrupt)".into()
                    }
                    RunError::Spawn { .. } => "could not be started".into(),
                };
                tracing::warn!(error = %e, "ffmpeg failed on an upload");
                AudioError::Undecodable(format!("{symphonia_said}; ffmpeg {why}"))
            })
    };
    let captured = unless_stalled(output, run).await?;
    if captured.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&captured.stderr);
    if stderr.contains("not on whitelist") {
        return Err(AudioError::Undecodable(format!(
            "{symphonia_said}; ffmpeg: this container is not accepted (playlists and other formats that refer to further files are refused)"
        )));
    }
    // Its first line names the problem ("Invalid data found…", "Error while decoding…"), the
    // last what it gave up on; both when they differ.
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let said = match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if first != last => format!("{first} … {last}"),
        (Some(only), _) => only.to_string(),
        _ => "no message".into(),
    };
    Err(AudioError::Undecodable(format!(
        "{symphonia_said}; ffmpeg: {said}"
    )))
}

/// Replaces ffmpeg's downmix at `mean` with its first channel at `first` where the downmix has
/// cancelled out (`downmix::cancelled`; the first channel's energy stands for each channel's).
/// Whether it did.
fn keep_first_if_cancelled(mean: &Path, first: &Path) -> std::io::Result<bool> {
    let (mono, frames) = wav::energy(mean)?;
    let (each, _) = wav::energy(first)?;
    let cancelled = downmix::cancelled(mono, each, frames);
    if cancelled {
        std::fs::rename(first, mean)?;
    }
    Ok(cancelled)
}
