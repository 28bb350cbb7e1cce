//! The command line: `gpuhost run`, and `gpuhost transcribe` both locally and through a server.

use std::process::Command;
use std::time::Duration;

use super::support::*;

fn write_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let toml = format!(
        "listen = \"127.0.0.1:0\"\n{extra}\n[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", ""),
        fake_worker("b", "")
    );
    let path = dir.join("gpuhost.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

fn gpuhost() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuhost"))
}

#[test]
fn run_one_job_on_one_worker() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let job = dir.path().join("job.json");
    std::fs::write(&job, r#"{"audio_path": "/x.wav", "prompt": "fake:logs=2"}"#).unwrap();
    let out = gpuhost()
        .args(["run", "b", "--config"])
        .arg(&config)
        .arg("--task")
        .arg(&job)
        .output()
        .unwrap();
    let result = json_stdout(&out);
    assert_eq!(result["worker"], "b");
    assert_eq!(result["audio_path"], "/x.wav");
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"fraction\":1.0"));

    // `--job`: the flag's older name, still taken.
    let bad = gpuhost()
        .args(["run", "nope", "--config"])
        .arg(&config)
        .arg("--job")
        .arg(&job)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no worker `nope`"));
}

#[test]
fn transcribe_locally_runs_every_stage_oneshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let out = gpuhost()
        .args([
            "transcribe",
            "--prompt",
            "Kim Ji-won, 안녕하세요",
            "--config",
        ])
        .arg(&config)
        .arg(fixture("audio/tone.flac"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["stages"]["b"]["earlier"], serde_json::json!(["a"]));
    assert_eq!(
        result["stages"]["a"]["prompt"], "Kim Ji-won, 안녕하세요",
        "--prompt reaches the workers"
    );
    assert!(stderr.contains("✓ a") && stderr.contains("✓ b"), "{stderr}");
    assert!(
        !stderr.contains(" INFO "),
        "progress without interleaved log lines unless -v: {stderr}"
    );
}

#[test]
fn a_local_transcription_whose_worker_cannot_load_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuhost.toml");
    std::fs::write(
        &config,
        format!(
            "[pipeline]\nstages = [\"w\"]\n{}",
            fake_worker("w", "env = { FAKE_EXIT_AT_LOAD = \"4\" }")
        ),
    )
    .unwrap();
    let out = gpuhost()
        .args(["transcribe", "--config"])
        .arg(&config)
        .arg(fixture("audio/tone.flac"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("worker_unavailable"), "{stderr}");
    // Said by the command's last line only (the failed load's log line said it first).
    assert_eq!(stderr.matches("weights missing").count(), 1, "{stderr}");
}

#[test]
fn one_shot_commands_leave_no_detached_child_behind() {
    // The worker's child calls setsid: the worker's group kill misses it. `gpuhost run` and a
    // local `gpuhost transcribe` adopt it once the worker is gone and kill it before they exit.
    let dir = tempfile::tempdir().unwrap();
    let env = format!(
        "env = {{ FAKE_GRANDCHILD = \"session\", FAKE_PID_DIR = {:?} }}",
        dir.path().display().to_string()
    );
    let config = dir.path().join("gpuhost.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n[pipeline]\nstages = [\"w\"]\n{}",
            fake_worker("w", &env)
        ),
    )
    .unwrap();
    let job = dir.path().join("job.json");
    std::fs::write(&job, r#"{"audio_path": "/x.wav"}"#).unwrap();
    let audio = fixture("audio/tone.flac");
    let commands: [&[&std::ffi::OsStr]; 2] = [
        &[
            "run".as_ref(),
            "w".as_ref(),
            "--task".as_ref(),
            job.as_os_str(),
        ],
        &["transcribe".as_ref(), audio.as_os_str()],
    ];
    for args in commands {
        let out = gpuhost()
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let children: Vec<u32> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| {
                let path = e.ok()?.path();
                let pid = path
                    .file_name()?
                    .to_str()?
                    .strip_suffix(".child")?
                    .parse()
                    .ok()?;
                std::fs::remove_file(&path).ok()?;
                Some(pid)
            })
            .collect();
        assert_eq!(children.len(), 1, "{children:?}");
        let alive = pid_alive(children[0]);
        if alive {
            // SAFETY: the test's own stray `sleep`, killed so that it does not outlive the test.
            unsafe { libc::kill(children[0] as i32, libc::SIGKILL) };
        }
        assert!(
            !alive,
            "`gpuhost {:?}` left its worker's detached child running",
            args[0]
        );
    }
}

#[tokio::test]
async fn transcribe_through_a_server() {
    let host = TestHost::start(&format!(
        "token = \"tok\"\n[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", ""),
        fake_worker("b", "")
    ))
    .await
    .ready()
    .await;
    // `gpuhost transcribe --server <host> --token tok --format json`, then `extra`.
    let authorized = |extra: &[&str]| {
        let mut command = gpuhost();
        command
            .args(["transcribe", "--server", &host.url, "--token", "tok"])
            .args(["--format", "json"])
            .args(extra);
        command
    };
    let mut command = authorized(&["--stages", "b"]);
    command.arg(fixture("audio/tone.mp3"));
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let result = json_stdout(&out);
    assert!(result["stages"].get("a").is_none());
    assert_eq!(result["stages"]["b"]["worker"], "b");

    // From a pipe, as `cat x.mp3 | gpuhost transcribe --server … /dev/stdin` sends it.
    let mut command = authorized(&["/dev/stdin"]);
    command.stdin(std::fs::File::open(fixture("audio/tone.mp3")).unwrap());
    let piped = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert_eq!(json_stdout(&piped)["stages"]["b"]["worker"], "b");

    // A text format of stages without the asr is refused, as the server and a local run
    // refuse it (it printed the stages' JSON).
    let url = host.url.clone();
    let no_text = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args(["transcribe", "--server", &url, "--token", "tok"])
            .args(["--stages", "b", "--format", "txt"])
            .arg(fixture("audio/tone.mp3"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!no_text.status.success());
    assert!(no_text.stdout.is_empty());
    let said = String::from_utf8_lossy(&no_text.stderr);
    assert!(said.contains("needs the `asr` stage"), "{said}");

    let url = host.url.clone();
    let denied = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args(["transcribe", "--server", &url])
            .env_remove("GPUHOST_TOKEN")
            .arg(fixture("audio/tone.mp3"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("401"));
    host.stop().await;
}

/// The JSON a successful command printed on stdout.
fn json_stdout(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The server's stderr up to the line announcing its address (then it is stopped).
fn serve_stderr(extra: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuhost.toml");
    std::fs::write(
        &config,
        // An nvidia-smi that is not there: a warning to log, wherever the test runs.
        "listen = \"127.0.0.1:0\"\n[pipeline]\nstages = []\n[workers]\n[gpu.status]\nbackend = \"nvidia-smi\"\nnvidia_smi = \"/nonexistent/nvidia-smi\"\n",
    )
    .unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
    command
        .args(["serve", "--config"])
        .arg(&config)
        .args(extra)
        .env_remove("GPUHOST_TOKEN")
        .env_remove("GPUHOST_LOG_FORMAT")
        .env_remove("GPUHOST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    // Read on a thread: a server that never says where it listens is killed after 20 s, and
    // what it said by then is the answer (its stderr closes with it).
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            // In JSON, the same words are an event's message.
            let done = line.contains("gpuhost listening on ");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap()
}

#[test]
fn logs_are_json_lines_when_asked_and_never_coloured_into_a_pipe() {
    for (extra, env) in [
        (vec!["--log-format", "json"], vec![]),
        (vec![], vec![("GPUHOST_LOG_FORMAT", "json")]),
        // A filter that hides info events still lets the listening line through.
        (vec!["--log-format", "json"], vec![("GPUHOST_LOG", "warn")]),
    ] {
        let lines = serve_stderr(&extra, &env);
        // Every line, the address it listens on too: a JSON log reader takes each as JSON.
        let logs: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect();
        assert!(!logs.is_empty(), "{lines:?}");
        let last = logs.last().unwrap();
        assert!(
            last["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("gpuhost listening on http://")),
            "{last}"
        );
        for log in &logs {
            assert!(
                log["level"].is_string() && log["message"].is_string(),
                "{log}"
            );
            assert!(log["timestamp"].is_string(), "{log}");
        }
    }
    let text = serve_stderr(&[], &[]);
    assert!(text.len() > 1, "{text:?}");
    assert!(
        text.iter().all(|l| !l.contains('\u{1b}')),
        "no ANSI escapes into a pipe: {text:?}"
    );
}

#[tokio::test]
async fn a_client_command_reads_a_lan_servers_config_without_its_token() {
    // The server's config listens on the LAN; its token is in the service's environment file,
    // not in this shell. `gpuhost status --config` was refused ("refusing to listen … without
    // a token"), though it listens nowhere.
    let host = TestHost::start("[pipeline]\nstages = []\n[workers]\n").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuhost.toml");
    std::fs::write(
        &config,
        "listen = \"0.0.0.0:9090\"\n[pipeline]\nstages = []\n",
    )
    .unwrap();
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args(["status", "--server", &url, "--config"])
            .arg(&config)
            .env_remove("GPUHOST_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    host.stop().await;
}

#[test]
fn odd_logging_variables_are_said_or_taken() {
    // GPUHOST_LOG that does not parse was dropped without a word; GPUHOST_LOG_FORMAT=JSON was
    // a usage error for every command.
    let out = gpuhost()
        .args(["status", "--server", "http://127.0.0.1:1"])
        .env("GPUHOST_LOG", "bogus===x")
        .env("GPUHOST_LOG_FORMAT", "JSON")
        .env_remove("GPUHOST_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("GPUHOST_LOG=\"bogus===x\" is not a filter"),
        "{stderr}"
    );
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

#[tokio::test]
async fn gpuhost_status_without_a_gpu_says_so_in_one_line() {
    let host = TestHost::start(
        "[pipeline]\nstages = []\n[workers]\n[gpu.status]\nbackend = \"auto\"\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\nnvidia_smi = \"/nonexistent/nvidia-smi\"\n",
    )
    .await;
    let url = host.url.clone();
    let run = move |verbose: bool| {
        let mut c = gpuhost();
        c.args(["status", "--server", &url]);
        if verbose {
            c.arg("-v");
        }
        c.env_remove("GPUHOST_TOKEN");
        c
    };
    let out = tokio::task::spawn_blocking({
        let run = run.clone();
        move || (run(false).output().unwrap(), run(true).output().unwrap())
    });
    let (plain, verbose) = out.await.unwrap();
    let text = String::from_utf8_lossy(&plain.stdout);
    let first = text.lines().next().unwrap_or("");
    assert!(
        first.starts_with("UNKNOWN  no NVIDIA GPU: NVML library not found, nvidia-smi: configured nvidia_smi /nonexistent/nvidia-smi is not an executable"),
        "{text}"
    );
    assert!(
        !text.contains("libloading"),
        "the probe list only under -v: {text}"
    );
    let text = String::from_utf8_lossy(&verbose.stdout);
    assert!(
        text.contains("backend nvml unavailable: /nonexistent/libnvidia-ml.so.1"),
        "{text}"
    );
    // A reader that went away (`gpuhost status | head -0`) ends it quietly: it panicked with
    // "failed printing to stdout" and exit 101.
    let closed = tokio::task::spawn_blocking(move || {
        let (read, write) = std::io::pipe().unwrap();
        drop(read);
        let mut status = run(false);
        status.stdout(write);
        status.output().unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&closed.stderr);
    assert!(closed.status.success(), "{:?}: {said}", closed.status);
    assert!(!said.contains("panicked"), "{said}");
    host.stop().await;
}

#[test]
fn a_missing_input_or_an_https_server_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let missing = dir.path().join("missing.wav");
    for (args, says) in [
        (
            vec!["transcribe".to_string(), missing.display().to_string()],
            format!(
                "gpuhost: cannot read {}: No such file or directory (os error 2)\n",
                missing.display()
            ),
        ),
        (
            vec!["transcribe".to_string(), dir.path().display().to_string()],
            format!("gpuhost: {} is a folder", dir.path().display()),
        ),
        (
            vec![
                "status".to_string(),
                "--server".to_string(),
                "https://gpu.example".to_string(),
            ],
            "plain http:// only".to_string(),
        ),
    ] {
        let out = gpuhost()
            .arg("--config")
            .arg(&config)
            .args(&args)
            .env_remove("GPUHOST_TOKEN")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&says), "{args:?}: {err}");
        assert_eq!(
            err.matches("os error").count(),
            err.contains("os error") as usize,
            "{err}"
        );
    }

    // Variables set but empty are unset (clap took `GPUHOST_CONFIG=` for `--config` with no
    // value and refused every command).
    let out = gpuhost()
        .arg("transcribe")
        .arg(&missing)
        .env("GPUHOST_CONFIG", "")
        .env("GPUHOST_TOKEN", "")
        .env("GPUHOST_LOG_FORMAT", "")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read"), "{err}");
}

#[test]
fn one_shot_output_to_a_closed_pipe_and_relative_task_paths() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    // A result larger than a pipe's buffer, to a reader that takes 10 bytes and leaves
    // (`| head -c 10`): a quiet end, not a panic.
    let job = dir.path().join("job.json");
    let big = serde_json::json!({"audio_path": "hello16.wav", "prompt": "x".repeat(300_000)});
    std::fs::write(&job, big.to_string()).unwrap();
    let mut child = gpuhost()
        .args(["run", "b", "--config"])
        .arg(&config)
        .arg("--task")
        .arg(&job)
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 10];
    use std::io::Read;
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    // A task's relative `audio_path` is the user's, relative to where the command runs.
    std::fs::write(&job, r#"{"audio_path": "hello16.wav"}"#).unwrap();
    let out = gpuhost()
        .args(["run", "b", "--config"])
        .arg(&config)
        .arg("--task")
        .arg(&job)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let result = json_stdout(&out);
    assert_eq!(
        result["audio_path"],
        dir.path().join("hello16.wav").display().to_string()
    );
}

#[test]
fn a_local_transcription_reads_stdin_and_an_interrupt_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("tmp");
    std::fs::create_dir(&temp).unwrap();
    let config = write_config(
        dir.path(),
        &format!("[limits]\ntemp_dir = {:?}", temp.display().to_string()),
    );
    // `-` is stdin: read into the job folder (the decoder cannot share this process's stdin).
    let mut child = gpuhost()
        .args(["transcribe", "-", "--config"])
        .arg(&config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&wav(0.5, 16000, 1)).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        json_stdout(&out)["stages"]["b"]["duration"]
            .as_f64()
            .unwrap()
            > 0.4
    );
    // Ctrl-C while a stage works: exit 130, the workers stopped, the job folder removed.
    let child = gpuhost()
        .args(["transcribe", "--prompt", "fake:sleep=60000", "--config"])
        .arg(&config)
        .arg(fixture("audio/tone.flac"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let folders = || std::fs::read_dir(&temp).unwrap().count();
    let started = std::time::Instant::now();
    while folders() == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no job folder"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The stage has begun once the folder holds the normalized audio.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(folders(), 0, "the job folder is left: {stderr}");
}

#[tokio::test]
async fn a_stderr_nobody_reads_does_not_stop_the_server() {
    // Log lines go through a queue of their own: written on the runtime, the first write into
    // a full pipe (a paused terminal, a stalled journal) stopped every request, /health too.
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("gpuhost.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[pipeline]\nstages = [\"w\"]\n{}[gpu.status]\nbackend = \"none\"\n",
            fake_worker("w", "")
        ),
    )
    .unwrap();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("GPUHOST_LOG", "debug")
        .env_remove("GPUHOST_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped()) // never read
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_for(
        "the server to be ready",
        Duration::from_secs(30),
        || async {
            let ready = client.get(format!("{base}/ready")).send().await;
            ready.is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    // Far more log lines than a pipe holds (each job logs its worker's 2000 lines).
    for _ in 0..3 {
        let job = client
            .post(format!("{base}/transcribe?prompt=fake:logs=2000"))
            .body(wav(0.2, 16000, 1))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("a job with a stalled stderr");
        assert!(job.text().await.unwrap().contains("\"result\""));
    }
    let health = client
        .get(format!("{base}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("/health with a stalled stderr");
    assert_eq!(health.status(), 200);
    server.start_kill().unwrap();
    let _ = server.wait().await;
}

#[tokio::test]
async fn a_failed_jobs_message_reaches_the_terminal_escaped() {
    // The job's error carries the worker's stderr tail: its last line printed it raw (escape
    // sequences that retitle or clear the terminal).
    let host = TestHost::start(&format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker(
            "w",
            "env = { FAKE_NAME = \"\\u001b]0;pwned\\u0007\\u001b[2J\" }\n"
        )
    ))
    .await
    .ready()
    .await;
    let url = host.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        gpuhost()
            .args(["transcribe", "--server", &url, "--prompt", "fake:crash"])
            .env_remove("GPUHOST_TOKEN")
            .arg(fixture("audio/tone.mp3"))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("worker_crashed"), "{err}");
    assert!(!err.contains('\u{1b}'), "raw escape sequences: {err:?}");
    host.stop().await;
}

#[test]
fn a_lease_whose_release_is_never_answered_ends_all_the_same() {
    // The program ended, the release hung without end (and the command with it).
    let mut server = Command::new(python())
        .arg(fixture("mute_server.py"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.as_mut().unwrap()),
        &mut port,
    )
    .unwrap();
    let mut lease = gpuhost()
        .args(["lease", "--server"])
        .arg(format!("http://127.0.0.1:{}", port.trim()))
        .args(["--", "true"])
        .env_remove("GPUHOST_TOKEN")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = lease.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = lease.kill();
            let _ = server.kill();
            panic!("gpuhost lease still waits for its release after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = server.kill();
    let _ = server.wait();
    let mut said = String::new();
    std::io::Read::read_to_string(lease.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert_eq!(status.code(), Some(0), "the program's status: {said}");
    assert!(said.contains("release failed"), "{said}");
}

#[test]
fn the_hidden_orphan_guard_command_refuses_to_run_by_hand() {
    // Run by hand it read EOF on a missing pipe at once and stopped every process carrying the
    // mark's token (a worker's environment shows it), then exited 0.
    let mut marked = Command::new("sleep")
        .arg("30")
        .env("GPUHOST_GUARD", "sometoken")
        .spawn()
        .unwrap();
    let out = gpuhost()
        .args(["orphan-guard", &std::process::id().to_string()])
        .env("GPUHOST_GUARD_TOKEN", "sometoken")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not by hand"), "{stderr}");
    assert!(
        marked.try_wait().unwrap().is_none(),
        "the marked process was stopped"
    );
    marked.kill().unwrap();
    marked.wait().unwrap();
}
