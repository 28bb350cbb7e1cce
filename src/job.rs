//! A transcription job from intake to its final event: audio normalized into its own folder,
//! a place in the GPU queue, the pipeline run, and the stream of `ClientEvent`s to whoever asked.
//! The HTTP handler and the local `gpuhost transcribe` share this path.

use std::path::PathBuf;

use futures_util::FutureExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::arbiter::queue::Turn;
use crate::audio::{self, AudioError, AudioInfo, Source};
use crate::pipeline::JobOptions;
use crate::protocol::{ClientEvent, ErrorCode};
use crate::worker::WorkerState;
use crate::AppState;

mod fields;
mod folders;
mod probe;
mod request;

pub use folders::{
    free_bytes, is_disk_full, job_dir, job_dir_for, out_of_room, redact, room_for, sweep_stale,
    temp_dir_usable, NoSpace, DISK_FULL,
};
pub use probe::TempProbe;
pub use request::{accept_options, options_for_stages_run, select_stages};

/// A request that passed every check and waits for the GPU. Dropping it removes its folder.
pub struct PreparedJob {
    pub dir: tempfile::TempDir,
    pub audio: PathBuf,
    pub info: AudioInfo,
    pub options: JobOptions,
    pub stages: Vec<String>,
    /// Higher goes first among waiters (nothing running is interrupted).
    pub priority: i32,
    pub kind: JobKind,
}

/// What a job asks of its stages.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum JobKind {
    /// Run the pipeline; the `[speakers] stage` also gets the enrolled voiceprints.
    #[default]
    Transcribe,
    /// Make a voiceprint: the `[speakers] stage` alone, from these `[start, end]` spans (all
    /// the speech it finds when `None`).
    Enroll { segments: Option<Vec<[f64; 2]>> },
}

/// The GPU queue is full: come back later.
#[derive(Debug)]
pub struct QueueFull {
    /// A guess at when a place frees up, from recent job durations.
    pub retry_after_s: u64,
    pub max_queue: usize,
}

impl QueueFull {
    /// Before an upload of `stages` is read: full when `limits.max_queue` requests wait. A job
    /// that runs on the CPU goes past them (`Ticket::on_cpu`): only joining the queue, after its
    /// upload, tells whether it has to wait and so counts.
    /// The queue is the first GPU's the job would run on (`job_cores`); `None`: the pipeline's.
    pub fn check(app: &AppState, stages: Option<&[String]>) -> Result<(), QueueFull> {
        let route = route(app, stages.unwrap_or(&app.config.pipeline.stages));
        if route.on_cpu {
            return Ok(());
        }
        if route.first.queue.waiting() >= app.config.limits.max_queue {
            return Err(QueueFull::now(app, &route.first.queue));
        }
        Ok(())
    }

    fn now(app: &AppState, queue: &crate::arbiter::queue::GpuQueue) -> QueueFull {
        let jobs = app.stats.total();
        let mean_s = if jobs == 0 {
            10.0
        } else {
            app.stats
                .busy_micros
                .load(std::sync::atomic::Ordering::Relaxed) as f64
                / 1e6
                / jobs as f64
        };
        let ahead = (queue.waiting() + queue.running()) as f64;
        let slots = app.config.gpu.max_concurrent_jobs.max(1) as f64;
        QueueFull {
            retry_after_s: (mean_s * ahead / slots).ceil().clamp(1.0, 3600.0) as u64,
            max_queue: app.config.limits.max_queue,
        }
    }
}

impl PreparedJob {
    /// Normalizes the upload into `dir`; whatever the upload left in `dir` is deleted afterwards.
    pub async fn from_upload(
        app: &crate::App,
        dir: tempfile::TempDir,
        upload: Source,
        options: JobOptions,
        stages: Vec<String>,
    ) -> Result<PreparedJob, AudioError> {
        let config = &app.config;
        let audio = audio::normalized_path(dir.path());
        let max = config.limits.max_audio_seconds;
        let spilled = matches!(upload, Source::File(_));
        let decode = audio::normalize(
            upload,
            &audio,
            max,
            config.audio.decoder.as_deref(),
            &config.audio.ffmpeg,
            &app.decodes,
            config.limits.min_free_bytes,
        );
        // A shutdown drops the decode (its child is killed with the future) and says so.
        let info = tokio::select! {
            info = decode => info?,
            () = app.stopping.cancelled() => return Err(AudioError::ShuttingDown),
        };
        if spilled || info.decoder == "ffmpeg" {
            // A spilled upload, or the copy made for ffmpeg.
            let _ = std::fs::remove_file(dir.path().join("upload"));
        }
        Ok(PreparedJob {
            dir,
            audio,
            info,
            options,
            stages,
            priority: 0,
            kind: JobKind::Transcribe,
        })
    }
}

/// Spawns the job: it waits in the queue, runs, and sends events until its final one. The
/// receiver dropping (client gone) makes it leave the queue, or skip the stages not yet started.
/// `Err` when `limits.max_queue` requests wait already.
pub fn start_job(
    app: AppState,
    job: PreparedJob,
) -> Result<mpsc::Receiver<ClientEvent>, QueueFull> {
    let Route {
        first,
        others,
        on_cpu,
    } = route(&app, &job.stages);
    let waiter = first
        .queue
        .try_enqueue(
            ticket(&app, &first, &job, on_cpu),
            app.config.limits.max_queue,
        )
        .ok_or_else(|| QueueFull::now(&app, &first.queue))?;
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let events = tx.clone();
        let outcome = std::panic::AssertUnwindSafe(run_job(app, job, waiter, others, events))
            .catch_unwind()
            .await;
        if outcome.is_err() {
            let _ = tx
                .send(ClientEvent::Error {
                    code: ErrorCode::Internal,
                    message: "the job panicked; see the server log".into(),
                })
                .await;
        }
    });
    Ok(rx)
}

/// Waits for `waiter`'s grant, telling the client its place (`queued`) at first and whenever it
/// changes. `None` when the job ends instead: the client went away (dropping the waiter leaves
/// the queue), or gpuhost shuts down (the client is told).
async fn turn(
    waiter: &mut crate::arbiter::queue::Waiter,
    tx: &mpsc::Sender<ClientEvent>,
) -> Option<crate::arbiter::queue::GpuPermit> {
    loop {
        tokio::select! {
            turn = waiter.next() => match turn {
                Turn::Granted(permit) => return Some(permit),
                // Not waited for: a client that does not read must not keep its turn from
                // coming.
                Turn::Waiting { position, waiting_for } => {
                    let _ = tx.try_send(ClientEvent::Queued {
                        position,
                        waiting_for,
                    });
                }
                Turn::Closed => {
                    shutting_down(tx).await;
                    return None;
                }
            },
            _ = tx.closed() => return None,
        }
    }
}

/// A queued job's last event when gpuhost shuts down before its turn came.
async fn shutting_down(tx: &mpsc::Sender<ClientEvent>) {
    let _ = tx
        .send(ClientEvent::Error {
            code: ErrorCode::ShuttingDown,
            message: "gpuhost is shutting down; the job never started: send it again once \
                      gpuhost is back"
                .into(),
        })
        .await;
}

async fn run_job(
    app: AppState,
    job: PreparedJob,
    mut waiter: crate::arbiter::queue::Waiter,
    others: Vec<std::sync::Arc<crate::arbiter::Core>>,
    tx: mpsc::Sender<ClientEvent>,
) {
    let Some(permit) = turn(&mut waiter, &tx).await else {
        return;
    };
    // Its other GPUs' queues too, after the first and in the order of their indices (every job
    // takes them in the same order: no two wait on each other), so a lease or service there is
    // never run beside it.
    let mut pinned = Vec::new();
    for core in others {
        let mut waiter = core
            .queue
            .try_enqueue(ticket(&app, &core, &job, false), usize::MAX)
            .expect("an unbounded queue is never full");
        let Some(permit) = turn(&mut waiter, &tx).await else {
            return;
        };
        pinned.push(permit);
    }
    let started = std::time::Instant::now();
    let extra = fields::stage_fields(&app, &job);
    let input = crate::pipeline::JobInput {
        dir: job.dir.path(),
        audio: &job.audio,
        duration: job.info.seconds,
        options: &job.options,
        stages: &job.stages,
        extra: &extra,
    };
    let (failed, mut failed_early) = tokio::sync::oneshot::channel();
    let (outcome, told) = {
        let run = app.pipeline.run(input, &tx, failed);
        tokio::pin!(run);
        tokio::select! {
            outcome = &mut run => (outcome, false),
            // A stage failed while others still run: the client hears it now; the GPU stays
            // held until they have ended (called off, or their task's time).
            Ok(failure) = &mut failed_early => {
                // Side by side: a client slow to take the event must not stop the stages
                // from ending (and the GPU from being let go).
                let _ = tokio::join!(tx.send(error_event(&failure, &job)), &mut run);
                (Err(failure), true)
            }
        }
    };
    drop(pinned);
    drop(permit);
    app.stats.record(&outcome, started.elapsed());
    if !told {
        let last = match outcome {
            Ok(result) => ClientEvent::Result {
                result: finish_result(result, &job),
            },
            Err(e) => error_event(&e, &job),
        };
        let _ = tx.send(last).await;
    }
    drop(job); // removes the job folder
}

/// The final event of a job that failed, logged (the client's own going away is no failure of
/// the host's).
fn error_event(e: &crate::pipeline::PipelineError, job: &PreparedJob) -> ClientEvent {
    match e.code() {
        ErrorCode::Cancelled => tracing::info!(error = %e, "job cancelled"),
        _ => tracing::warn!(error = %e, "job failed"),
    }
    ClientEvent::Error {
        code: e.code(),
        message: redact(&e.to_string(), job.dir.path()),
    }
}

/// The final result of a job: the merged transcript when the pipeline has an ASR stage (the
/// raw stage results otherwise), plus timings and what the host knows of the audio.
pub fn finish_result(mut result: Value, job: &PreparedJob) -> Value {
    let transcript = result
        .get("stages")
        .and_then(Value::as_object)
        .and_then(crate::transcript::build);
    let transcript = transcript.map(|mut t| {
        if let Some(duration) = result["duration"].as_f64() {
            t.clamp_to(duration);
        }
        t
    });
    if let Some(mut transcript) = transcript.and_then(|t| serde_json::to_value(t).ok()) {
        transcript["duration"] = result["duration"].take();
        transcript["timings"] = result["timings"].take();
        transcript["pipeline_seconds"] = result["pipeline_seconds"].take();
        result = transcript;
    } else if let Some(duration) = result["duration"].as_f64() {
        // No transcript: a diarizer's turns are the result people read (RTTM).
        if let Some(diarizer) = result.pointer_mut("/stages/diarizer") {
            crate::transcript::clamp_diarizer(diarizer, duration);
        }
    }
    result["audio"] = serde_json::json!({
        "decoder": job.info.decoder,
        "source_rate": job.info.source_rate,
        "source_channels": job.info.source_channels,
    });
    result
}

/// A job's ticket on `core`'s queue. Its one-shot stages there load their model for the job:
/// no residents, so their memory is the job's own need (unknown when one's footprint is), and a
/// watched program that loads holds the job back as it does a lease. A job whose stages all
/// run on the CPU (`on_cpu`, from `runs_on_cpu`) takes nothing of the GPU.
fn ticket(
    app: &AppState,
    core: &crate::arbiter::Core,
    job: &PreparedJob,
    on_cpu: bool,
) -> crate::arbiter::queue::Ticket {
    let mut ticket = crate::arbiter::queue::Ticket::job(job.priority);
    if on_cpu {
        ticket.on_cpu = true;
        ticket.label = "speech job on the CPU".into();
        return ticket;
    }
    for stage in &job.stages {
        let Some(status) = app.supervisor.get(stage).map(|w| w.status()) else {
            continue;
        };
        if status.device != core.device || status.mode != crate::config::Mode::Oneshot {
            continue;
        }
        let need = core
            .footprints
            .need(&crate::arbiter::worker_key(stage), status.vram_mib);
        ticket.need_mib = ticket.need_mib.zip(need).map(|(a, b)| a.saturating_add(b));
    }
    ticket
}

/// Where a job of `stages` goes: the GPUs it takes (`job_cores`), the first of which is the queue
/// it waits its turn in and `limits.max_queue` counts it in, and the rest taken after it.
pub struct Route {
    /// Its first GPU's core; `[gpu] device`'s for a job on the CPU (a place among its jobs) or
    /// of no stage. With `app.config.pipeline.stages`: the speech jobs' queue, whose numbers
    /// `/health` gives and whose fullness `/ready` says.
    pub first: std::sync::Arc<crate::arbiter::Core>,
    /// Its other GPUs' cores, by index.
    pub others: Vec<std::sync::Arc<crate::arbiter::Core>>,
    /// Every stage runs on the CPU (`Ticket::on_cpu`): it takes nothing of any GPU, and goes
    /// past jobs waiting for one.
    pub on_cpu: bool,
}

impl Route {
    /// The GPUs the job takes (none on the CPU).
    pub fn gpus(&self) -> impl Iterator<Item = &std::sync::Arc<crate::arbiter::Core>> {
        std::iter::once(&self.first)
            .filter(|_| !self.on_cpu)
            .chain(&self.others)
    }
}

/// Where a job of `stages` goes (see [`Route`]).
pub fn route(app: &AppState, stages: &[String]) -> Route {
    let cores = job_cores(app, stages);
    let on_cpu = !stages.is_empty() && cores.is_empty();
    let mut cores = cores.into_iter();
    Route {
        first: cores
            .next()
            .unwrap_or_else(|| std::sync::Arc::clone(app.arbiter.core())),
        others: cores.collect(),
        on_cpu,
    }
}

/// Whether `stage` runs on a resident that said, when it last loaded, that it runs on the CPU
/// (loaded now, or unloaded or loading again since: its config is the same). A one-shot stage,
/// or a resident that never loaded or is failing, has not said so: it takes its GPU.
fn stage_on_cpu(app: &AppState, stage: &str) -> bool {
    app.supervisor.get(stage).is_some_and(|w| {
        let status = w.status();
        status.mode == crate::config::Mode::Resident
            && matches!(
                status.state,
                WorkerState::Ready
                    | WorkerState::Busy
                    | WorkerState::Unloaded
                    | WorkerState::Starting
            )
            && status.runs_on_cpu()
    })
}

/// The GPUs a job of `stages` takes, by index: each GPU a worker of a stage runs on, the
/// residents on the CPU left out. A job takes no GPU its stages do not use (one whose workers are
/// all pinned to GPU 1 leaves `[gpu] device` to leases and services); none at all when every
/// stage runs on the CPU.
fn job_cores(app: &AppState, stages: &[String]) -> Vec<std::sync::Arc<crate::arbiter::Core>> {
    let main = app.arbiter.core().device;
    let mut devices: Vec<u32> = stages
        .iter()
        .filter(|s| !stage_on_cpu(app, s))
        .map(|s| app.supervisor.get(s).map_or(main, |w| w.device()))
        .collect();
    devices.sort_unstable();
    devices.dedup();
    devices
        .into_iter()
        .filter_map(|d| app.arbiter.core_for(d).cloned())
        .collect()
}
