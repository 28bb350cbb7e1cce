//! `gpuhost lease -- CMD…`: runs any program while holding a GPU lease — waits for the grant
//! (progress on stderr), renews in the background, releases when the program exits (passing its
//! exit status through) and on Ctrl-C. This is how notebooks, training scripts and one-off jobs
//! take their turn with the server's own work.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use futures_util::FutureExt;
use gpuhost::protocol::GrantEvent;
use serde_json::json;

#[derive(clap::Args)]
pub(crate) struct LeaseArgs {
    /// Base URL of the server; default: the config's listen address.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token (default: the config's `token`).
    #[arg(long, env = "GPUHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Memory the program needs (MiB); room is made for it. Unknown: every idle worker on the GPU
    /// unloads.
    #[arg(long = "vram")]
    vram_mib: Option<u64>,
    /// What it is for (shown in /status and /gpu/leases).
    #[arg(long, default_value = "")]
    purpose: String,
    /// Who holds it; default: user@host.
    #[arg(long)]
    holder: Option<String>,
    /// Seconds without a renewal after which the server reclaims the lease (default: the
    /// server's `[arbiter] lease_ttl_s`, 60 s unless configured).
    #[arg(long)]
    ttl: Option<f64>,
    /// Higher goes first among waiters.
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// The program and its arguments (any bytes: a file name need not be UTF-8).
    #[arg(last = true, required = true)]
    command: Vec<std::ffi::OsString>,
}

/// How long the program gets between SIGTERM and SIGKILL when its lease is lost or gpuhost is
/// told to stop.
const LOST_GRACE: Duration = Duration::from_secs(10);
/// How long what the program left running gets between SIGTERM and SIGKILL once it has ended.
const LEFT_GRACE: Duration = Duration::from_secs(2);
/// Exit status when the lease was lost under the program (EX_TEMPFAIL: try again).
const LOST_EXIT: u8 = 75;

/// How far stopping the program has got (a lost lease, or gpuhost told to stop).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stopping {
    No,
    /// SIGTERM sent; SIGKILL at this time.
    Grace(tokio::time::Instant),
    Killed,
}

impl Stopping {
    /// SIGTERM to the program and everything below it, once; SIGKILL follows after LOST_GRACE.
    fn begin(&mut self, program: &gpuhost::process::Foreground, why: &str) {
        gpuhost::say!("gpuhost lease: {why}; stopping the program");
        if *self == Stopping::No {
            program.signal(libc::SIGTERM);
            *self = Stopping::Grace(tokio::time::Instant::now() + LOST_GRACE);
        }
    }

    fn kill_at(self) -> tokio::time::Instant {
        match self {
            Stopping::Grace(at) => at,
            _ => tokio::time::Instant::now(),
        }
    }
}

/// The interpreter a script's `#!` line names, when it is an absolute path that does not exist
/// (exec would fail with "No such file or directory" about a file that is there).
fn missing_interpreter(script: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let interpreter = String::from_utf8_lossy(line)
        .split_whitespace()
        .next()?
        .to_string();
    (interpreter.starts_with('/') && !std::path::Path::new(&interpreter).exists())
        .then_some(interpreter)
}

/// Longest wait for the server to answer a release.
const RELEASE_WITHIN: Duration = Duration::from_secs(10);

/// Longest time between two renewals, whatever the TTL (seconds).
const RENEW_AT_MOST: f64 = 20.0;

pub(crate) async fn lease(config: &gpuhost::Config, args: LeaseArgs) -> anyhow::Result<ExitCode> {
    if let Some(ttl) = args.ttl {
        anyhow::ensure!(
            ttl > 0.0 && ttl <= 1e9,
            "--ttl must be a positive number of seconds, got {ttl}"
        );
    }
    // A program that cannot start is said before the lease is taken (taking it unloads the
    // resident workers for nothing).
    // Exit 127 and 126, as a shell's for a command not found and one that cannot run.
    let program = &args.command[0];
    let found = gpuhost::process::find_program(program);
    if let Some(interpreter) = found.as_deref().and_then(missing_interpreter) {
        gpuhost::say!(
            "gpuhost lease: cannot run `{}`: its interpreter {interpreter} (its #! line) does not exist",
            program.to_string_lossy()
        );
        return Ok(ExitCode::from(126));
    }
    if found.is_none() {
        let shown = program.to_string_lossy();
        let (why, code) = if !shown.contains('/') {
            ("no executable of that name on PATH", 127)
        } else if std::path::Path::new(program).exists() {
            ("it is not an executable file", 126)
        } else {
            ("no such file", 127)
        };
        gpuhost::say!("gpuhost lease: cannot run `{shown}`: {why}");
        return Ok(ExitCode::from(code));
    }
    let remote = super::Remote::new(config, args.server.as_deref(), args.token.as_deref())?;
    let base = remote.base.clone();
    let client = remote.client.clone();
    let authed = |r: reqwest::RequestBuilder| remote.authed(r);
    let holder = args.holder.clone().unwrap_or_else(default_holder);
    let mut body = json!({
        "holder": holder, "purpose": args.purpose, "vram_mib": args.vram_mib,
        "wait": true, "priority": args.priority,
    });
    if let Some(ttl) = args.ttl {
        body["ttl_s"] = json!(ttl);
    }
    // SIGTERM, SIGHUP and SIGINT are ours from the start: one that comes while the lease is
    // being granted must not kill this client with the lease still held (until its TTL). One
    // stream each for the whole run: a Ctrl-C that came while another branch ran was lost with
    // a listener made afresh at every turn.
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let url = base.join("gpu/lease")?;
    // Asking is inside the select too: a server that never answers must not keep a SIGTERM
    // waiting.
    let granted = async {
        let response = remote.send(client.post(url).json(&body)).await?;
        wait_for_grant(response).await
    };
    let (lease_id, ttl_s) = tokio::select! {
        granted = granted => granted?,
        // The request goes with us: the server drops the waiting lease.
        Some(()) = terminate.recv() => return Ok(ExitCode::from(128 + libc::SIGTERM as u8)),
        Some(()) = hangup.recv() => return Ok(ExitCode::from(128 + libc::SIGHUP as u8)),
        Some(()) = interrupt.recv() => return Ok(ExitCode::from(128 + libc::SIGINT as u8)),
    };
    // Bounded: a server that takes the request and never answers must not keep this command
    // (whose program has ended) alive; the lease then expires on the server by itself.
    // `ended`: when the program (and what it left running) was gone. The server then checks
    // the memory on a sample taken after it, not on one that may predate the program's last
    // moments.
    let release = |why: &str, ended: Option<std::time::Instant>| {
        let mut request = authed(client.delete(base.join(&format!("gpu/lease/{lease_id}"))?))
            .timeout(RELEASE_WITHIN);
        if let Some(ended) = ended {
            request = request.header(
                gpuhost::arbiter::leases::PROGRAM_ENDED,
                ended.elapsed().as_millis().to_string(),
            );
        }
        let why = why.to_string();
        anyhow::Ok(async move {
            match request.send().await {
                Ok(r) if r.status().is_success() => {
                    gpuhost::say!("gpuhost lease: lease {lease_id} released{why}")
                }
                Ok(r) => gpuhost::say!("gpuhost lease: release answered {}", r.status()),
                Err(e) => gpuhost::say!(
                    "gpuhost lease: release failed ({:#}); the server reclaims it after {ttl_s} s",
                    anyhow::Error::from(e)
                ),
            }
        })
    };
    // Told to stop between the request and the grant: the program is not started at all.
    let early = [
        (terminate.recv().now_or_never().flatten(), libc::SIGTERM),
        (hangup.recv().now_or_never().flatten(), libc::SIGHUP),
        (interrupt.recv().now_or_never().flatten(), libc::SIGINT),
    ];
    if let Some((_, sig)) = early.iter().find(|(got, _)| got.is_some()) {
        release(" before the program started (told to stop)", None)?.await;
        return Ok(ExitCode::from(128 + *sig as u8));
    }
    // Renew at a third of the TTL, so two missed renewals still keep the lease.
    let renew_url = base.join(&format!("gpu/lease/{lease_id}/renew"))?;
    let renewer = {
        // The TTL the server granted (its default when --ttl was left out), renewed at a third
        // of it but at least every 20 s: a server that restarted (leases live in its memory)
        // answers 404, and the program must not keep a GPU it no longer holds for long.
        let ttl_s = if ttl_s.is_finite() && ttl_s > 0.0 {
            ttl_s.min(1e9)
        } else {
            60.0
        };
        let every = Duration::from_secs_f64((ttl_s / 3.0).min(RENEW_AT_MOST));
        let ttl = Duration::from_secs_f64(ttl_s);
        // Each renewal has its own deadline: a server that takes the connection and never
        // answers must not hold the loop past the TTL check.
        let request = authed(client.post(renew_url)).timeout(every.max(Duration::from_secs(1)));
        // Ends when the server says the lease is gone (404: it expired, someone released it, or
        // the server restarted), or when no renewal got through for a whole TTL (the server is
        // down or unreachable, and reclaims the lease after that long): the GPU is someone
        // else's now.
        tokio::spawn(async move {
            let mut renewed = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(every).await;
                if let Some(r) = request.try_clone() {
                    match r.send().await {
                        Ok(r) if r.status().is_success() => renewed = tokio::time::Instant::now(),
                        Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => return,
                        Ok(r) => gpuhost::say!("gpuhost lease: renewal refused ({})", r.status()),
                        // With its causes: "connection refused", not only "error sending request".
                        Err(e) => gpuhost::say!(
                            "gpuhost lease: renewal failed: {:#}",
                            anyhow::Error::from(e)
                        ),
                    }
                }
                if renewed.elapsed() >= ttl {
                    return;
                }
            }
        })
    };
    // What the program double-forks away comes back to us when its parent exits, to be stopped.
    if let Err(e) = gpuhost::process::adopted::become_subreaper() {
        gpuhost::say!("gpuhost lease: warning: cannot become a child subreaper ({e}); processes the program detaches may outlive it");
    }
    let mut program = match gpuhost::process::spawn_foreground(&args.command) {
        Ok(program) => program,
        Err(e) => {
            // Given back at once: not held (with the residents unloaded for it) until its TTL.
            release(" (the program could not start)", None)?.await;
            gpuhost::say!(
                "gpuhost lease: cannot run `{}`: {e}",
                args.command[0].to_string_lossy()
            );
            return Ok(ExitCode::from(126));
        }
    };
    // Ctrl-C reaches the program too (same process group): wait for it to end, then release.
    // A second one (or a SIGINT sent to gpuhost alone, which the program never saw, twice) stops
    // the program as SIGTERM does. SIGTERM or SIGHUP to gpuhost (a service manager, a closed
    // terminal) is passed on to the program and everything below it, then the lease is released
    // as at a normal end. A lost lease stops the program the same way. Either way SIGKILL
    // follows after LOST_GRACE.
    let mut renewer = renewer;
    let mut lost = false;
    let mut stopping = Stopping::No;
    let mut interrupts = 0;
    let mut reap = tokio::time::interval(Duration::from_secs(1));
    let status = loop {
        tokio::select! {
            status = program.wait() => break status?,
            Some(()) = interrupt.recv() => {
                interrupts += 1;
                if interrupts == 1 {
                    gpuhost::say!("gpuhost lease: interrupted; waiting for the program to exit (interrupt again to stop it)");
                } else {
                    stopping.begin(&program, "interrupted twice");
                }
            }
            Some(()) = terminate.recv() => stopping.begin(&program, "terminated"),
            Some(()) = hangup.recv() => stopping.begin(&program, "hung up"),
            _ = &mut renewer, if !lost => {
                lost = true;
                stopping.begin(&program, &format!("lease {lease_id} is gone (expired, released, or the server is unreachable or restarted)"));
            }
            // What the program detached and that exited since is reaped (no zombies pile up).
            _ = reap.tick() => {
                let _ = tokio::task::spawn_blocking(|| gpuhost::process::adopted::reap(&gpuhost::gpu::procfs::ProcFs::new("/proc"))).await;
            }
            _ = tokio::time::sleep_until(stopping.kill_at()), if matches!(stopping, Stopping::Grace(_)) => {
                program.signal(libc::SIGKILL);
                stopping = Stopping::Killed;
            }
        }
    };
    let left = program.stop_left_behind(LEFT_GRACE).await;
    let ended = std::time::Instant::now();
    if left > 0 {
        gpuhost::say!("gpuhost lease: stopped {left} process(es) the program left running");
    }
    renewer.abort();
    if lost {
        return Ok(ExitCode::from(LOST_EXIT));
    }
    release("", Some(ended))?.await;
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

async fn wait_for_grant(response: reqwest::Response) -> anyhow::Result<(u64, f64)> {
    let mut events = super::grant::GrantEvents::new(response, "gpuhost lease");
    while let Some(event) = events.next().await? {
        match event {
            GrantEvent::Granted { lease_id, ttl_s } => {
                gpuhost::say!("gpuhost lease: granted lease {lease_id} (ttl {ttl_s} s)");
                return Ok((lease_id, ttl_s));
            }
            GrantEvent::Error { code, message } => {
                bail!("the lease was refused ({code}): {}", super::shown(&message))
            }
            _ => {}
        }
    }
    bail!("the server ended the stream without a grant")
}

fn default_holder() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "someone".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{user}@{}", host.trim())
}
