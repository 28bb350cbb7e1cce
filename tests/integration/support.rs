//! Test support: start the real server on port 0 in a TempDir, talk to it, and wait for things.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use gpuhost::protocol::{ClientEvent, StageStatus};
use gpuhost::{AppState, Config};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

/// The project's original-protocol worker (stdlib only, no SDK).
pub fn original_worker() -> PathBuf {
    fixture("original_worker.py")
}

pub fn python() -> String {
    std::env::var("GPUHOST_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The interpreter behind `python()` as an absolute path: for fixtures run many times a second
/// (a fake `nvidia-smi`), where a launcher shim such as pyenv's would cost 100 ms a call.
pub fn python_exe() -> String {
    static EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        std::process::Command::new(python())
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(python)
    })
    .clone()
}

/// A `[workers.NAME]` table running the fake worker with extra TOML lines.
/// Timeouts default to 20 s and the stop grace to 1 s unless `extra` sets them.
pub fn fake_worker(name: &str, extra: &str) -> String {
    let mut toml = format!(
        "[workers.{name}]\ncommand = [{py:?}, {fake:?}, {name:?}]\n",
        py = python(),
        fake = fixture("fake_worker.py").display().to_string(),
    );
    for (key, value) in [
        ("load_timeout_s", "20"),
        ("task_timeout_s", "20"),
        ("stop_grace_s", "1"),
    ] {
        // `job_timeout_s` is the older name of `task_timeout_s`: setting both is an error.
        let named = |k: &str| extra.lines().any(|l| l.trim_start().starts_with(k));
        let set = named(key) || (key == "task_timeout_s" && named("job_timeout_s"));
        if !set {
            toml.push_str(&format!("{key} = {value}\n"));
        }
    }
    toml.push_str(extra);
    toml.push('\n');
    toml
}

/// Polls `check` until it holds; panics with `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits up to 10 s for `pid` to be gone (exited, or a zombie); panics with `what` otherwise.
pub async fn until_dead(pid: u32, what: &str) {
    wait_for(
        what,
        Duration::from_secs(10),
        || async move { !pid_alive(pid) },
    )
    .await;
}

pub fn pid_alive(pid: u32) -> bool {
    // A zombie still answers kill(0); read its state instead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

pub struct TestHost {
    pub url: String,
    /// The Wyoming server, when the config has `[wyoming] listen`.
    pub wyoming: Option<std::net::SocketAddr>,
    /// The server's own folder; removed when the host is dropped.
    _dir: TempDir,
    pub state: AppState,
    pub token: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), gpuhost::ServeError>>>,
}

impl TestHost {
    /// Starts a server from TOML (`listen` is forced to 127.0.0.1:0; `{DIR}` is the TempDir).
    pub async fn start(toml: &str) -> TestHost {
        let dir = tempfile::tempdir().unwrap();
        let text = toml.replace("{DIR}", &dir.path().display().to_string());
        let mut config = Config::from_toml(&text, dir.path().to_path_buf()).expect("test config");
        config.listen = "127.0.0.1:0".parse().unwrap();
        // Uploads are decoded in a child, as by the `gpuhost` binary (which sets this to itself).
        config.audio.decoder = Some(env!("CARGO_BIN_EXE_gpuhost").into());
        let token = config.token.clone();
        let server = gpuhost::bind(config).await.unwrap();
        let addr = server.local_addr();
        let wyoming = server.wyoming_addr();
        let state = server.state().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        TestHost {
            url: format!("http://{addr}"),
            wyoming,
            _dir: dir,
            state,
            token,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Waits until every resident worker is ready.
    pub async fn ready(self) -> TestHost {
        for status in self.state.supervisor.statuses() {
            let handle = self.state.supervisor.get(&status.name).unwrap();
            handle
                .wait_for_state(|s| {
                    s.mode == gpuhost::config::Mode::Oneshot
                        || s.state == gpuhost::worker::WorkerState::Ready
                })
                .await;
        }
        self
    }

    pub fn client(&self) -> reqwest::Client {
        reqwest::Client::new()
    }

    pub fn post(&self, path_and_query: &str) -> reqwest::RequestBuilder {
        let req = self
            .client()
            .post(format!("{}{}", self.url, path_and_query));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// POSTs `body` to `path_and_query` (with the token) and returns the response.
    pub async fn post_body(
        &self,
        path_and_query: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.post(path_and_query).body(body).send().await.unwrap()
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.client().get(format!("{}{}", self.url, path));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Posts audio to /transcribe and collects every event (asserting the NDJSON framing).
    pub async fn transcribe(&self, query: &str, body: Vec<u8>) -> Vec<ClientEvent> {
        let response = self.post_body(&format!("/transcribe{query}"), body).await;
        assert_eq!(response.status(), 200, "{:?}", response.text().await);
        assert_eq!(response.headers()["content-type"], "application/x-ndjson");
        read_events(response).await
    }

    /// The `/metrics` text (with the token).
    pub async fn metrics(&self) -> String {
        self.get("/metrics")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// GETs `path` (with the token) and returns its JSON body.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.get(path).send().await.unwrap().json().await.unwrap()
    }

    /// The body of `GET path`, as text.
    pub async fn get_text(&self, path: &str) -> String {
        self.get(path).send().await.unwrap().text().await.unwrap()
    }

    pub async fn worker(&self, name: &str) -> serde_json::Value {
        self.get_json("/workers").await["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == name)
            .unwrap()
            .clone()
    }

    /// Stops the server the way `serve` does on SIGTERM and waits for it.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("server stops within 20 s")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub async fn read_events(response: reqwest::Response) -> Vec<ClientEvent> {
    let mut stream = response.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.unwrap());
    }
    let text = String::from_utf8(buf).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "stream must end with a newline: {text:?}"
    );
    let events: Vec<ClientEvent> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    let finals = events.iter().filter(|e| e.is_final()).count();
    assert_eq!(finals, 1, "exactly one final event: {events:?}");
    assert!(
        events.last().unwrap().is_final(),
        "final event last: {events:?}"
    );
    events
}

/// The `result` of a finished job, or a panic showing the events.
pub fn result_of(events: &[ClientEvent]) -> serde_json::Value {
    match events.last() {
        Some(ClientEvent::Result { result }) => result.clone(),
        other => panic!("expected a result, got {other:?}\nall events: {events:#?}"),
    }
}

pub fn error_of(events: &[ClientEvent]) -> (String, String) {
    match events.last() {
        Some(ClientEvent::Error { code, message }) => (code.to_string(), message.clone()),
        other => panic!("expected an error, got {other:?}\nall events: {events:#?}"),
    }
}

/// A WAV file of a 440 Hz tone.
pub fn wav(seconds: f64, rate: u32, channels: u16) -> Vec<u8> {
    let frames = (seconds * f64::from(rate)) as u32;
    let data_len = frames * u32::from(channels) * 2;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * u32::from(channels) * 2).to_le_bytes());
    out.extend_from_slice(&(channels * 2).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for i in 0..frames {
        let v = ((2.0 * std::f64::consts::PI * 440.0 * f64::from(i) / f64::from(rate)).sin()
            * 12000.0) as i16;
        for _ in 0..channels {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The real `gpuhost serve` binary in a TempDir (`{DIR}` in the TOML), listening on port 0.
pub struct Binary {
    pub child: std::process::Child,
    pub url: String,
    pub dir: TempDir,
}

impl Binary {
    /// Starts the binary with `toml` and extra environment; returns once it listens.
    pub fn start(toml: &str, env: &[(&str, &str)]) -> Binary {
        Binary::start_as(toml, env, false)
    }

    /// `start`, with SIGHUP ignored as `nohup` leaves it.
    pub fn start_nohup(toml: &str) -> Binary {
        Binary::start_as(toml, &[], true)
    }

    fn start_as(toml: &str, env: &[(&str, &str)], nohup: bool) -> Binary {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let text = toml.replace("{DIR}", &dir.path().display().to_string());
        let config = dir.path().join("gpuhost.toml");
        std::fs::write(&config, format!("listen = \"127.0.0.1:0\"\n{text}")).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
        command
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("GPUHOST_TOKEN")
            // Its plain `gpuhost listening on` line is read below, whatever the caller exported.
            .env_remove("GPUHOST_LOG_FORMAT")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        if nohup {
            // SAFETY: signal(2) only, between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(url) = line.strip_prefix("gpuhost listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(url) => url,
            Err(_) => {
                // Not left running (with its workers) when the test fails here.
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not announce its address within 20 s");
            }
        };
        Binary { child, url, dir }
    }

    /// Waits until `/health` counts `n` ready workers.
    pub async fn ready_workers(&self, n: u64) {
        let health = format!("{}/health", self.url);
        wait_for("workers ready", Duration::from_secs(20), || {
            let health = health.clone();
            async move {
                match reqwest::get(&health).await {
                    Ok(r) => r
                        .json::<serde_json::Value>()
                        .await
                        .map(|h| h["workers"]["ready"] == n)
                        .unwrap_or(false),
                    Err(_) => false,
                }
            }
        })
        .await;
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) of our own child.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.strip_suffix(".pid")?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Reads events of a streaming response one at a time.
pub struct EventReader {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
}

impl EventReader {
    pub fn new(response: reqwest::Response) -> EventReader {
        assert_eq!(response.status(), 200);
        EventReader {
            stream: response.bytes_stream().boxed(),
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> Option<ClientEvent> {
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = self.stream.next().await?.unwrap();
            self.buf.extend_from_slice(&chunk);
        }
    }

    pub async fn until(&mut self, pred: impl Fn(&ClientEvent) -> bool) -> ClientEvent {
        loop {
            let event = self.next().await.expect("stream ended early");
            if pred(&event) {
                return event;
            }
        }
    }
}

/// A stage began.
pub fn started(e: &ClientEvent) -> bool {
    matches!(
        e,
        ClientEvent::Stage {
            status: StageStatus::Started,
            ..
        }
    )
}

/// Starts a fake job that works `sleep_ms`, waits until its first stage runs, and hangs up.
pub async fn abandon_job(host: &TestHost, sleep_ms: u64) {
    let mut gone = EventReader::new(
        host.post_body(
            &format!("/transcribe?prompt=fake:sleep={sleep_ms}"),
            wav(0.2, 16000, 1),
        )
        .await,
    );
    gone.until(started).await;
    drop(gone);
}

/// An error in OpenAI's shape (`/v1/…`) with `status`: its `error.message`, and the body.
pub async fn openai_error(response: reqwest::Response, status: u16) -> (String, serde_json::Value) {
    assert_eq!(response.status().as_u16(), status);
    let body: serde_json::Value = response.json().await.expect("an OpenAI error is JSON");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message: {body}"))
        .to_string();
    (message, body)
}
