//! Wyoming speech-to-text (Home Assistant's voice pipeline): a TCP server speaking the Wyoming
//! protocol, whose requests become jobs in the same GPU queue as every other. Off by default.
//!
//! One connection: `describe` → `info`; `transcribe` (optional `language`) → `audio-start`,
//! `audio-chunk`s of 16-bit PCM, `audio-stop` → `transcript` (or `error`). An `error` ends the
//! connection: Home Assistant reads on until a transcript or the end of the stream, so an
//! error on an open connection left it waiting for minutes.

mod ahead;
mod event;
mod refusal;
mod transcribe;

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::job;
use crate::AppState;
use event::{read_event, write_event, Event, FrameError};
use refusal::Refusal;

/// How long a connection may sit between requests before it is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The most audio bytes one stream may send: what a WAV file's 32-bit sizes hold, less its
/// header.
const WAV_DATA_MAX: u64 = u32::MAX as u64 - 1024;

/// Accepts connections until the host stops (`App::stopping`); open connections are dropped
/// with it.
pub async fn serve(listener: TcpListener, app: AppState) {
    let slots = Arc::new(Semaphore::new(app.config.http.max_connections.max(1)));
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = false;
    loop {
        if std::mem::take(&mut backoff) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::select! {
            _ = app.stopping.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of file descriptors, most likely: give it a moment, do not spin.
                    backoff = true;
                    continue;
                };
                let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                    tracing::warn!(%peer, "wyoming: too many connections; refused");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let app = Arc::clone(&app);
                connections.spawn(async move {
                    if let Err(e) = Connection::new(app, stream).run().await {
                        tracing::info!(%peer, "wyoming connection closed: {e}");
                    }
                    drop(slot);
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Connections see the same signal: a job in flight answers `shutting_down`, the rest
    // close. A moment for those answers, then whatever is left is dropped.
    let _ = tokio::time::timeout(STOP_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.shutdown().await;
}

/// The answer to a request the host's stop cuts off.
const SHUTTING_DOWN: &str = "gpuhost is shutting down; send the audio again once it is back";

/// How long connections get to answer once the host stops.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Audio bytes between two looks at the temp dir's free space (`limits.min_free_bytes`).
const ROOM_EVERY: u64 = 8 << 20;

/// Where a connection stands with its audio.
enum Audio {
    /// Between requests.
    Idle,
    /// Between `audio-start` and `audio-stop`: the samples go to a WAV file in the job folder.
    Receiving {
        dir: tempfile::TempDir,
        path: PathBuf,
        writer: hound::WavWriter<BufWriter<File>>,
        rate: u32,
        channels: u16,
        bytes: u64,
        /// When audio last came (or began): only audio keeps a stream from its idle timeout,
        /// not `ping`s or other events.
        heard: tokio::time::Instant,
    },
}

struct Connection {
    app: AppState,
    reader: BufReader<ahead::ReadSide>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    /// The `language` of the last `transcribe`, for the next audio.
    language: Option<String>,
    audio: Audio,
}

/// What ends a connection.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("idle for too long")]
    Idle,
    #[error("answered with an error: {0}")]
    Answered(String),
}

impl Connection {
    fn new(app: AppState, stream: TcpStream) -> Connection {
        let (reader, writer) = stream.into_split();
        Connection {
            app,
            reader: BufReader::new(ahead::ReadSide::new(reader)),
            writer,
            language: None,
            audio: Audio::Idle,
        }
    }

    async fn run(mut self) -> Result<(), ConnectionError> {
        let result = self.serve().await;
        if let Err(ConnectionError::Answered(_)) = &result {
            self.close_after_error().await;
        }
        result
    }

    async fn serve(&mut self) -> Result<(), ConnectionError> {
        loop {
            let deadline = match self.audio {
                Audio::Idle => tokio::time::Instant::now() + IDLE_TIMEOUT,
                Audio::Receiving { heard, .. } => {
                    heard + Duration::from_secs_f64(self.app.config.http.body_idle_timeout_s)
                }
            };
            let stopping = self.app.stopping.clone();
            let read = tokio::select! {
                read = tokio::time::timeout_at(deadline, read_event(&mut self.reader)) => read,
                () = stopping.cancelled() => {
                    if matches!(self.audio, Audio::Receiving { .. }) {
                        return Err(self.error("shutting_down", SHUTTING_DOWN).await);
                    }
                    return Ok(());
                }
            };
            let event = match read {
                // A stream of audio that stopped coming: the client is told why its
                // transcript will not come (a silent close reads as a server fault).
                Err(_) if matches!(self.audio, Audio::Receiving { .. }) => {
                    self.audio = Audio::Idle;
                    let idle = self.app.config.http.body_idle_timeout_s;
                    let text = format!(
                        "no audio came for {idle} s (http.body_idle_timeout_s) after `audio-start`; the stream was dropped, send it again with `audio-stop` at its end"
                    );
                    return Err(self.error("audio_timeout", &text).await);
                }
                Err(_) => return Err(ConnectionError::Idle),
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(
                    e @ (FrameError::BadHeader(_)
                    | FrameError::TooLarge { .. }
                    | FrameError::HeaderTooLong),
                )) => {
                    return Err(self.error("bad_event", &e.to_string()).await);
                }
                Ok(Err(e)) => return Err(e.into()),
            };
            if let Err(refusal) = self.handle(event).await? {
                self.audio = Audio::Idle;
                return Err(self.error(refusal.code, &refusal.text).await);
            }
        }
    }

    /// After an `error`: the end of the stream tells the client there is no more to wait for,
    /// and what it still sends (the rest of its audio) is read and dropped, so that closing does
    /// not reset the connection before it read the error. Bounded as HTTP's drain of a refused
    /// body is.
    async fn close_after_error(&mut self) {
        use crate::http::{DRAIN_BYTES, DRAIN_FOR};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = self.writer.shutdown().await;
        let mut left = DRAIN_BYTES;
        let mut buf = vec![0u8; 64 * 1024];
        let drain = async {
            while left > 0 && !self.app.stopping.is_cancelled() {
                match self.reader.read(&mut buf).await {
                    Ok(n) if n > 0 => left = left.saturating_sub(n as u64),
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
    }

    /// Writes one event, within `http.send_timeout_s`: a client that reads nothing must not
    /// hold its connection (and its slot, job folder and audio) forever.
    async fn send(&mut self, kind: &str, data: Value) -> std::io::Result<()> {
        let limit = Duration::from_secs_f64(self.app.config.http.send_timeout_s);
        match tokio::time::timeout(limit, write_event(&mut self.writer, kind, data)).await {
            Ok(written) => written,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for http.send_timeout_s",
            )),
        }
    }

    /// `Ok(Err(refusal))`: answered with an `error` event (mostly the client's mistake).
    async fn handle(&mut self, event: Event) -> Result<Result<(), Refusal>, ConnectionError> {
        match event.kind.as_str() {
            "describe" => {
                let info = self.info();
                self.send("info", info).await?;
            }
            "transcribe" => match event.text("language") {
                Ok(language) => self.language = language.map(String::from),
                Err(why) => return Ok(Err(why.into())),
            },
            "audio-start" => return Ok(self.start(&event)),
            "audio-chunk" => {
                if matches!(self.audio, Audio::Idle) {
                    if let Err(refusal) = self.start(&event) {
                        return Ok(Err(refusal));
                    }
                }
                return Ok(self.chunk(&event));
            }
            "audio-stop" => return self.transcribe().await,
            // Wyoming's keep-alive: answered, but no audio (see `Audio::Receiving::heard`).
            "ping" => {
                let text = event.str("text").map(String::from);
                self.send("pong", json!({ "text": text })).await?;
            }
            other => tracing::debug!(event = other, "wyoming: event ignored"),
        }
        Ok(Ok(()))
    }

    fn info(&self) -> Value {
        let attribution = json!({"name": "gpuhost", "url": "https://github.com/gpuhost/gpuhost"});
        let stages = self.stages();
        json!({
            "asr": [{
                "name": "gpuhost",
                "description": "gpuhost speech pipeline (GPU time-shared through one queue)",
                "attribution": attribution,
                "installed": true,
                "version": env!("CARGO_PKG_VERSION"),
                "supports_transcript_streaming": false,
                "models": [{
                    "name": stages.join("+"),
                    "description": format!("stages: {}", stages.join(", ")),
                    "attribution": attribution,
                    "installed": true,
                    "version": env!("CARGO_PKG_VERSION"),
                    "languages": self.app.config.wyoming.languages,
                }],
            }],
        })
    }

    fn stages(&self) -> Vec<String> {
        self.app
            .config
            .wyoming
            .stages(&self.app.config.pipeline.stages)
    }

    fn start(&mut self, event: &Event) -> Result<(), Refusal> {
        let rate = event.u32("rate")?.ok_or("`audio-start` needs `rate`")?;
        let width = event.u32("width")?.unwrap_or(2);
        let channels = event.u32("channels")?.unwrap_or(1);
        if width != 2 {
            return Err(
                format!("audio width {width} is not supported; send 16-bit PCM (width 2)").into(),
            );
        }
        // The same bounds as every upload's declared format.
        crate::audio::check_format(rate, channels as usize, Some(16)).map_err(|e| e.to_string())?;
        let dir =
            job::job_dir(&self.app.config).map_err(|e| Refusal::io("create a job folder", &e))?;
        let path = dir.path().join("wyoming.wav");
        let spec = hound::WavSpec {
            channels: channels as u16,
            sample_rate: rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let writer = hound::WavWriter::create(&path, spec).map_err(Refusal::not_stored)?;
        self.audio = Audio::Receiving {
            dir,
            path,
            writer,
            rate,
            channels: channels as u16,
            bytes: 0,
            heard: tokio::time::Instant::now(),
        };
        Ok(())
    }

    fn chunk(&mut self, event: &Event) -> Result<(), Refusal> {
        let payload = &event.payload;
        let limits = &self.app.config.limits;
        let Audio::Receiving {
            dir,
            writer,
            rate,
            channels,
            bytes,
            heard,
            ..
        } = &mut self.audio
        else {
            return Err("`audio-chunk` before `audio-start`".into());
        };
        if !payload.is_empty() {
            *heard = tokio::time::Instant::now();
        }
        // A chunk says its own format; one that differs from the start's would be read as
        // something else (a job on garbage, answered with an empty transcript).
        for (field, declared, started) in [
            ("rate", event.u32("rate")?, *rate),
            ("width", event.u32("width")?, 2),
            ("channels", event.u32("channels")?, u32::from(*channels)),
        ] {
            if declared.is_some_and(|d| d != started) {
                return Err(format!(
                    "an `audio-chunk` with {field} {} in audio that started with {field} \
                     {started}; keep one format from `audio-start` to `audio-stop`",
                    declared.unwrap_or_default()
                )
                .into());
            }
        }
        // Whole frames only: a stray byte would shift every later sample by half of one.
        let frame = 2 * usize::from(*channels);
        if !payload.len().is_multiple_of(frame) {
            return Err(format!(
                "an `audio-chunk` of {} bytes is not whole frames of {} 16-bit samples ({frame} bytes each)",
                payload.len(),
                channels
            ).into());
        }
        *bytes += payload.len() as u64;
        let seconds = *bytes as f64 / (2.0 * f64::from(*rate) * f64::from(*channels));
        if *bytes > limits.max_upload_bytes || seconds > limits.max_audio_seconds {
            return Err(format!(
                "the audio is over limits.max_audio_seconds ({} s) or limits.max_upload_bytes",
                limits.max_audio_seconds
            )
            .into());
        }
        // A WAV file counts its data in 32 bits: past that the writer's count wraps (and a
        // debug build panics), whatever the limits allow.
        if *bytes > WAV_DATA_MAX {
            return Err(format!(
                "the audio is over the {} GiB a WAV file holds; send it in parts",
                WAV_DATA_MAX >> 30
            )
            .into());
        }
        // Whether the next ROOM_EVERY bytes of audio fit on the disk, asked every ROOM_EVERY
        // bytes (a voice command never gets there).
        if (*bytes - payload.len() as u64) / ROOM_EVERY != *bytes / ROOM_EVERY {
            job::room_for(dir.path(), ROOM_EVERY, limits.min_free_bytes)
                .map_err(|e| Refusal::no_space(&e))?;
        }
        let mut block = writer.get_i16_writer(payload.len() as u32 / 2);
        for pair in payload.chunks_exact(2) {
            block.write_sample(i16::from_le_bytes([pair[0], pair[1]]));
        }
        block.flush().map_err(Refusal::not_stored)
    }

    /// Answers with an `error` event; what it gives back ends the connection.
    pub(super) async fn error(&mut self, code: &str, text: &str) -> ConnectionError {
        match self
            .send("error", json!({"text": text, "code": code}))
            .await
        {
            Ok(()) => ConnectionError::Answered(format!("{code}: {text}")),
            Err(e) => e.into(),
        }
    }
}
