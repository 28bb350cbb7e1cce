//! One hostile request must never take the host down: a regression test for each fault the
//! adversarial probe found (hostile audio headers, unbounded form fields, stalled clients, worker
//! children holding pipes, auth and browser edge cases, leftovers, backpressure).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::*;

/// The pipeline of one fake worker named `asr`: the OpenAI endpoints answer only a pipeline with
/// an ASR stage.
fn asr_stage(extra_top: &str) -> String {
    format!(
        "{extra_top}\n[pipeline]\nstages = [\"asr\"]\n{}",
        fake_worker("asr", "")
    )
}

fn one_stage(extra_top: &str, worker_extra: &str) -> String {
    format!(
        "{extra_top}\n[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", worker_extra)
    )
}

/// A 16-bit PCM WAV header declaring `rate` and `channels`, followed by `data_bytes` of silence.
fn wav_with(rate: u32, channels: u16, data_bytes: u32) -> Vec<u8> {
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36 + data_bytes).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt \x10\0\0\0\x01\0");
    out.extend_from_slice(&channels.to_le_bytes());
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&rate.wrapping_mul(2 * u32::from(channels)).to_le_bytes());
    out.extend_from_slice(&(2 * channels).to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_bytes.to_le_bytes());
    out.resize(out.len() + data_bytes as usize, 0);
    out
}

async fn json_error(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("every error is JSON");
    assert!(body["message"].is_string(), "{body}");
    (status, body)
}

#[tokio::test]
async fn hostile_wav_headers_are_refused_and_the_host_lives_on() {
    let host = TestHost::start(&one_stage("", "")).await.ready().await;
    for (rate, channels) in [
        (u32::MAX - 15, 1),
        (0, 1),
        (1, 1),
        (5_000_000, 1),
        (16_000, 0),
    ] {
        let body = wav_with(rate, channels, 8 * 1024);
        let (status, err) = json_error(host.post_body("/transcribe", body).await).await;
        assert_eq!(status, 415, "rate {rate}: {err}");
        let message = err["message"].as_str().unwrap();
        assert!(
            !message.contains("panicked") && !message.contains(".rs:"),
            "{message}"
        );
        assert!(!message.contains("/tmp"), "no server paths: {message}");
    }
    // Nothing was amplified onto disk, and the next honest job works.
    let result = result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
    assert!(result["stages"]["w"].is_object(), "{result}");
    host.stop().await;
}

/// An MP4/ISO box: its 32-bit size, its type, its body.
fn atom(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = ((8 + body.len()) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(body);
    out
}

/// Files of a few dozen bytes whose headers claim lengths that make symphonia ask for more
/// memory than exists (an exabyte, a petabyte, 64 GiB), which aborts the process that asks.
fn memory_bombs() -> Vec<(&'static str, Vec<u8>)> {
    let ftyp = atom(b"ftyp", b"M4A \0\0\0\0M4A mp42isom");
    // A `hdlr` box with a 64-bit size of 2^60.
    let mut hdlr = 1u32.to_be_bytes().to_vec();
    hdlr.extend_from_slice(b"hdlr");
    hdlr.extend_from_slice(&(1u64 << 60).to_be_bytes());
    hdlr.extend_from_slice(&[0; 8]);
    hdlr.extend_from_slice(b"soun");
    hdlr.extend_from_slice(&[0; 12]);
    hdlr.extend_from_slice(&[b'x'; 16]);
    let mut mp4 = ftyp;
    mp4.extend(atom(b"moov", &atom(b"trak", &atom(b"mdia", &hdlr))));
    // A CAF `kuki` chunk of 2^60 bytes.
    let mut caf = b"caff\0\x01\0\0desc".to_vec();
    caf.extend_from_slice(&32i64.to_be_bytes());
    caf.extend_from_slice(&44100f64.to_be_bytes());
    caf.extend_from_slice(b"lpcm");
    for field in [0u32, 2, 1, 1, 16] {
        caf.extend_from_slice(&field.to_be_bytes());
    }
    caf.extend_from_slice(b"kuki");
    caf.extend_from_slice(&(1i64 << 60).to_be_bytes());
    caf.extend_from_slice(&[0; 32]);
    // An EBML (Matroska) DocType string of 2^50 bytes.
    let vint = |n: u64| {
        let mut v = vec![1u8];
        v.extend_from_slice(&n.to_be_bytes()[1..]);
        v
    };
    let mut mkv = vec![0x1a, 0x45, 0xdf, 0xa3];
    mkv.extend(vint(1 << 52));
    mkv.extend_from_slice(&[0x42, 0x82]);
    mkv.extend(vint(1 << 50));
    mkv.extend_from_slice(b"matroska");
    mkv.extend_from_slice(&[0; 64]);
    // A real M4A whose sample-to-chunk table claims 2^32 - 1 entries.
    let mut m4a = std::fs::read(fixture("audio/tone.m4a")).unwrap();
    let at = m4a.windows(4).position(|w| w == b"stsc").unwrap();
    m4a[at + 8..at + 12].copy_from_slice(&[0xff; 4]);
    vec![("mp4", mp4), ("caf", caf), ("mkv", mkv), ("m4a", m4a)]
}

#[tokio::test]
async fn a_decoder_that_runs_out_of_memory_costs_only_its_upload() {
    // The decoder runs in a child (`gpuhost decode-audio`): were it in this process, the first
    // of these would abort the test binary.
    let host = TestHost::start(&one_stage("", "")).await.ready().await;
    for (name, body) in memory_bombs() {
        let (status, err) = json_error(host.post_body("/transcribe", body).await).await;
        assert_eq!(status, 415, "{name}: {err}");
        assert_eq!(err["error"], "undecodable_audio", "{name}: {err}");
    }
    let result = result_of(&host.transcribe("", wav(0.3, 44100, 2)).await);
    assert_eq!(result["audio"]["decoder"], "symphonia", "{result}");
    host.stop().await;
}

#[tokio::test]
async fn a_decoder_stuck_in_a_loop_is_given_up_after_20_s_without_output() {
    // A Matroska file whose FLAC track's first metadata block is empty (tone.flac remuxed by
    // ffmpeg, 4 bytes changed): symphonia 0.5's Matroska reader loops on it without end. Its
    // child writes nothing and is killed 20 s on; ffmpeg then reads the file.
    let host = TestHost::start(&one_stage("", "")).await.ready().await;
    let body = std::fs::read(fixture("audio/stuck.mkv")).unwrap();
    let started = Instant::now();
    let result = result_of(&host.transcribe("", body).await);
    assert_eq!(result["audio"]["decoder"], "ffmpeg", "{result}");
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "{:?}",
        started.elapsed()
    );
    host.stop().await;
}

/// Processes whose parent is this test process and whose command line holds `word` (tests run
/// side by side: a path of the test's own is the word to look for).
fn own_children_running(word: &str) -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.strip_prefix("PPid:").map(str::trim) == Some(me.as_str()))
                && String::from_utf8_lossy(&cmdline).contains(word)
        })
        .count()
}

#[tokio::test]
async fn an_upload_still_decoding_at_shutdown_is_answered_shutting_down() {
    // The stuck file holds its decoder for 20 s, longer than the connections' grace (2 s): the
    // shutdown ends the decode at once and the client hears why, with no decoder left behind.
    let host = TestHost::start(&one_stage(
        "[http]\nshutdown_grace_s = 2\n[limits]\ntemp_dir = \"{DIR}\"\nsmall_temp_dir = \"\"",
        "",
    ))
    .await
    .ready()
    .await;
    // The decoder writes into this host's job folder: its command line names it.
    let jobs = host.state.config.temp_dir().display().to_string();
    let request = host
        .post("/transcribe")
        .body(std::fs::read(fixture("audio/stuck.mkv")).unwrap());
    let pending = tokio::spawn(request.send());
    wait_for("the upload's decoder", Duration::from_secs(30), || async {
        own_children_running(&jobs) > 0
    })
    .await;
    let asked = Instant::now();
    host.stop().await;
    let response = pending
        .await
        .unwrap()
        .expect("an answer, not a dropped connection");
    let (status, err) = json_error(response).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (503, Some("shutting_down")),
        "{err}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    wait_for(
        "the decoder to be gone",
        Duration::from_secs(10),
        || async { own_children_running(&jobs) == 0 },
    )
    .await;
}

#[tokio::test]
async fn a_form_part_whose_headers_never_end_is_refused_early() {
    let host = TestHost::start(&asr_stage("")).await.ready().await;
    // 8 MiB of one header line: the parser would hold it all and search it again at every chunk.
    let mut body = b"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"".to_vec();
    body.extend(std::iter::repeat_n(b'a', 8 << 20));
    for path in ["/transcribe", "/v1/audio/transcriptions"] {
        let response = host
            .post(path)
            .header("content-type", "multipart/form-data; boundary=XX")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status();
        // JSON either way: the OpenAI endpoints nest it under `error`, as OpenAI does.
        let err: Value = response.json().await.expect("every error is JSON");
        let message = err["message"].as_str().or(err["error"]["message"].as_str());
        assert_eq!(status, 400, "{path}: {err}");
        assert!(
            message.is_some_and(|m| m.contains("16 KiB of headers")),
            "{path}: {err}"
        );
        assert!(
            err.to_string().contains("16 KiB of headers"),
            "{path}: {err}"
        );
    }
    host.stop().await;
}

#[tokio::test]
async fn form_fields_are_bounded() {
    let host = TestHost::start(&asr_stage(
        "[limits]\nmax_upload_bytes = 1000000\nmax_field_bytes = 1024",
    ))
    .await
    .ready()
    .await;
    // An OpenAI `prompt` over the field limit.
    let form = reqwest::multipart::Form::new()
        .text("prompt", "x".repeat(100_000))
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.2, 16000, 1)).file_name("a.wav"),
        );
    let response = host
        .post("/v1/audio/transcriptions")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (message, body) = openai_error(response, 413).await;
    assert!(message.contains("max_field_bytes"), "{body}");
    // A form of thousands of tiny fields (names OpenAI's endpoint accepts) is refused at a
    // few hundred: it had cost time growing with the square of their number.
    let mut form = String::new();
    for i in 0..5000 {
        form += &format!(
            "--b\r\nContent-Disposition: form-data; name=\"chunking_strategy[{i}]\"\r\n\r\n\r\n"
        );
    }
    form += "--b--\r\n";
    let response = host
        .post("/v1/audio/transcriptions")
        .header("content-type", "multipart/form-data; boundary=b")
        .body(form)
        .send()
        .await
        .unwrap();
    let (message, body) = openai_error(response, 400).await;
    assert!(message.contains("more than 256 fields"), "{body}");
    // A field before `file` on /transcribe counts against the upload limit.
    let form = reqwest::multipart::Form::new()
        .text("junk", "y".repeat(2_000_000))
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.2, 16000, 1)).file_name("a.wav"),
        );
    let response = host
        .post("/transcribe")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (status, err) = json_error(response).await;
    assert_eq!(status, 413, "{err}");
    // A `prompt` query over the limit.
    let long = "p".repeat(2000);
    let (status, _) = json_error(
        host.post_body(&format!("/transcribe?prompt={long}"), wav(0.2, 16000, 1))
            .await,
    )
    .await;
    assert_eq!(status, 413);
    host.stop().await;
}

/// Reads until the server closes the connection; returns what it sent and how long it took.
fn read_until_closed(mut tcp: TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    tcp.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got);
    (String::from_utf8_lossy(&got).to_string(), started.elapsed())
}

#[tokio::test]
async fn stalled_clients_are_cut_off() {
    let host = TestHost::start(&one_stage(
        "[http]\nheader_timeout_s = 0.5\nbody_idle_timeout_s = 0.5\nmax_connections = 4",
        "",
    ))
    .await
    .ready()
    .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let (closed, took) = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            // An idle socket, and one trickling its headers, both closed by the header timeout.
            let idle = TcpStream::connect(&addr).unwrap();
            let mut trickle = TcpStream::connect(&addr).unwrap();
            trickle.write_all(b"GET /health HTTP/1.1\r\nHo").unwrap();
            let a = read_until_closed(idle, Duration::from_secs(10));
            let b = read_until_closed(trickle, Duration::from_secs(10));
            (a.0 + &b.0, a.1.max(b.1))
        }
    })
    .await
    .unwrap();
    assert!(closed.is_empty(), "{closed}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A body that stops mid-way gets a 408 and its job folder goes.
    let (reply, _) = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(&addr).unwrap();
        tcp.write_all(
            b"POST /transcribe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nRIFF",
        )
        .unwrap();
        read_until_closed(tcp, Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    // Stalled for body_idle_timeout_s, or (a busy machine read its 4 bytes a little late) under
    // the minimum pace, whose deadline then comes first: both say which setting cut it off.
    assert!(
        reply.contains("body_idle_timeout_s") || reply.contains("min_body_rate_bytes_per_s"),
        "{reply}"
    );

    // More idle sockets than the connection cap: the server still answers once they time out.
    let hold: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(host.url.trim_start_matches("http://")).unwrap())
        .collect();
    let health = tokio::time::timeout(Duration::from_secs(10), host.get("/health").send())
        .await
        .expect("health answers while idle sockets exceed the cap")
        .unwrap();
    assert_eq!(health.status(), 200);
    drop(hold);
    host.stop().await;
}

#[tokio::test]
async fn sigterm_exits_despite_a_half_sent_request() {
    let binary = Binary::start(
        &format!(
            "[http]\nheader_timeout_s = 60\nbody_idle_timeout_s = 60\nshutdown_grace_s = 1\n{}",
            one_stage("", "")
        ),
        &[],
    );
    binary.ready_workers(1).await;
    let addr = binary.url.trim_start_matches("http://").to_string();
    let mut tcp = TcpStream::connect(&addr).unwrap();
    tcp.write_all(
        b"POST /transcribe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nRIFF",
    )
    .unwrap();
    // The request is in the handler, waiting for the rest of its body.
    std::thread::sleep(Duration::from_millis(300));
    binary.signal(libc::SIGTERM);
    let started = Instant::now();
    let mut binary = binary;
    let status = tokio::task::spawn_blocking(move || {
        let status = binary.child.wait();
        (status, binary)
    })
    .await
    .unwrap()
    .0
    .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    drop(tcp);
}

#[tokio::test]
async fn a_crash_is_noticed_while_a_worker_child_holds_stdout() {
    let pids = tempfile::tempdir().unwrap();
    let env = format!(
        "env = {{ FAKE_GRANDCHILD = \"1\", FAKE_PID_DIR = {:?} }}",
        pids.path().display().to_string()
    );
    let host = TestHost::start(&one_stage("", &env)).await.ready().await;
    let started = Instant::now();
    let events = host
        .transcribe("?prompt=fake:crash", wav(0.3, 16000, 1))
        .await;
    let (code, _) = error_of(&events);
    assert_eq!(code, "worker_crashed");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "noticed after {:?} (job timeout 20 s)",
        started.elapsed()
    );
    // The next job works on the restarted worker.
    let result = result_of(&host.transcribe("", wav(0.3, 16000, 1)).await);
    assert!(result["stages"]["w"].is_object());
    host.stop().await;
}

fn child_pids(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".child")?
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::test]
async fn host_sigkill_takes_the_workers_own_children() {
    let binary = Binary::start(
        &one_stage(
            "",
            "env = { FAKE_GRANDCHILD = \"1\", FAKE_PID_DIR = \"{DIR}\" }",
        ),
        &[],
    );
    binary.ready_workers(1).await;
    let children = child_pids(binary.dir.path());
    assert_eq!(children.len(), 1, "{children:?}");
    assert!(pid_alive(children[0]));
    binary.signal(libc::SIGKILL);
    wait_for(
        "the worker's child to go with the host",
        Duration::from_secs(5),
        || {
            let alive = pid_alive(children[0]);
            async move { !alive }
        },
    )
    .await;
}

#[tokio::test]
async fn token_from_the_environment_is_trimmed_never_empty_and_never_inherited() {
    let worker = format!(
        "[pipeline]\nstages = [\"w\"]\n[workers.w]\ncommand = [\"sh\", \"-c\", \"env > {{DIR}}/worker.env; exec {} {} w\"]\n",
        python(),
        fixture("fake_worker.py").display()
    );
    // An empty GPUHOST_TOKEN leaves the config's token in force.
    let binary = Binary::start(
        &format!("token = \"from-config\"\n{worker}"),
        &[("GPUHOST_TOKEN", "")],
    );
    let status = format!("{}/status", binary.url);
    assert_eq!(reqwest::get(&status).await.unwrap().status(), 401);
    drop(binary);
    // A token with a trailing newline (a secrets file) matches without it; workers never see it.
    let binary = Binary::start(&worker, &[("GPUHOST_TOKEN", " s3cret-token\n")]);
    binary.ready_workers(1).await;
    let client = reqwest::Client::new();
    let status = format!("{}/status", binary.url);
    let ok = client
        .get(&status)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let env = std::fs::read_to_string(binary.dir.path().join("worker.env")).unwrap();
    assert!(env.contains("GPUHOST_WORKER=w"), "{env}");
    assert!(
        !env.contains("GPUHOST_TOKEN") && !env.contains("s3cret"),
        "{env}"
    );
}

#[tokio::test]
async fn browsers_cannot_rebind_or_post_cross_site() {
    let host = TestHost::start(&one_stage("", "")).await.ready().await;
    let client = reqwest::Client::new();
    let evil = client
        .get(format!("{}/workers", host.url))
        .header("host", "evil.example:9090")
        .send()
        .await
        .unwrap();
    let (status, err) = json_error(evil).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (403, Some("host_not_allowed"))
    );
    let local = client
        .get(format!("{}/workers", host.url))
        .header("host", "localhost:9090")
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 200);
    for (name, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "https://evil.example"),
    ] {
        let post = host
            .post("/transcribe")
            .header("content-type", "text/plain")
            .header(name, value)
            .body(wav(0.2, 16000, 1))
            .send()
            .await
            .unwrap();
        let (status, err) = json_error(post).await;
        assert_eq!(
            (status, err["error"].as_str()),
            (403, Some("cross_site_request")),
            "{name}"
        );
    }
    assert_eq!(host.state.stats.total(), 0, "no job ran");
    host.stop().await;
}

#[tokio::test]
async fn leftovers_are_swept_and_paths_stay_private() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("jobs");
    std::fs::create_dir(&temp).unwrap();
    let dead = temp.join("gpuhost-job-2147483646-abc");
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join("audio.wav"), b"old").unwrap();
    let host = TestHost::start(&one_stage(
        &format!("[limits]\ntemp_dir = {:?}", temp.display().to_string()),
        "",
    ))
    .await
    .ready()
    .await;
    assert!(!dead.exists(), "a dead host's job folder is swept at start");
    // A worker error naming a file in the job folder reaches the client without the path.
    let events = host
        .transcribe("?prompt=fake:noresult", wav(0.2, 16000, 1))
        .await;
    let (code, message) = error_of(&events);
    assert_eq!(code, "bad_output");
    assert!(
        message.contains("<job>") && !message.contains(&temp.display().to_string()),
        "{message}"
    );
    // A NUL byte in a header gets JSON like every other error.
    let addr = host.url.trim_start_matches("http://").to_string();
    let reply = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: a\0b\r\n\r\n")
            .unwrap();
        read_until_closed(tcp, Duration::from_secs(5)).0
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let body: Value = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"], "malformed_request");
    // An unusable temp dir shows on /health and /ready.
    std::fs::remove_dir_all(&temp).unwrap();
    std::fs::write(&temp, b"now a file").unwrap();
    // (Probed at most once a second; the answer names the setting, not the server's path.)
    for probe in ["/health", "/ready"] {
        let url = format!("{}{probe}", host.url);
        wait_for(probe, Duration::from_secs(5), || async {
            reqwest::get(&url).await.unwrap().status() == 503
        })
        .await;
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        assert!(
            text.contains("temp dir (limits.temp_dir)"),
            "{probe}: {text}"
        );
        let temp_name = temp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!text.contains(&temp_name), "{probe}: {text}");
    }
    // Not on /live: a restart would not mend it, and would kill the running jobs.
    assert_eq!(host.get("/live").send().await.unwrap().status(), 200);
    host.stop().await;
}

#[tokio::test]
async fn a_full_queue_answers_429_and_ready_says_why() {
    let host = TestHost::start(&one_stage(
        "[limits]\nmax_queue = 1",
        "env = { FAKE_LOAD_MS = \"600\" }",
    ))
    .await;
    // Loading: not ready, with the reason.
    let r = reqwest::get(format!("{}/ready", host.url)).await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("worker w is loading"));
    let host = host.ready().await;
    assert_eq!(
        reqwest::get(format!("{}/ready", host.url))
            .await
            .unwrap()
            .status(),
        200
    );
    // One job runs, one waits: the third is refused.
    let running = EventReader::new(
        host.post_body("/transcribe?prompt=fake:sleep=3000", wav(0.2, 16000, 1))
            .await,
    );
    let waiting = EventReader::new(host.post_body("/transcribe", wav(0.2, 16000, 1)).await);
    wait_for("one job waiting", Duration::from_secs(10), || {
        let waiting = host.state.queue.waiting();
        async move { waiting == 1 }
    })
    .await;
    let refused = host.post_body("/transcribe", wav(0.2, 16000, 1)).await;
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3600).contains(&retry));
    let (_, err) = json_error(refused).await;
    assert_eq!(err["error"], "queue_full");
    let r = reqwest::get(format!("{}/ready", host.url)).await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("queue is full"));
    drop((running, waiting));
    host.stop().await;
}

#[tokio::test]
async fn small_normalized_uploads_get_their_folder_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (disk, small) = (dir.path().join("disk"), dir.path().join("small"));
    std::fs::create_dir(&disk).unwrap();
    std::fs::create_dir(&small).unwrap();
    let host = TestHost::start(&one_stage(
        &format!(
            "[limits]\ntemp_dir = {:?}\nsmall_temp_dir = {:?}",
            disk.display().to_string(),
            small.display().to_string()
        ),
        "",
    ))
    .await
    .ready()
    .await;
    let folder = |events: Vec<gpuhost::protocol::ClientEvent>| {
        let audio = result_of(&events)["stages"]["w"]["audio_path"]
            .as_str()
            .unwrap()
            .to_string();
        std::path::PathBuf::from(audio)
    };
    // Two seconds of 16 kHz mono PCM16: copied as it is, into the small folder.
    let job = host.transcribe("", wav(2.0, 16000, 1)).await;
    assert!(folder(job).starts_with(&small));
    // Decoding (44.1 kHz) or more than 256 KiB (10 s): on disk.
    let job = host.transcribe("", wav(2.0, 44100, 1)).await;
    assert!(folder(job).starts_with(&disk));
    let job = host.transcribe("", wav(10.0, 16000, 1)).await;
    assert!(folder(job).starts_with(&disk));
    // A small folder that cannot be used: on disk as well, and the job works.
    std::fs::remove_dir_all(&small).unwrap();
    std::fs::write(&small, b"now a file").unwrap();
    let job = host.transcribe("", wav(2.0, 16000, 1)).await;
    assert!(folder(job).starts_with(&disk));
    // Every job's folder is gone once it is answered.
    wait_for("job folders removed", Duration::from_secs(5), || async {
        std::fs::read_dir(&disk).unwrap().next().is_none()
    })
    .await;
    host.stop().await;
}

#[tokio::test]
async fn a_request_refused_before_its_upload_is_read_still_gets_its_error() {
    // A client that sends its whole body before reading (Python's urllib, most scripts) must read
    // the refusal, not a broken pipe, whoever refused it: a handler on the query alone, the token
    // check, the router.
    let host = TestHost::start(&one_stage("token = \"s3cret\"", ""))
        .await
        .ready()
        .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let cases = [
        (
            "/transcribe?num_speakers=0",
            "s3cret",
            "400",
            "speaker counts must be at least 1",
        ),
        ("/transcribe", "wrong", "401", "\"unauthorized\""),
        (
            "/v1/audio/transcriptions",
            "wrong",
            "401",
            "\"unauthorized\"",
        ),
        (
            "/no-such-route",
            "s3cret",
            "404",
            "no route for /no-such-route",
        ),
    ];
    // A host that answers without reading closes the connection with the body unread: the
    // kernel resets it, and the rest of these 4 MiB meets a broken pipe.
    for (path, token, status, says) in cases {
        let answer = send_all_then_read(&addr, path, token, wav_with(16_000, 1, 4 << 20)).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{path}: {answer}"
        );
        assert!(answer.contains(says), "{path}: {answer}");
    }
    host.stop().await;
}

#[tokio::test]
async fn a_refusal_is_answered_at_once_even_while_its_body_trickles_in() {
    // No token needed to send a body slowly: the answer must not wait for it (the rest is read
    // after the answer, bounded), or a few such sockets would hold the server's slots.
    let host = TestHost::start(&one_stage("token = \"s3cret\"", ""))
        .await
        .ready()
        .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = "POST /transcribe HTTP/1.1\r\nHost: localhost\r\n\
                    Authorization: Bearer wrong\r\nContent-Length: 1000000\r\n\r\nRIFF";
        tcp.write_all(head.as_bytes()).unwrap();
        let mut answer = [0u8; 12];
        tcp.read_exact(&mut answer)
            .expect("no answer while the body was still coming");
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap();
    assert_eq!(answer, "HTTP/1.1 401");
    host.stop().await;
}

#[tokio::test]
async fn a_form_refused_mid_body_gets_its_error_with_or_without_100_continue() {
    // A prompt over limits.max_field_bytes, then a 4 MiB file the host never reads: a 413 both
    // for a client that sends everything first and for one that waited for `100 Continue`.
    let host = TestHost::start(&asr_stage("")).await.ready().await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let boundary = "XyZ";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n{}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\n",
        "p".repeat(9000)
    )
    .into_bytes();
    body.extend(wav_with(16_000, 1, 4 << 20));
    body.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    for expect in [false, true] {
        let head = format!(
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: multipart/form-data; boundary={boundary}\r\n{}Content-Length: {}\r\n\r\n",
            if expect { "Expect: 100-continue\r\n" } else { "" },
            body.len()
        );
        let answer = send_then_read(&addr, head, body.clone(), expect).await;
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "expect {expect}: {answer}"
        );
        assert!(
            answer.contains("max_field_bytes"),
            "expect {expect}: {answer}"
        );
    }
    host.stop().await;
}

/// Writes a POST with all of `body` before reading anything, then reads the whole answer.
async fn send_all_then_read(addr: &str, path: &str, token: &str, body: Vec<u8>) -> String {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Authorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    send_then_read(addr, head, body, false).await
}

/// Writes `head`, waits for `100 Continue` when `expect`, writes all of `body` without reading,
/// then reads the whole answer.
async fn send_then_read(addr: &str, head: String, body: Vec<u8>, expect: bool) -> String {
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        tcp.write_all(head.as_bytes()).unwrap();
        if expect {
            let mut interim = [0u8; 25];
            tcp.read_exact(&mut interim).unwrap();
            assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        // Written in pieces, as a client does, while the host has already decided.
        for piece in body.chunks(64 * 1024) {
            tcp.write_all(piece)
                .expect("the host hung up while the body was being sent");
        }
        let mut answer = String::new();
        let _ = tcp.read_to_string(&mut answer);
        answer
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn job_folders_are_their_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (jobs, small) = (dir.path().join("jobs"), dir.path().join("small"));
    let host = TestHost::start(&one_stage(
        &format!(
            "[limits]\ntemp_dir = {:?}\nsmall_temp_dir = {:?}",
            jobs.display().to_string(),
            small.display().to_string()
        ),
        "",
    ))
    .await
    .ready()
    .await;
    // A short upload goes to small_temp_dir, a long one to temp_dir: both hold other people's
    // speech, in folders that may be shared (/tmp, /dev/shm).
    let mut running = Vec::new();
    for seconds in [0.2, 10.0] {
        let request = host
            .post("/transcribe?prompt=fake:sleep=1500")
            .body(wav(seconds, 16000, 1));
        running.push(tokio::spawn(async move { request.send().await.unwrap() }));
    }
    let folder_in = |at: &std::path::Path| {
        std::fs::read_dir(at)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("gpuhost-job-"))
            .map(|e| e.path())
    };
    for at in [&small, &jobs] {
        wait_for("a job folder", Duration::from_secs(10), || async {
            folder_in(at).is_some()
        })
        .await;
        let folder = folder_in(at).unwrap();
        let mode = std::fs::metadata(&folder).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", folder.display());
    }
    for r in running {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    host.stop().await;
}
