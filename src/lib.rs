//! gpuhost: time-share one GPU between many AI models. `app` builds the HTTP router over a
//! state; `bind` + `Server::run` (or `run`) serve it until the shutdown future resolves.

pub mod arbiter;
pub mod audio;
pub mod config;
pub mod gpu;
pub mod http;
pub mod job;
pub mod metrics;
pub mod pipeline;
pub mod process;
pub mod protocol;
pub mod render;
pub mod serve;
pub mod setup;
pub mod stats;
pub mod supervisor;
pub mod transcript;
pub mod worker;
pub mod wyoming;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use serde_json::Value;

use arbiter::queue::GpuQueue;
use arbiter::Arbiter;
pub use config::Config;
use job::PreparedJob;
use pipeline::Pipeline;
use stats::JobStats;
use supervisor::Supervisor;

/// Shared state of a running host. Everything in it is cheap to read without the GPU lock.
pub struct App {
    pub config: Arc<Config>,
    pub supervisor: Arc<Supervisor>,
    pub pipeline: Pipeline,
    pub queue: Arc<GpuQueue>,
    /// Every grant of the GPU: jobs (through `queue`), services and leases.
    pub arbiter: Arc<Arbiter>,
    pub stats: JobStats,
    /// GPU status snapshot, refreshed in the background; reading it never waits.
    pub gpu: gpu::GpuMonitor,
    pub started: Instant,
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
        let swept = job::sweep_stale(&config.temp_dir());
        if swept > 0 {
            tracing::info!(swept, dir = %config.temp_dir().display(), "removed job folders left by hosts that are gone");
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
        Arc::new(App {
            gpu,
            queue,
            arbiter,
            pipeline: Pipeline::new(Arc::clone(&supervisor), config.pipeline.parallel_groups()),
            supervisor,
            config: Arc::new(config),
            stats: JobStats::default(),
            started: Instant::now(),
        })
    }

    /// The final result of a job: the merged transcript when the pipeline has an ASR stage (the
    /// raw stage results otherwise), plus timings and what the host knows of the audio.
    pub fn finish_result(&self, mut result: Value, job: &PreparedJob) -> Value {
        let transcript = result
            .get("stages")
            .and_then(Value::as_object)
            .and_then(transcript::build);
        if let Some(mut transcript) = transcript.and_then(|t| serde_json::to_value(t).ok()) {
            transcript["duration"] = result["duration"].take();
            transcript["timings"] = result["timings"].take();
            transcript["pipeline_seconds"] = result["pipeline_seconds"].take();
            result = transcript;
        }
        result["audio"] = serde_json::json!({
            "decoder": job.info.decoder,
            "source_rate": job.info.source_rate,
            "source_channels": job.info.source_channels,
        });
        result
    }
}

/// The router over `state`.
pub fn app(state: AppState) -> Router {
    http::router(state)
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
}

/// A host bound to its port, workers starting.
pub struct Server {
    listener: tokio::net::TcpListener,
    /// `[wyoming] listen`, when set.
    wyoming: Option<tokio::net::TcpListener>,
    state: AppState,
}

/// Binds the listen address and starts the workers.
pub async fn bind(config: Config) -> Result<Server, ServeError> {
    let addr = config.listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let wyoming = match config.wyoming.listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
        None => None,
    };
    let state = App::start(config);
    Ok(Server {
        listener,
        wyoming,
        state,
    })
}

impl Server {
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where the Wyoming server listens, when `[wyoming] listen` is set.
    pub fn wyoming_addr(&self) -> Option<SocketAddr> {
        self.wyoming.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then stops every worker (jobs in flight end with an
    /// `error` event) and returns once all of them are gone.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            listener,
            wyoming,
            state,
        } = self;
        tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), "gpuhost listening");
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let wyoming = wyoming.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "wyoming speech-to-text listening");
            }
            tokio::spawn(wyoming::serve(
                listener,
                Arc::clone(&state),
                stop_rx.clone(),
            ))
        });
        let supervisor = Arc::clone(&state.supervisor);
        let arbiter = Arc::clone(&state.arbiter);
        let stopper = tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down: stopping workers");
            let _ = stop_tx.send(true);
            arbiter.stop().await;
            supervisor.stop_all().await;
        });
        let served = serve::serve(
            listener,
            app(Arc::clone(&state)),
            &state.config.http,
            stop_rx.clone(),
        )
        .await;
        // Whether serving ended by shutdown or by an error, no worker may outlive us.
        if !*stop_rx.borrow() {
            stopper.abort();
        }
        let _ = stopper.await;
        if let Some(wyoming) = wyoming {
            wyoming.abort(); // its connections go with it
            let _ = wyoming.await;
        }
        state.arbiter.stop().await;
        state.supervisor.stop_all().await;
        state.gpu.stop();
        served.map_err(ServeError::Serve)
    }
}

/// Binds and serves `config` until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    bind(config).await?.run(shutdown).await
}
