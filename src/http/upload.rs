//! Receives an upload (raw body or multipart field `file`). Every byte of the body, form fields
//! included, counts against the size limit while streaming, and a body that stalls longer than
//! the idle timeout, or arrives slower than the minimum pace, is cut off, so neither a huge nor a
//! trickled upload holds memory, a job folder or a connection slot. Uploads up to `SPILL_BYTES`
//! stay in memory; larger ones go to `spill` as they arrive.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use super::error::ApiError;
use crate::audio::Source;

mod form;
mod parts;
pub(super) use form::{collect_field, text_field, Form, Given};

/// How much of a request body is read, how long a pause in it may be, and how slowly it may
/// arrive.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyLimits {
    pub max_bytes: u64,
    /// Free space a spilled upload leaves on its disk (`limits.min_free_bytes`).
    pub keep_free: u64,
    pub idle: Duration,
    /// Bytes a second the body must average once `idle` has passed; 0: any pace.
    pub min_rate: u64,
}

impl BodyLimits {
    pub(super) fn from_config(config: &crate::Config) -> BodyLimits {
        BodyLimits {
            max_bytes: config.limits.max_upload_bytes,
            keep_free: config.limits.min_free_bytes,
            idle: Duration::from_secs_f64(config.http.body_idle_timeout_s),
            min_rate: config.http.min_body_rate_bytes_per_s,
        }
    }

    /// When a body that started at `started` and has brought `seen` bytes so far is too slow:
    /// `idle` of grace, plus a second for every `min_rate` bytes (`None`: no pace is required).
    fn pace_deadline(&self, started: Instant, seen: u64) -> Option<Instant> {
        (self.min_rate > 0).then(|| {
            started + self.idle + Duration::from_secs_f64(seen as f64 / self.min_rate as f64)
        })
    }
}

/// Why a body was cut off; read after the reader (axum, multer) reports an error.
#[derive(Debug, Clone, Copy)]
enum Cut {
    TooLarge,
    Idle,
    /// The average pace, in bytes a second, when the body was given up.
    Slow(u64),
}

/// Set by the guarded body when it cuts the body off.
#[derive(Debug, Clone, Default)]
pub(super) struct Tripwire(Arc<Mutex<Option<Cut>>>);

impl Tripwire {
    fn trip(&self, cut: Cut) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(cut);
    }

    /// The HTTP error for a body that was cut off, if it was.
    pub(super) fn error(&self, limits: &BodyLimits) -> Option<ApiError> {
        let cut = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        cut.map(|cut| match cut {
            Cut::TooLarge => too_large("the request body", limits.max_bytes),
            Cut::Idle => ApiError::new(
                axum::http::StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body stalled for more than {:.0} s (http.body_idle_timeout_s); send it without pauses",
                    limits.idle.as_secs_f64()
                ),
            ),
            Cut::Slow(pace) => ApiError::new(
                axum::http::StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body arrived at {pace} bytes/s, below the minimum of {} bytes/s (http.min_body_rate_bytes_per_s); send it faster",
                    limits.min_rate
                ),
            ),
        })
    }
}

/// Replaces the body of `request` with one that counts every byte against `limits.max_bytes`,
/// gives up after `limits.idle` without data, and gives up on a body slower than
/// `limits.min_rate` on average.
pub(super) fn guard(request: Request, limits: BodyLimits) -> (Request, Tripwire) {
    let tripwire = Tripwire::default();
    let (parts, body) = request.into_parts();
    let mut data = body.into_data_stream();
    let wire = tripwire.clone();
    let guarded = async_stream::stream! {
        let started = Instant::now();
        let mut seen = 0u64;
        loop {
            let deadline = limits.pace_deadline(started, seen);
            let wait = deadline.map_or(limits.idle, |d| {
                limits.idle.min(d.saturating_duration_since(Instant::now()))
            });
            // `timeout` polls the body before the clock: data already there is never refused.
            match tokio::time::timeout(wait, data.next()).await {
                Ok(Some(Ok(chunk))) => {
                    seen += chunk.len() as u64;
                    if seen > limits.max_bytes {
                        wire.trip(Cut::TooLarge);
                        yield Err(std::io::Error::other("the request body is too large"));
                        break;
                    }
                    yield Ok(chunk);
                }
                Ok(Some(Err(e))) => {
                    yield Err(std::io::Error::other(e.to_string()));
                    break;
                }
                Ok(None) => break,
                Err(_) => {
                    let slow = deadline.is_some_and(|d| Instant::now() >= d);
                    let pace = (seen as f64 / started.elapsed().as_secs_f64()) as u64;
                    wire.trip(if slow { Cut::Slow(pace) } else { Cut::Idle });
                    yield Err(std::io::Error::other("the request body stalled"));
                    break;
                }
            }
        }
    };
    (
        Request::from_parts(parts, Body::from_stream(guarded)),
        tripwire,
    )
}

/// The start of a multipart request that becomes a job (the OpenAI endpoints, `POST /speakers`):
/// refused while the GPU queue is full, a job folder for its file, the body guarded.
pub(super) struct FormIntake {
    dir: tempfile::TempDir,
    pub limits: BodyLimits,
    tripwire: Tripwire,
}

impl FormIntake {
    /// `stages`: what the request's job will run (the whole pipeline for the OpenAI endpoints,
    /// the `[speakers] stage` for an enrolment): its first GPU's queue is the one checked.
    pub(super) fn begin(
        app: &crate::AppState,
        request: Request,
        stages: &[String],
    ) -> Result<(FormIntake, Request), ApiError> {
        crate::job::QueueFull::check(app, Some(stages))
            .map_err(|full| ApiError::queue_full(&full))?;
        refuse_encoded(request.headers())?;
        let limits = BodyLimits::from_config(&app.config);
        // Said before anything is read or made, as for `/transcribe`.
        if declared_length(request.headers()).is_some_and(|n| n > limits.max_bytes) {
            return Err(too_large("the request body", limits.max_bytes));
        }
        let dir = crate::job::job_dir(&app.config).map_err(|e| ApiError::job_folder(&e))?;
        room_for_declared(request.headers(), dir.path(), limits.keep_free)?;
        let (request, tripwire) = guard(request, limits);
        Ok((
            FormIntake {
                dir,
                limits,
                tripwire,
            },
            request,
        ))
    }

    /// Where the form's file goes.
    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// An error while reading the form, as the client sees it: the guard's own when it cut the
    /// body off, and no server paths.
    pub(super) fn failed(&self, e: ApiError) -> ApiError {
        self.tripwire
            .error(&self.limits)
            .unwrap_or(e)
            .redact(self.dir.path())
    }

    /// The job of the form's `file`, its folder with it.
    pub(super) async fn into_job(
        self,
        app: &crate::App,
        file: Source,
        options: crate::pipeline::JobOptions,
        stages: Vec<String>,
    ) -> Result<crate::job::PreparedJob, ApiError> {
        let dir_path = self.dir.path().to_path_buf();
        crate::job::PreparedJob::from_upload(app, self.dir, file, options, stages)
            .await
            .map_err(|e| ApiError::from(e).redact(&dir_path))
    }
}

/// Uploads larger than this are streamed to a file instead of kept in memory.
pub(super) const SPILL_BYTES: usize = 8 * 1024 * 1024;

/// A body declared too big for the free space of the disk it would spill to is refused before
/// it is read (one kept in memory is not looked at).
fn room_for_declared(
    headers: &axum::http::HeaderMap,
    dir: &Path,
    keep_free: u64,
) -> Result<(), ApiError> {
    match declared_length(headers) {
        Some(n) if n > SPILL_BYTES as u64 => {
            crate::job::room_for(dir, n, keep_free).map_err(ApiError::no_space)
        }
        _ => Ok(()),
    }
}

/// A body sent compressed (`Content-Encoding: gzip`) is not undone: refused by name before it is
/// read, not decoded as audio (a gzipped WAV got a 415 about playlists).
fn refuse_encoded(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(axum::http::header::CONTENT_ENCODING) else {
        return Ok(());
    };
    let coding = String::from_utf8_lossy(value.as_bytes())
        .trim()
        .to_ascii_lowercase();
    if coding.is_empty() || coding == "identity" {
        return Ok(());
    }
    let shown: String = coding
        .chars()
        .take(40)
        .flat_map(char::escape_debug)
        .collect();
    Err(ApiError::new(
        axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_audio_format",
        format!(
            "the body is sent with Content-Encoding: {shown}, which gpuhost does not undo: send \
             the file as it is (audio formats are compressed already)"
        ),
    ))
}

/// The body length the request declares (`Content-Length`), if it does.
pub(super) fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Receives the upload; `spill` is where a large one goes (`None`: kept in memory whatever its
/// size, for bodies whose declared length is at most [`SPILL_BYTES`]).
pub(super) async fn receive(
    request: Request,
    spill: Option<&Path>,
    limits: BodyLimits,
) -> Result<Source, ApiError> {
    let (request, tripwire) = guard(request, limits);
    receive_guarded(request, spill, limits)
        .await
        .map_err(|e| tripwire.error(&limits).unwrap_or(e))
}

async fn receive_guarded(
    request: Request,
    spill: Option<&Path>,
    limits: BodyLimits,
) -> Result<Source, ApiError> {
    let limit = limits.max_bytes;
    refuse_encoded(request.headers())?;
    if declared_length(request.headers()).is_some_and(|n| n > limit) {
        return Err(too_large("the request body", limit));
    }
    if let Some(dir) = spill.and_then(Path::parent) {
        room_for_declared(request.headers(), dir, limits.keep_free)?;
    }
    let spill = spill.map(|path| Spill {
        path,
        keep_free: limits.keep_free,
    });
    let is_multipart = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    if !is_multipart {
        let stream = Body::into_data_stream(request.into_body());
        return collect(stream, spill, limit)
            .await
            .map_err(|e| e.into_api(limit));
    }
    let mut form = Form::open(request).await?;
    let mut upload = None;
    while let Some(field) = form.next().await? {
        match field.name() {
            Some("file") if upload.is_none() => {
                upload = Some(
                    collect(field, spill, limit)
                        .await
                        .map_err(|e| e.into_api(limit))?,
                );
            }
            Some("file") => {
                return Err(ApiError::bad_request(
                    "the form has more than one `file`: send one recording per request",
                ))
            }
            // An option sent as a form field would be silently ignored (a `language` among
            // them: English output for another language). Options go in the query string.
            other => {
                let name: String = other.unwrap_or("").chars().take(64).collect();
                return Err(ApiError::bad_request(format!(
                    "the form field `{name}` is not read here: /transcribe takes only `file` from the form, and its options in the query string (/transcribe?language=de&num_speakers=2); /v1/audio/transcriptions takes them as form fields"
                )));
            }
        }
    }
    upload.ok_or_else(|| {
        ApiError::bad_request("the multipart body has no field `file`: send the audio as `file`")
    })
}

fn too_large(what: &str, limit: u64) -> ApiError {
    ApiError::too_large(format!(
        "{what} exceeds the upload limit of {limit} bytes (limits.max_upload_bytes)"
    ))
}

enum WriteError {
    TooLarge,
    Body(String),
    Io(std::io::Error),
    NoSpace(crate::job::NoSpace),
}

impl WriteError {
    fn into_api(self, limit: u64) -> ApiError {
        match self {
            WriteError::TooLarge => too_large("the upload", limit),
            WriteError::Body(e) => ApiError::bad_request(format!("reading the upload failed: {e}")),
            WriteError::NoSpace(no) => ApiError::no_space(no),
            WriteError::Io(e) => ApiError::disk_full(&e)
                .unwrap_or_else(|| ApiError::internal(format!("cannot store the upload: {e}"))),
        }
    }
}

/// Where a large upload goes, and the free space it must leave on that disk.
#[derive(Clone, Copy)]
struct Spill<'a> {
    path: &'a Path,
    keep_free: u64,
}

impl Spill<'_> {
    /// `Err` when `more` bytes written here would leave less than `keep_free` (checked when the
    /// file is made and at every [`SPILL_BYTES`] after, so uploads at once overshoot by one of
    /// those each at most).
    fn room_for(&self, more: u64) -> Result<(), WriteError> {
        let dir = self.path.parent().unwrap_or(self.path);
        crate::job::room_for(dir, more, self.keep_free).map_err(WriteError::NoSpace)
    }
}

async fn collect<S, E>(
    mut stream: S,
    spill: Option<Spill<'_>>,
    limit: u64,
) -> Result<Source, WriteError>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut memory = bytes::BytesMut::new();
    let mut file: Option<tokio::io::BufWriter<tokio::fs::File>> = None;
    let mut size = 0u64;
    // Bytes written to the spill file since its disk's free space was last looked at.
    let mut unchecked = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| WriteError::Body(e.to_string()))?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(WriteError::TooLarge);
        }
        match (file.as_mut(), spill) {
            (Some(f), Some(spill)) => {
                unchecked += chunk.len();
                if unchecked >= SPILL_BYTES {
                    // Whether the next SPILL_BYTES fit (those written are in the free space).
                    spill.room_for(SPILL_BYTES as u64)?;
                    unchecked = 0;
                }
                f.write_all(&chunk).await.map_err(WriteError::Io)?;
            }
            (Some(f), None) => f.write_all(&chunk).await.map_err(WriteError::Io)?,
            (None, Some(spill)) if memory.len() + chunk.len() > SPILL_BYTES => {
                spill.room_for((memory.len() + chunk.len()) as u64)?;
                let f = tokio::fs::File::create(spill.path)
                    .await
                    .map_err(WriteError::Io)?;
                let mut f = tokio::io::BufWriter::with_capacity(1 << 20, f);
                f.write_all(&memory).await.map_err(WriteError::Io)?;
                f.write_all(&chunk).await.map_err(WriteError::Io)?;
                memory.clear();
                file = Some(f);
            }
            (None, _) => memory.extend_from_slice(&chunk),
        }
    }
    match (file, spill) {
        (Some(mut f), Some(spill)) => {
            f.flush().await.map_err(WriteError::Io)?;
            Ok(Source::File(spill.path.to_path_buf()))
        }
        _ => Ok(Source::Memory(memory.freeze())),
    }
}
