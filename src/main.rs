//! The `gpuhost` command line: `serve`, `setup`, `run`, `transcribe`, `status`, `lease`,
//! `unload`/`load`/`start`/`stop`, `speakers` (anyhow lives here and in `cli/` only).

mod cli;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gpuhost",
    version,
    about = "Time-share one GPU between many AI models"
)]
struct Args {
    /// Config file (TOML). Without one, ./gpuhost.toml when it exists, else the built-in speech
    /// pipeline.
    #[arg(long, global = true, env = "GPUHOST_CONFIG")]
    config: Option<PathBuf>,
    /// Log format on stderr: `text` (colours only on a terminal) or `json` (one object per line,
    /// for journald, Loki, Kubernetes).
    #[arg(
        long,
        global = true,
        env = "GPUHOST_LOG_FORMAT",
        default_value = "text",
        ignore_case = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API with the configured workers.
    Serve,
    /// Run one task on one worker in oneshot mode and print its result.
    Run {
        /// Worker name from the config.
        worker: String,
        /// Task JSON file (`-` for stdin); `--job` is the older name.
        #[arg(long, alias = "job")]
        task: PathBuf,
    },
    /// Transcribe a file: through a server with --server, else locally, stage after stage.
    Transcribe(cli::transcribe::TranscribeArgs),
    /// Create or refresh worker venvs (all managed workers when none are named).
    Setup {
        /// The workers to set up (names from the config); default: every packaged worker.
        workers: Vec<String>,
        /// Rebuild even when up to date.
        #[arg(long)]
        force: bool,
    },
    /// Show a server's GPU status: decision, VRAM, processes, workers, services, queue.
    Status(cli::status::StatusArgs),
    /// Run a program while holding a GPU lease from a server (`gpuhost lease -- python train.py`).
    Lease(cli::lease::LeaseArgs),
    /// Unload a resident worker on a server (frees its GPU memory; it reloads at the next job).
    Unload(cli::control::ControlArgs),
    /// Load an unloaded worker on a server now.
    Load(cli::control::ControlArgs),
    /// Start an on-demand service on a server (through the GPU queue); progress on stderr.
    Start(cli::control::ControlArgs),
    /// Stop an on-demand service on a server (release call, signal, grace, kill, teardown check).
    Stop(cli::control::ControlArgs),
    /// Enrolled voices on a server: list, add (enrol), delete.
    Speakers(cli::speakers::SpeakersArgs),
    /// The orphan guard, started by a server in place of one that died (the pipe is fd 3).
    #[command(hide = true)]
    OrphanGuard { host: u32 },
    /// Decode one upload into 16 kHz mono WAV (the server runs this in a child process).
    #[command(hide = true)]
    DecodeAudio {
        /// The upload (`-`: stdin).
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        output: PathBuf,
        #[arg(long)]
        max_seconds: f64,
    },
}

/// The variables clap reads for flags. Set but empty (`GPUHOST_CONFIG= gpuhost serve`, an
/// unfilled `Environment=` line) means unset, as the config's own token reading has it; clap
/// would take it as the flag given with no value and refuse the command.
const FLAG_VARS: [&str; 3] = ["GPUHOST_CONFIG", "GPUHOST_TOKEN", "GPUHOST_LOG_FORMAT"];

fn main() -> std::process::ExitCode {
    // Before any thread exists (changing the environment is only sound then).
    for name in FLAG_VARS {
        if std::env::var_os(name).is_some_and(|v| v.is_empty()) {
            std::env::remove_var(name);
        }
    }
    let args = Args::parse();
    // A decoding child of the server: no guard, logging or runtime of its own.
    if let Command::DecodeAudio {
        input,
        output,
        max_seconds,
    } = &args.command
    {
        return gpuhost::audio::child_main(input, output, *max_seconds);
    }
    if let Command::OrphanGuard { host } = &args.command {
        let Err(why) = gpuhost::process::guard::child_main(*host);
        gpuhost::say!("gpuhost: {why}");
        return std::process::ExitCode::from(2);
    }
    // Before any thread exists: the orphan guard is forked, and forking is only safe now.
    if let Err(e) = gpuhost::process::guard::install() {
        gpuhost::say!("gpuhost: warning: cannot start the orphan guard ({e}); worker children may outlive a killed host");
    }
    gpuhost::serve::raise_fd_limit();
    let flush_logs = init_logging(&args);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime");
    let outcome = runtime.block_on(run(args, &flush_logs));
    // Work still on blocking threads (a decode at its next packet, a stuck driver call) gets a
    // few seconds; exit does not wait for it longer.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    // Log lines still queued go out before the final message.
    drop(flush_logs);
    match outcome {
        Ok(code) => code,
        Err(e) => {
            gpuhost::say!("gpuhost: {}", causes(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated as `{:#}` writes them, but a cause that an earlier
/// message already quotes (an OS error in a message that names it) only once.
fn causes(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

async fn run(
    args: Args,
    logs: &gpuhost::logwriter::Flush,
) -> anyhow::Result<std::process::ExitCode> {
    let config = load_config(args.config.as_deref())?;
    // What the server says to the person who started it: plain lines, or under `--log-format
    // json` log events like every other line (a JSON log reader takes every line as JSON).
    let json_logs = matches!(args.log_format, LogFormat::Json);
    let say = |line: &str| match json_logs {
        true => tracing::info!(target: SAY, "{line}"),
        false => gpuhost::say!("{line}"),
    };
    match args.command {
        Command::Serve => {
            // Descendants that leave their worker's process group become ours when orphaned,
            // and are swept (process/adopted.rs) instead of outliving the worker under init.
            if let Err(e) = gpuhost::process::adopted::become_subreaper() {
                tracing::warn!(error = %e, "cannot become a child subreaper; a worker's descendants that leave its process group may outlive it");
            }
            gpuhost::setup::ensure(&config, &say).await?;
            let server = gpuhost::bind(config).await?;
            // After the log lines of the start, which go through the log thread.
            tokio::task::block_in_place(|| logs.now());
            say(&format!(
                "gpuhost listening on http://{}",
                server.local_addr()
            ));
            server.run(shutdown_signal()).await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Run { worker, task } => cli::run::run(&config, &worker, &task).await,
        Command::Transcribe(t) => cli::transcribe::transcribe(config, t).await,
        Command::Status(s) => cli::status::status(&config, s).await,
        Command::Lease(l) => cli::lease::lease(&config, l).await,
        Command::Unload(c) => cli::control::control(&config, cli::control::Action::Unload, c).await,
        Command::Load(c) => cli::control::control(&config, cli::control::Action::Load, c).await,
        Command::Start(c) => cli::control::control(&config, cli::control::Action::Start, c).await,
        Command::Stop(c) => cli::control::control(&config, cli::control::Action::Stop, c).await,
        Command::Speakers(s) => cli::speakers::speakers(&config, s).await,
        // Answered in `main` before anything else starts.
        Command::DecodeAudio { .. } | Command::OrphanGuard { .. } => {
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Setup { workers, force } => {
            gpuhost::setup::setup(&config, &workers, force, &say).await?;
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}

/// The log target of what the server says to the person who started it, as JSON events.
const SAY: &str = "gpuhost::say";
/// Its filter directive: always shown.
const SAY_LEVEL: &str = "gpuhost::say=info";

/// Logs to stderr through [`gpuhost::logwriter`] (a stderr nobody reads must not stop the host);
/// the returned guard writes what is still queued at exit. `GPUHOST_LOG` filters (default
/// `info`; `warn` for `gpuhost transcribe`, whose progress bars would be broken up by log lines,
/// unless `-v`).
fn init_logging(args: &Args) -> gpuhost::logwriter::Flush {
    use std::io::IsTerminal;
    let quiet = matches!(&args.command, Command::Transcribe(t) if !t.verbose());
    // A GPUHOST_LOG that does not parse is said, not dropped without a word.
    if let Ok(given) = std::env::var("GPUHOST_LOG") {
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&given) {
            gpuhost::say!("gpuhost: warning: GPUHOST_LOG={given:?} is not a filter ({e}); using the default (e.g. `info`, `warn,gpuhost=debug`)");
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUHOST_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if quiet {
            // The job's failure (a worker's failed load among them) is the command's own last
            // line; the log need not say it first.
            "warn,gpuhost::job=error,gpuhost::worker::load=off"
        } else {
            "info"
        })
    });
    // What the server says to the person who started it (`say` in `run`, an event under
    // `--log-format json`) passes whatever level the filter sets, as its plain lines do.
    let filter = filter.add_directive(SAY_LEVEL.parse().expect("SAY_LEVEL is a directive"));
    let (writer, flush) = gpuhost::logwriter::non_blocking(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter);
    match args.log_format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    flush
}

fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<gpuhost::Config> {
    let mut config = match path {
        Some(path) => gpuhost::Config::load(path, true).with_context(|| "loading the config")?,
        // GPUHOST_TOKEN is read here too: with no file, what is wrong is in the environment.
        None => gpuhost::Config::load(std::path::Path::new("gpuhost.toml"), false).with_context(
            || "loading the configuration (./gpuhost.toml if it exists, GPUHOST_TOKEN)",
        )?,
    };
    // Uploads are decoded by this very executable, in a child (`gpuhost decode-audio`). The
    // link names the running binary even if its file was replaced since.
    config.audio.decoder = Some(PathBuf::from("/proc/self/exe"));
    Ok(config)
}

/// Resolves on Ctrl-C, SIGTERM or SIGHUP (the terminal it ran in closed: it stops as on
/// SIGTERM, each running job told so, rather than dying on the spot). Started under `nohup`
/// (SIGHUP ignored), it keeps ignoring SIGHUP.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("cannot install the SIGTERM handler");
    let mut hangup = (!hangup_ignored())
        .then(|| signal(SignalKind::hangup()).expect("cannot install the SIGHUP handler"));
    let hung_up = async {
        match &mut hangup {
            Some(hangup) => hangup.recv().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hung_up => {}
    }
}

/// Whether SIGHUP is ignored (as `nohup` leaves it for the program it starts).
fn hangup_ignored() -> bool {
    // SAFETY: sigaction with no new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGHUP, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}
