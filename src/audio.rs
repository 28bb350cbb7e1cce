//! Audio intake: decode any upload (symphonia, then `ffmpeg` for what it cannot read), downmix
//! and resample to the 16 kHz mono PCM16 WAV every worker receives.

mod limits;
mod resample;
mod wav;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use crate::process::{find_program, run_captured};
pub(crate) use limits::check_format;
pub use resample::Resampler;
pub use wav::WavWriter;

/// Sample rate of the normalized audio handed to workers.
pub const TARGET_RATE: u32 = 16_000;

#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("the upload is empty: send audio as the request body or as multipart field `file`")]
    Empty,
    #[error("cannot decode the upload as audio: {0}")]
    Undecodable(String),
    /// Decodable perhaps, but declaring a format intake refuses (no decoder fallback is tried).
    #[error("unsupported audio format: {0}")]
    BadFormat(String),
    #[error("audio is {seconds:.0} s long; this server accepts at most {max:.0} s (limits.max_audio_seconds)")]
    TooLong { seconds: f64, max: f64 },
    #[error("cannot write the normalized audio: {0}")]
    Io(#[from] std::io::Error),
}

/// Where the upload is: small ones stay in memory, large ones are spilled to a file.
#[derive(Debug, Clone)]
pub enum Source {
    Memory(bytes::Bytes),
    File(PathBuf),
}

impl Source {
    fn len(&self) -> std::io::Result<u64> {
        match self {
            Source::Memory(b) => Ok(b.len() as u64),
            Source::File(p) => Ok(std::fs::metadata(p)?.len()),
        }
    }

    /// The first `n` bytes (fewer when the upload is shorter).
    fn head(&self, n: usize) -> std::io::Result<std::borrow::Cow<'_, [u8]>> {
        match self {
            Source::Memory(b) => Ok(std::borrow::Cow::Borrowed(&b[..b.len().min(n)])),
            Source::File(p) => {
                use std::io::Read;
                let mut head = Vec::with_capacity(n);
                File::open(p)?.take(n as u64).read_to_end(&mut head)?;
                Ok(std::borrow::Cow::Owned(head))
            }
        }
    }

    fn open(&self) -> std::io::Result<Box<dyn symphonia::core::io::MediaSource>> {
        Ok(match self {
            Source::Memory(b) => Box::new(std::io::Cursor::new(b.clone())),
            Source::File(p) => Box::new(File::open(p)?),
        })
    }
}

/// What was decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioInfo {
    pub seconds: f64,
    pub source_rate: u32,
    pub source_channels: usize,
    /// `symphonia` or `ffmpeg`.
    pub decoder: &'static str,
}

/// Largest normalized upload copied on the async thread (8 s of 16 kHz PCM16).
const INLINE_COPY_MAX: usize = 256 * 1024;

/// Whether `source` is a small upload that already is 16 kHz mono PCM16 WAV: copied as it is,
/// on the async thread, into a job folder that stays small.
pub fn is_small_and_normalized(source: &Source) -> bool {
    match source {
        Source::Memory(bytes) => {
            bytes.len() <= INLINE_COPY_MAX && wav::is_normalized(bytes, TARGET_RATE)
        }
        Source::File(_) => false,
    }
}

/// Decodes `input` into a 16 kHz mono WAV at `output`. Input that already is 16 kHz mono
/// PCM16 WAV is copied as it is.
pub async fn normalize(
    input: Source,
    output: &Path,
    max_seconds: f64,
    ffmpeg: &str,
) -> Result<AudioInfo, AudioError> {
    if input.len()? == 0 {
        return Err(AudioError::Empty);
    }
    // A short upload (a voice command, a test clip) is checked, and copied when it already is
    // 16 kHz mono PCM16, right here: a hop to the blocking pool and back would cost more.
    let small = matches!(&input, Source::Memory(bytes) if bytes.len() <= INLINE_COPY_MAX);
    if small {
        if let Some(info) = check_and_copy(&input, output, max_seconds)? {
            return Ok(info);
        }
    }
    let (inp, out) = (input.clone(), output.to_path_buf());
    let decoded = tokio::task::spawn_blocking(move || {
        if !small {
            if let Some(info) = check_and_copy(&inp, &out, max_seconds)? {
                return Ok(info);
            }
        }
        // A decoder bug must cost this request only, and its message stays in the server log.
        std::panic::catch_unwind(|| decode_with_symphonia(&inp, &out, max_seconds)).unwrap_or_else(
            |_| {
                tracing::warn!("the audio decoder panicked on an upload");
                Err(AudioError::Undecodable(
                    "the decoder failed on this file (it is corrupt or not audio)".into(),
                ))
            },
        )
    })
    .await
    .unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the audio intake task failed");
        Err(AudioError::Undecodable(
            "the decoder failed on this file (it is corrupt or not audio)".into(),
        ))
    });
    match decoded {
        Err(AudioError::Undecodable(why)) => match find_program(ffmpeg) {
            Some(ffmpeg) => {
                let path = match input {
                    Source::File(path) => path,
                    Source::Memory(bytes) => {
                        let path = output.with_file_name("upload");
                        tokio::fs::write(&path, &bytes).await?;
                        path
                    }
                };
                decode_with_ffmpeg(&ffmpeg, &path, output, max_seconds, &why).await
            }
            None => Err(AudioError::Undecodable(format!(
                "{why} (supported: WAV, FLAC, MP3, OGG/Vorbis, M4A/AAC, MP4; install ffmpeg for others such as Opus)"
            ))),
        },
        other => other,
    }
}

/// Refuses a hostile WAV header, then copies an upload in memory that already is 16 kHz mono
/// PCM16 as it is (`None`: it needs decoding).
fn check_and_copy(
    input: &Source,
    output: &Path,
    max_seconds: f64,
) -> Result<Option<AudioInfo>, AudioError> {
    limits::check_riff_header(&input.head(64 * 1024)?)?;
    let Source::Memory(bytes) = input else {
        return Ok(None);
    };
    match wav::copy_if_normalized(bytes, output, TARGET_RATE)? {
        Some(info) => check_length(info, max_seconds).map(Some),
        None => Ok(None),
    }
}

fn check_length(info: AudioInfo, max_seconds: f64) -> Result<AudioInfo, AudioError> {
    if info.seconds > max_seconds {
        return Err(AudioError::TooLong {
            seconds: info.seconds,
            max: max_seconds,
        });
    }
    Ok(info)
}

fn decode_with_symphonia(
    input: &Source,
    output: &Path,
    max_seconds: f64,
) -> Result<AudioInfo, AudioError> {
    let undecodable = |what: &str, e: SymError| AudioError::Undecodable(format!("{what}: {e}"));
    let source = MediaSourceStream::new(input.open()?, Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &Hint::new(),
            source,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(|e| undecodable("unrecognized container format", e))?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL && t.codec_params.sample_rate.is_some())
        .ok_or_else(|| AudioError::Undecodable("the file has no audio track".into()))?;
    let track_id = track.id;
    let params = &track.codec_params;
    limits::check_format(
        params.sample_rate.unwrap_or(TARGET_RATE),
        params.channels.map_or(1, |c| c.count()),
        params.bits_per_sample.or(params.bits_per_coded_sample),
    )?;
    if let (Some(frames), Some(rate)) =
        (track.codec_params.n_frames, track.codec_params.sample_rate)
    {
        let seconds = frames as f64 / f64::from(rate);
        if seconds > max_seconds {
            return Err(AudioError::TooLong {
                seconds,
                max: max_seconds,
            });
        }
    }
    let mut decoder = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| undecodable("unsupported codec", e))?;

    let mut writer = WavWriter::create(output, TARGET_RATE)?;
    let mut resampler: Option<(Resampler, u32, usize)> = None;
    let (mut mono, mut out) = (Vec::new(), Vec::new());
    let mut source_frames = 0u64;
    let mut decode_errors = 0usize;
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(SymError::ResetRequired) => break,
            Err(e) if source_frames == 0 => return Err(undecodable("cannot read audio data", e)),
            Err(_) => break, // a truncated tail: keep what was decoded
        };
        if packet.track_id() != track_id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(decoded) => decoded,
            Err(SymError::DecodeError(_)) => {
                decode_errors += 1;
                continue;
            }
            Err(e) => return Err(undecodable("decoding failed", e)),
        };
        let spec = *decoded.spec();
        let channels = spec.channels.count();
        limits::check_format(spec.rate, channels, None)?;
        let (resampler, _, _) = resampler
            .get_or_insert_with(|| (Resampler::new(spec.rate, TARGET_RATE), spec.rate, channels));
        let mut buf = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
        buf.copy_interleaved_ref(decoded);
        mono.clear();
        mono.extend(
            buf.samples()
                .chunks(channels)
                .map(|f| f.iter().sum::<f32>() / channels as f32),
        );
        source_frames += mono.len() as u64;
        let seconds = source_frames as f64 / f64::from(spec.rate);
        if seconds > max_seconds {
            return Err(AudioError::TooLong {
                seconds,
                max: max_seconds,
            });
        }
        out.clear();
        resampler.push(&mono, &mut out);
        writer.write(&out)?;
    }
    let Some((mut resampler, rate, channels)) = resampler else {
        return Err(AudioError::Undecodable(format!(
            "no audio could be decoded ({decode_errors} corrupt packets)"
        )));
    };
    out.clear();
    resampler.finish(&mut out);
    writer.write(&out)?;
    writer.finish()?;
    if source_frames == 0 {
        return Err(AudioError::Undecodable("the audio track is empty".into()));
    }
    Ok(AudioInfo {
        seconds: source_frames as f64 / f64::from(rate),
        source_rate: rate,
        source_channels: channels,
        decoder: "symphonia",
    })
}

async fn decode_with_ffmpeg(
    ffmpeg: &Path,
    input: &Path,
    output: &Path,
    max_seconds: f64,
    symphonia_said: &str,
) -> Result<AudioInfo, AudioError> {
    let args: Vec<String> = ["-nostdin", "-hide_banner", "-v", "error", "-y", "-i"]
        .iter()
        .map(|s| s.to_string())
        .chain([input.display().to_string()])
        .chain(
            [
                "-vn",
                "-ac",
                "1",
                "-ar",
                "16000",
                "-c:a",
                "pcm_s16le",
                "-f",
                "wav",
                "-t",
            ]
            .iter()
            .map(|s| s.to_string()),
        )
        .chain([
            format!("{}", max_seconds + 1.0),
            output.display().to_string(),
        ])
        .collect();
    let timeout = Duration::from_secs_f64((max_seconds / 10.0).clamp(60.0, 3600.0));
    let captured = run_captured(ffmpeg, &args, timeout)
        .await
        .map_err(|e| AudioError::Undecodable(format!("{symphonia_said}; ffmpeg: {e}")))?;
    if !captured.status.success() {
        let stderr = String::from_utf8_lossy(&captured.stderr);
        let last = stderr.lines().last().unwrap_or("no message");
        return Err(AudioError::Undecodable(format!(
            "{symphonia_said}; ffmpeg: {last}"
        )));
    }
    let samples = wav_samples(output)?;
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
    Ok(AudioInfo {
        seconds,
        source_rate: TARGET_RATE,
        source_channels: 1,
        decoder: "ffmpeg",
    })
}

/// Number of 16-bit mono samples in a WAV written by us or ffmpeg.
fn wav_samples(path: &Path) -> std::io::Result<u64> {
    let len = std::fs::metadata(path)?.len();
    Ok(len.saturating_sub(44) / 2)
}

/// The path of the normalized audio inside a job folder.
pub fn normalized_path(dir: &Path) -> PathBuf {
    dir.join("audio.wav")
}
