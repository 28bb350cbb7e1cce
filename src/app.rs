//! The shared state of a running host (`App`): config, workers, the GPU queues and arbiter, the
//! GPU monitor and job counters, and how it starts.

use std::sync::Arc;
use std::time::Instant;

use crate::arbiter::queue::GpuQueue;
use crate::arbiter::{self, Arbiter};
use crate::config::{self, Config};
use crate::gpu;
use crate::job;
use crate::pipeline::Pipeline;
use crate::speakers::{Leftovers, Speakers};
use crate::stats::JobStats;
use crate::supervisor::Supervisor;

/// Shared state of a running host. Everything in it is cheap to read without the GPU lock.
pub struct App {
    pub config: Arc<Config>,
    pub supervisor: Arc<Supervisor>,
    pub pipeline: Pipeline,
    pub queue: Arc<GpuQueue>,
    /// Every grant of the GPU: jobs (through `queue`), services and leases.
    pub arbiter: Arc<Arbiter>,
    pub stats: JobStats,
    /// Enrolled voices (`/speakers`), handed to the diarizer with every job.
    pub speakers: Speakers,
    /// GPU status snapshot, refreshed in the background; reading it never waits.
    pub gpu: gpu::GpuMonitor,
    pub started: Instant,
    /// Refused request bodies being read after their answer (bounded in number).
    pub drains: crate::http::Drains,
    /// Uploads decoded at once (one per CPU): a few small compressed files can expand to hours
    /// of audio, and each decode holds a blocking thread and a core. The rest wait their turn.
    pub decodes: tokio::sync::Semaphore,
    /// Cancelled once the host begins to shut down, its one stop signal: the HTTP and Wyoming
    /// listeners stop accepting, and work that has not reached the queue yet (an upload waiting
    /// for or in its decode) ends with `shutting_down` instead of running out the connections'
    /// grace and being cut off without an answer.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Whether job folders can be made (`/health`, `/ready`), probed at most once a second.
    pub temp_probe: job::TempProbe,
}

pub type AppState = Arc<App>;

impl App {
    /// Starts the workers of `config` (resident ones begin loading at once).
    pub fn start(config: Config) -> AppState {
        App::start_with(config, false)
    }

    /// Like `start`, with every worker in oneshot mode (the local sequential pipeline).
    pub fn start_oneshot(config: Config) -> AppState {
        App::start_with(config, true)
    }

    fn start_with(mut config: Config, force_oneshot: bool) -> AppState {
        for dir in std::iter::once(config.temp_dir()).chain(config.small_temp_dir()) {
            let swept = job::sweep_stale(&dir);
            if swept > 0 {
                tracing::info!(swept, dir = %dir.display(), "removed job folders left by hosts that are gone");
            }
        }
        let keep = config.limits.min_free_bytes;
        if let Err(no) = job::room_for(&config.temp_dir(), 0, keep) {
            tracing::warn!(
                dir = %config.temp_dir().display(),
                "{no}. While it is, spilled uploads and decodes longer than a second are \
                 refused (507); on a disk this small, lower limits.min_free_bytes (0 turns the \
                 check off)"
            );
        }
        let ffmpeg = &config.audio.ffmpeg;
        if !force_oneshot && !ffmpeg.is_empty() && crate::process::find_program(ffmpeg).is_none() {
            tracing::warn!(
                %ffmpeg,
                "[audio] ffmpeg is not found: uploads only ffmpeg decodes (Opus, WebM, AMR, …) \
                 will be refused; install ffmpeg, give its absolute path (a service does not \
                 have the shell's PATH), or set it to \"\" to say it is left out on purpose"
            );
        }
        let supervisor = Arc::new(Supervisor::start(&config, force_oneshot));
        if force_oneshot {
            // A local one-off run has no one to report GPU status to.
            config.gpu.status.backend = config::GpuBackendChoice::None;
        }
        let gpu = gpu::GpuMonitor::start(&config, Arc::clone(&supervisor));
        let history = Arc::new(arbiter::history::History::new(
            std::time::Duration::from_secs_f64(config.arbiter.history_s),
        ));
        let sharing = arbiter::sharing::Sharing {
            mode: config.gpu.share,
            headroom_mib: config.gpu.headroom_mib,
            allow_backfill: config.gpu.allow_backfill,
        };
        // One queue per arbitrated GPU; speech jobs queue on `[gpu] device`'s.
        let queues: Vec<Arc<GpuQueue>> = config
            .arbitrated_devices()
            .into_iter()
            .map(|device| {
                GpuQueue::with_sharing(
                    config.gpu.max_concurrent_jobs,
                    Arc::clone(&history),
                    sharing,
                    device,
                )
            })
            .collect();
        let queue = queues
            .iter()
            .find(|q| q.device == config.gpu.device as u32)
            .cloned()
            .expect("[gpu] device is always arbitrated");
        let arbiter = Arbiter::start(&config, &queues, &queue, Arc::clone(&supervisor), &gpu);
        // A one-shot command may run beside a server on the same state folder: a temporary
        // file there may be the server's write in progress.
        let leftovers = if force_oneshot {
            Leftovers::Stale
        } else {
            Leftovers::All
        };
        let speakers = Speakers::load(config.state_dir().join("speakers"), leftovers);
        if !speakers.is_empty() && !config.pipeline.stages.contains(&config.speakers.stage) {
            tracing::warn!(
                stage = %config.speakers.stage,
                "voices are enrolled, but [speakers] stage is not in the pipeline: nobody will be named after them"
            );
        }
        let temp_probe = job::TempProbe::new(config.temp_dir());
        Arc::new(App {
            speakers,
            gpu,
            queue,
            arbiter,
            pipeline: Pipeline::new(
                Arc::clone(&supervisor),
                config.pipeline.parallel_groups(),
                config.pipeline.needs_map(),
            ),
            supervisor,
            config: Arc::new(config),
            stats: JobStats::default(),
            started: Instant::now(),
            drains: crate::http::Drains::default(),
            decodes: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            ),
            stopping: tokio_util::sync::CancellationToken::new(),
            temp_probe,
        })
    }

    /// The GPU as `/status`, `/metrics` and `/health` say it: the latest sample, and busy
    /// whatever it shows while a grant the sample cannot see yet (a service still loading, a
    /// lease) or a block holds the GPU.
    pub fn gpu_view(&self, workers: &[crate::worker::WorkerStatus]) -> crate::gpu::StatusView {
        let mut view = self.gpu.view(workers);
        if let Some(why) = self.arbiter.busy_reason() {
            view.is_idle = false;
            view.decision = crate::gpu::Decision::Busy;
            view.reason = why;
        }
        view
    }

    /// `/health`'s part of [`App::gpu_view`].
    pub fn gpu_health(&self) -> crate::gpu::GpuHealth {
        let mut health = self.gpu.health();
        if self.arbiter.busy_reason().is_some() {
            health.decision = crate::gpu::Decision::Busy;
        }
        health
    }
}
