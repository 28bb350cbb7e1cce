//! Audio intake: decode any upload (symphonia, then `ffmpeg` for what it cannot read), downmix
//! and resample to the 16 kHz mono PCM16 WAV every worker receives.

mod decode;
mod limits;
mod resample;
mod wav;

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::process::find_program;
use decode::{decode_with_ffmpeg, decode_with_symphonia};
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
///
/// At most `decodes`' permits decode at once. Dropping the future (the client left, the server
/// stops) stops the decoder at its next packet: it runs on a blocking thread, which would
/// otherwise write hours of audio for nobody and hold up shutdown.
pub async fn normalize(
    input: Source,
    output: &Path,
    max_seconds: f64,
    ffmpeg: &str,
    decodes: &tokio::sync::Semaphore,
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
    let _turn = decodes
        .acquire()
        .await
        .map_err(|_| std::io::Error::other("the server is stopping"))?;
    let abandoned = AbandonOnDrop::default();
    let stop = std::sync::Arc::clone(&abandoned.0);
    let (inp, out) = (input.clone(), output.to_path_buf());
    let decoded = tokio::task::spawn_blocking(move || {
        if !small {
            if let Some(info) = check_and_copy(&inp, &out, max_seconds)? {
                return Ok(info);
            }
        }
        // A decoder bug must cost this request only, and its message stays in the server log.
        std::panic::catch_unwind(|| decode_with_symphonia(&inp, &out, max_seconds, &stop))
            .unwrap_or_else(|_| {
                tracing::warn!("the audio decoder panicked on an upload");
                Err(AudioError::Undecodable(
                    "the decoder failed on this file (it is corrupt or not audio)".into(),
                ))
            })
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

/// Set when the future that decodes is dropped; the decoder checks it at every packet.
#[derive(Default)]
struct AbandonOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
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

/// Number of 16-bit mono samples in a WAV written by us or ffmpeg.
fn wav_samples(path: &Path) -> std::io::Result<u64> {
    let len = std::fs::metadata(path)?.len();
    Ok(len.saturating_sub(44) / 2)
}

/// The path of the normalized audio inside a job folder.
pub fn normalized_path(dir: &Path) -> PathBuf {
    dir.join("audio.wav")
}
