//! Audio intake: decode any upload (symphonia, then `ffmpeg` for what it cannot read), downmix
//! and resample to the 16 kHz mono PCM16 WAV every worker receives.

mod child;
mod decode;
mod downmix;
mod ffmpeg;
mod limits;
mod mp4;
mod resample;
mod wav;

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::process::find_program;
pub use child::child_main;
use decode::decode_with_symphonia;
use ffmpeg::decode_with_ffmpeg;
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
    #[error("{0}")]
    NoSpace(crate::job::NoSpace),
    /// The host began to shut down before the upload was decoded.
    #[error("gpuhost is shutting down; the upload was not decoded: send it again once the server is back")]
    ShuttingDown,
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

    /// The upload, to read and seek in (a file is read through a buffer).
    fn reader(&self) -> std::io::Result<Box<dyn ReadSeek + '_>> {
        Ok(match self {
            Source::Memory(b) => Box::new(std::io::Cursor::new(&b[..])),
            Source::File(p) => Box::new(std::io::BufReader::new(File::open(p)?)),
        })
    }

    fn open(&self) -> std::io::Result<Box<dyn symphonia::core::io::MediaSource>> {
        Ok(match self {
            Source::Memory(b) => Box::new(std::io::Cursor::new(b.clone())),
            Source::File(p) => Box::new(File::open(p)?),
        })
    }
}

trait ReadSeek: std::io::Read + std::io::Seek {}
impl<T: std::io::Read + std::io::Seek> ReadSeek for T {}

/// What was decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioInfo {
    pub seconds: f64,
    /// The upload's own rate and channels, when the decoder says them (ffmpeg, run quiet to
    /// keep its errors readable, does not: `None`, shown as `null`, not the output's 16 kHz mono).
    pub source_rate: Option<u32>,
    pub source_channels: Option<usize>,
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
/// `decoder` is a `gpuhost` executable: symphonia then runs in its `decode-audio` child, so a
/// hostile file costs that child, not this process (see `child.rs`). `None` decodes here, on a
/// blocking thread (for library use and the fuzz test of the decoder itself).
///
/// At most `decodes`' permits decode at once. Dropping the future (the client left, the server
/// stops) stops the decoder: the child is killed, a decode here stops at its next packet (it
/// would otherwise write hours of audio for nobody and hold up shutdown).
pub async fn normalize(
    input: Source,
    output: &Path,
    max_seconds: f64,
    decoder: Option<&Path>,
    ffmpeg: &str,
    decodes: &tokio::sync::Semaphore,
    keep_free: u64,
) -> Result<AudioInfo, AudioError> {
    if input.len()? == 0 {
        return Err(AudioError::Empty);
    }
    // A short upload (a voice command, a test clip) is checked, and copied when it already is
    // 16 kHz mono PCM16, right here: a hop to the blocking pool or a child would cost more.
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
    let folder = output.parent().unwrap_or(output);
    within_room(
        folder,
        keep_free,
        decode(input, output, max_seconds, decoder, ffmpeg),
    )
    .await
}

/// `decode`, stopped once the disk under `folder` has less than `keep_free` free (looked at
/// every second, so decodes running at once overshoot by a second of output each at most); a
/// decode that failed for want of room (a decoder child says ENOSPC only in words) is said so.
async fn within_room(
    folder: &Path,
    keep_free: u64,
    decode: impl std::future::Future<Output = Result<AudioInfo, AudioError>>,
) -> Result<AudioInfo, AudioError> {
    tokio::pin!(decode);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is now
    loop {
        tokio::select! {
            done = &mut decode => {
                if let Err(AudioError::Io(_) | AudioError::Undecodable(_)) = &done {
                    if let Some(no) = crate::job::out_of_room(folder, keep_free) {
                        return Err(AudioError::NoSpace(no));
                    }
                }
                return done;
            }
            _ = tick.tick() => {
                if let Err(no) = crate::job::room_for(folder, 0, keep_free) {
                    tracing::warn!(free_bytes = no.free, min_free_bytes = keep_free, "the temp dir's disk is below limits.min_free_bytes during a decode; stopped");
                    return Err(AudioError::NoSpace(no));
                }
            }
        }
    }
}

/// The decode itself: symphonia (in a child, or here), then ffmpeg for what it cannot read.
async fn decode(
    input: Source,
    output: &Path,
    max_seconds: f64,
    decoder: Option<&Path>,
    ffmpeg: &str,
) -> Result<AudioInfo, AudioError> {
    let decoded = match decoder {
        Some(program) => child::decode_in_child(program, &input, output, max_seconds).await,
        None => {
            let abandoned = AbandonOnDrop::default();
            let stop = std::sync::Arc::clone(&abandoned.0);
            let (inp, out) = (input.clone(), output.to_path_buf());
            tokio::task::spawn_blocking(move || decode_here(&inp, &out, max_seconds, &stop))
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "the audio intake task failed");
                    Err(AudioError::Undecodable(
                        "the decoder failed on this file (it is corrupt or not audio)".into(),
                    ))
                })
        }
    };
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

/// Checks and copies, or decodes with symphonia, in this process (the `decode-audio` child's
/// work, or all of intake's without one). A decoder panic costs this upload only.
fn decode_here(
    input: &Source,
    output: &Path,
    max_seconds: f64,
    abandoned: &std::sync::atomic::AtomicBool,
) -> Result<AudioInfo, AudioError> {
    if let Some(info) = check_and_copy(input, output, max_seconds)? {
        return Ok(info);
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_with_symphonia(input, output, max_seconds, abandoned)
    }))
    .unwrap_or_else(|_| {
        tracing::warn!("the audio decoder panicked on an upload");
        Err(AudioError::Undecodable(
            "the decoder failed on this file (it is corrupt or not audio)".into(),
        ))
    })
}

/// How long a decoding child may go without writing any of its output before it is taken for
/// stuck (a demuxer caught in a loop, as symphonia's Matroska reader on a FLAC track with an
/// empty first metadata block) and killed. Real decoders write every fraction of a second.
const STALL: std::time::Duration = std::time::Duration::from_secs(20);

/// `decode` (a child writing `output`), given up once `output` has not grown for [`STALL`]:
/// the future, and with it the child, is dropped.
async fn unless_stalled<T>(
    output: &Path,
    decode: impl std::future::Future<Output = Result<T, AudioError>>,
) -> Result<T, AudioError> {
    tokio::pin!(decode);
    let size = || std::fs::metadata(output).map_or(0, |m| m.len());
    let (mut last, mut since) = (size(), tokio::time::Instant::now());
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            done = &mut decode => return done,
            _ = tick.tick() => {
                let now = size();
                if now != last {
                    (last, since) = (now, tokio::time::Instant::now());
                } else if since.elapsed() >= STALL {
                    tracing::warn!(stall_s = STALL.as_secs(), "an audio decoder wrote nothing for a while; killed");
                    return Err(AudioError::Undecodable(format!(
                        "the decoder got stuck on this file (no output for {} s)",
                        STALL.as_secs()
                    )));
                }
            }
        }
    }
}

/// How long one decode may take: a minute, and a second more for every 256 KiB of upload (a
/// decoder that takes longer is stuck, or fed a file made to be slow), an hour at most.
pub fn decode_timeout(input_bytes: u64) -> std::time::Duration {
    let seconds = 60 + input_bytes / (256 * 1024);
    std::time::Duration::from_secs(seconds.min(3600))
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
    limits::check_riff_header(input.reader()?)?;
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

/// The path of the normalized audio inside a job folder.
pub fn normalized_path(dir: &Path) -> PathBuf {
    dir.join("audio.wav")
}

#[cfg(test)]
mod tests {
    #[tokio::test(start_paused = true)]
    async fn a_decode_is_stopped_once_the_disk_is_below_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let forever = std::future::pending();
        let started = tokio::time::Instant::now();
        let stopped = super::within_room(dir.path(), u64::MAX / 2, forever).await;
        assert!(
            matches!(stopped, Err(super::AudioError::NoSpace(_))),
            "{stopped:?}"
        );
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(1));
        // With room (the check off), it runs to its end.
        let done = super::within_room(dir.path(), 0, async {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            Err(super::AudioError::Empty)
        })
        .await;
        assert!(matches!(done, Err(super::AudioError::Empty)), "{done:?}");
    }
}
