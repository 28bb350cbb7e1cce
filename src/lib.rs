//! gpuhost: time-share one GPU between many AI models. `app` builds the HTTP router over a
//! state; `bind` + `Server::run` (or `run`) serve it until the shutdown future resolves.

/// `eprintln!` that never panics. `eprintln!` panics when stderr is a closed pipe
/// (`gpuhost lease -- cmd 2>&1 | head -1`): the lease client died holding its lease, its
/// program killed. A line nobody can read is dropped.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

mod app;
pub mod arbiter;
pub mod audio;
pub mod config;
pub mod files;
pub mod gpu;
pub mod http;
pub mod job;
pub mod logwriter;
pub mod metrics;
pub mod pipeline;
pub mod process;
pub mod protocol;
pub mod render;
pub mod serve;
pub mod setup;
pub mod speakers;
pub mod stats;
pub mod supervisor;
pub mod text;
pub mod transcript;
pub mod worker;
pub mod wyoming;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;

pub use app::{App, AppState};
pub use config::Config;

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
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(
        "cannot use the state folder {} (state_dir: measured footprints and voiceprints are \
         kept there): {source}",
        path.display()
    )]
    StateDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
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
    config.check_serving()?;
    let state = config.state_dir();
    state_folder(&state)?;
    // The voices' folder, once made, as the state folder: a voiceprint folder the server
    // cannot read (a `sudo gpuhost serve` before) read as "no voices", and every transcript
    // silently lost its names.
    let voices = state.join("speakers");
    if voices.exists() {
        state_folder(&voices)?;
        std::fs::read_dir(&voices).map_err(|source| ServeError::StateDir {
            path: voices,
            source,
        })?;
    }
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

/// Makes the state folder (owner only: voiceprints are personal data) or says why it cannot
/// be one, before anything is served: found later, an enrolment fails and measured footprints
/// are lost at every restart, with a warning in the log at most.
fn state_folder(path: &std::path::Path) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    let failed = |source| ServeError::StateDir {
        path: path.to_path_buf(),
        source,
    };
    if path.exists() && !path.is_dir() {
        return Err(failed(std::io::Error::other(
            "it exists and is not a folder",
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(failed)?;
    // Writable: a probe file made and removed.
    tempfile::Builder::new()
        .prefix(".gpuhost-probe")
        .tempfile_in(path)
        .map(drop)
        .map_err(failed)
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
        // `state.stopping` is the one stop signal: the listeners, the decodes and the jobs.
        let wyoming = wyoming.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "wyoming speech-to-text listening");
            }
            tokio::spawn(wyoming::serve(listener, Arc::clone(&state)))
        });
        // Orphans adopted as subreaper (`gpuhost serve` only) are killed as they appear.
        let sweeper = process::adopted::is_subreaper().then(|| {
            tokio::spawn(process::adopted::sweep_forever(gpu::procfs::ProcFs::new(
                "/proc",
            )))
        });
        let supervisor = Arc::clone(&state.supervisor);
        let arbiter = Arc::clone(&state.arbiter);
        let stopping = state.stopping.clone();
        let stopper = tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutting down: stopping workers");
            stopping.cancel();
            // Side by side: the stop takes the longest `stop_grace_s`, not their sum.
            tokio::join!(arbiter.stop(), supervisor.stop_all());
        });
        let served = serve::serve(
            listener,
            app(Arc::clone(&state)),
            &state.config.http,
            state.stopping.clone(),
        )
        .await;
        // Whether serving ended by shutdown or by an error, no worker may outlive us.
        if !state.stopping.is_cancelled() {
            stopper.abort();
        }
        let _ = stopper.await;
        if let Some(wyoming) = wyoming {
            wyoming.abort(); // its connections go with it
            let _ = wyoming.await;
        }
        state.stopping.cancel();
        state.arbiter.stop().await;
        state.supervisor.stop_all().await;
        if let Some(sweeper) = sweeper {
            sweeper.abort();
            // The workers' and services' groups are gone; what they left outside them goes now.
            let procfs = gpu::procfs::ProcFs::new("/proc");
            let _ =
                tokio::task::spawn_blocking(move || process::adopted::sweep_before_exit(&procfs))
                    .await;
        }
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
