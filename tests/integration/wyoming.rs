//! The Wyoming speech-to-text server (Home Assistant): describe/info, a streamed request through
//! the GPU queue, refusals that end the stream, the queue limit, framing errors, clients that
//! read nothing, and shutdown.
//! (Home Assistant's own `wyoming` client is exercised against the real ASR in tests/speech.)

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::support::*;

struct Client {
    stream: BufReader<TcpStream>,
}

impl Client {
    async fn connect(host: &TestHost) -> Client {
        let stream = TcpStream::connect(host.wyoming.expect("[wyoming] listen"))
            .await
            .unwrap();
        Client {
            stream: BufReader::new(stream),
        }
    }

    async fn send(&mut self, kind: &str, data: Value, payload: &[u8]) {
        let header = json!({"type": kind, "data": data, "payload_length": payload.len()});
        let mut out = serde_json::to_vec(&header).unwrap();
        out.push(b'\n');
        out.extend_from_slice(payload);
        self.stream.get_mut().write_all(&out).await.unwrap();
    }

    /// The next event as `(type, data)`, with `data_length` bytes merged in.
    async fn recv(&mut self) -> (String, Value) {
        self.try_recv().await.expect("an event, not the end")
    }

    /// The next event, or `None` at the end of the stream.
    async fn try_recv(&mut self) -> Option<(String, Value)> {
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(20), self.stream.read_line(&mut line))
            .await
            .expect("an answer within 20 s");
        if !matches!(read, Ok(n) if n > 0) {
            return None;
        }
        let header: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line:?}"));
        let mut data = header.get("data").cloned().unwrap_or(json!({}));
        if let Some(n) = header["data_length"].as_u64().filter(|&n| n > 0) {
            let mut extra = vec![0; n as usize];
            self.stream.read_exact(&mut extra).await.unwrap();
            let extra: Value = serde_json::from_slice(&extra).unwrap();
            for (k, v) in extra.as_object().unwrap() {
                data[k] = v.clone();
            }
        }
        Some((header["type"].as_str().unwrap().to_string(), data))
    }

    /// Expects an `error` and then the end of the stream; its data.
    async fn error_then_end(&mut self) -> Value {
        let (kind, error) = self.recv().await;
        assert_eq!(kind, "error", "{error}");
        // Home Assistant reads until a transcript or the end of the stream: an error on an
        // open connection left it waiting five minutes.
        self.ended().await;
        error
    }

    /// Expects the end of the stream (within 10 s): what an `error` leaves.
    async fn ended(&mut self) {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), self.stream.read_to_end(&mut rest))
            .await
            .expect("the stream ends within 10 s")
            .unwrap();
        assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    }

    /// `transcribe`, then `seconds` of silence at 16 kHz in 20 ms chunks, then `audio-stop`.
    async fn request(&mut self, language: &str, seconds: f64) {
        self.send("transcribe", json!({"language": language}), &[])
            .await;
        let format = json!({"rate": 16000, "width": 2, "channels": 1});
        self.send("audio-start", format.clone(), &[]).await;
        let pcm = vec![0u8; (seconds * 32000.0) as usize];
        for chunk in pcm.chunks(640) {
            self.send("audio-chunk", format.clone(), chunk).await;
        }
        self.send("audio-stop", json!({}), &[]).await;
    }
}

/// A `/transcribe` request running in the background; its body when it ends.
fn background_job(host: &TestHost, query: &str) -> tokio::task::JoinHandle<String> {
    let request = host
        .client()
        .post(format!("{}/transcribe?{query}", host.url))
        .body(wav(0.2, 16000, 1));
    tokio::spawn(async move { request.send().await.unwrap().text().await.unwrap() })
}

fn config(extra: &str) -> String {
    format!(
        "[pipeline]\nstages = [\"diarizer\", \"asr\"]\n{}{}[wyoming]\nlisten = \"127.0.0.1:0\"\n{extra}",
        fake_worker("diarizer", ""),
        fake_worker("asr", "env = { FAKE_TEXT = \"turn on the kitchen light\" }\n"),
    )
}

#[tokio::test]
async fn describe_then_a_streamed_request_gives_its_transcript() {
    let host = TestHost::start(&config("")).await.ready().await;
    let mut client = Client::connect(&host).await;
    client.send("describe", json!({}), &[]).await;
    let (kind, info) = client.recv().await;
    assert_eq!(kind, "info");
    assert_eq!(info["asr"][0]["name"], "gpuhost");
    assert_eq!(
        info["asr"][0]["models"][0]["name"], "asr",
        "asr alone by default"
    );
    assert_eq!(info["asr"][0]["models"][0]["languages"], json!(["en"]));

    client.request("ko", 0.5).await;
    let (kind, transcript) = client.recv().await;
    assert_eq!(kind, "transcript", "{transcript}");
    assert_eq!(transcript["text"], "turn on the kitchen light");
    assert_eq!(
        transcript["language"], "ko",
        "the request's language reached the ASR"
    );
    let asr = host.worker("asr").await;
    assert_eq!(asr["tasks_done"], 1);
    let diarizer = host.worker("diarizer").await;
    assert_eq!(
        diarizer["tasks_done"], 0,
        "a voice command skips the diarizer"
    );

    // The same connection takes the next request.
    client.request("en", 0.2).await;
    assert_eq!(client.recv().await.0, "transcript");
    host.stop().await;
}

/// Sends `events` on a fresh connection and expects one `error` saying `says`, then the end.
async fn refused(host: &TestHost, events: &[(&str, Value, Vec<u8>)], says: &str) {
    let mut client = Client::connect(host).await;
    for (kind, data, payload) in events {
        client.send(kind, data.clone(), payload).await;
    }
    let error = client.error_then_end().await;
    assert!(error["text"].as_str().unwrap().contains(says), "{error}");
}

#[tokio::test]
async fn bad_audio_gets_one_error_and_the_end_of_the_stream() {
    let host = TestHost::start(&config("")).await.ready().await;
    let format = json!({"rate": 16000, "width": 2, "channels": 1});
    let start = ("audio-start", format.clone(), vec![]);
    let stop = ("audio-stop", json!({}), vec![]);
    let width4 = json!({"rate": 16000, "width": 4, "channels": 1});
    refused(&host, &[("audio-start", width4, vec![])], "width 4").await;
    // A format field that is no whole number is said, not read as absent (it was taken for
    // mono 16-bit and transcribed).
    let text = json!({"rate": 16000, "width": 2, "channels": "2"});
    let says = "`channels` must be a whole number";
    refused(&host, &[("audio-start", text, vec![])], says).await;
    let float = json!({"rate": 16000.0, "width": 2, "channels": 1});
    let after = ("audio-chunk", json!({}), vec![0u8; 0]);
    let odd = ("audio-chunk", json!({"width": "4"}), vec![0u8; 64]);
    refused(
        &host,
        &[("audio-start", float, vec![]), after, odd],
        "`width`",
    )
    .await;
    let language = ("transcribe", json!({"language": 5}), vec![]);
    refused(&host, &[language], "`language` must be a string").await;
    refused(&host, std::slice::from_ref(&stop), "before `audio-start`").await;
    // Half a sample: refused (a stray byte would shift every later sample), not dropped.
    let half = ("audio-chunk", format.clone(), vec![0, 0, 0]);
    refused(&host, &[start.clone(), half], "whole frames").await;
    // No audio at all between start and stop: refused, as an empty HTTP upload is.
    refused(&host, &[start.clone(), stop.clone()], "no audio").await;
    // A chunk in another format than its start's would be read as garbage.
    let other = json!({"rate": 22050, "width": 2, "channels": 1});
    let chunk = ("audio-chunk", other, vec![0; 640]);
    refused(&host, &[start.clone(), chunk], "rate 22050").await;
    // Longer than limits.max_audio_seconds: the rest of the audio the client still sends is
    // read and dropped (closing on it unread would reset the connection before the error is
    // read), then the stream ends.
    let host2 = TestHost::start(&config("[limits]\nmax_audio_seconds = 1.0\n"))
        .await
        .ready()
        .await;
    let mut long = Client::connect(&host2).await;
    long.request("en", 1.5).await;
    let error = long.error_then_end().await;
    assert!(
        error["text"]
            .as_str()
            .unwrap()
            .contains("max_audio_seconds"),
        "{error}"
    );
    host2.stop().await;
    // A temp dir whose disk has less free than limits.min_free_bytes (here: more than any
    // disk has): a voice command is taken, audio past 8 MiB is refused as it comes.
    let full = TestHost::start(&config("[limits]\nmin_free_bytes = 1152921504606846976\n"))
        .await
        .ready()
        .await;
    let mut short = Client::connect(&full).await;
    short.request("en", 0.5).await;
    assert_eq!(short.recv().await.0, "transcript");
    let mut long = vec![start.clone()];
    long.extend((0..9).map(|_| ("audio-chunk", format.clone(), vec![0u8; 1 << 20])));
    let mut client = Client::connect(&full).await;
    for (kind, data, payload) in &long {
        client.send(kind, data.clone(), payload).await;
    }
    let error = client.error_then_end().await;
    assert_eq!(error["code"], "insufficient_storage", "{error}");
    assert!(
        error["text"]
            .as_str()
            .unwrap()
            .contains("limits.min_free_bytes"),
        "{error}"
    );
    full.stop().await;
    // A new connection works after all that.
    let mut client = Client::connect(&host).await;
    client.request("en", 0.2).await;
    assert_eq!(client.recv().await.0, "transcript");
    host.stop().await;
}

#[tokio::test]
async fn a_client_that_reads_nothing_is_dropped_after_the_send_timeout() {
    let host = TestHost::start(&config("[http]\nsend_timeout_s = 1.0\n"))
        .await
        .ready()
        .await;
    let client = Client::connect(&host).await;
    let mut stream = client.stream.into_inner();
    // `describe` after `describe`, never reading an `info`: the server's writes fill the
    // socket and wait. Once it gives up, it closes, and the writes here fail.
    let describe = b"{\"type\":\"describe\"}\n".repeat(1000);
    let mut failed = false;
    for _ in 0..600 {
        let write = stream.write_all(&describe);
        if let Ok(Err(_)) = tokio::time::timeout(Duration::from_millis(50), write).await {
            failed = true;
            break;
        }
    }
    assert!(
        failed,
        "the server still holds a connection that reads nothing"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_request_in_flight_at_shutdown_is_answered_shutting_down() {
    // Every task of the asr takes 30 s.
    let slow = config("").replace("FAKE_TEXT = ", "FAKE_EXTRA = \"sleep=30000\", FAKE_TEXT = ");
    let host = TestHost::start(&slow).await.ready().await;
    let mut client = Client::connect(&host).await;
    client.request("en", 0.2).await;
    wait_for("the job to run", Duration::from_secs(10), || async {
        host.state.queue.running() == 1
    })
    .await;
    let stopped = tokio::spawn(host.stop());
    let error = client.error_then_end().await;
    assert_eq!(error["code"], "shutting_down", "{error}");
    stopped.await.unwrap();
}

#[tokio::test]
async fn a_wyoming_request_waits_in_the_same_gpu_queue() {
    let host = TestHost::start(&config("[limits]\nmax_queue = 1\n"))
        .await
        .ready()
        .await;
    // One HTTP job holds the GPU and another waits: the queue is full for everyone.
    let running = background_job(&host, "stages=asr&prompt=fake:sleep=1500");
    wait_for(
        "the first job to hold the GPU",
        Duration::from_secs(10),
        || async { host.state.queue.running() == 1 },
    )
    .await;
    let waiting = background_job(&host, "stages=asr");
    wait_for(
        "the second job to wait",
        Duration::from_secs(10),
        || async { host.state.queue.waiting() == 1 },
    )
    .await;
    let mut client = Client::connect(&host).await;
    client.request("en", 0.2).await;
    let error = client.error_then_end().await;
    assert_eq!(error["code"], "queue_full", "{error}");
    running.await.unwrap();
    waiting.await.unwrap();
    let mut client = Client::connect(&host).await;
    client.request("en", 0.2).await;
    assert_eq!(client.recv().await.0, "transcript");
    host.stop().await;
}

#[tokio::test]
async fn a_client_that_sends_its_next_request_early_and_hangs_up_cancels_its_job() {
    let host = TestHost::start(&config("")).await.ready().await;
    // A lease holds the GPU, so the Wyoming job waits in the queue.
    let lease = host
        .post("/gpu/lease")
        .json(&json!({"holder": "t", "ttl_s": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(lease.status(), 200);
    // The next request, early, then gone: a small one stays in the server's buffer; a large
    // one (its audio) is more than a socket's window, and the hangup waits behind it until the
    // server reads it ahead.
    let format = json!({"rate": 16000, "width": 2, "channels": 1});
    let small = vec![("describe", json!({}), vec![])];
    let large = vec![
        ("audio-start", format.clone(), vec![]),
        ("audio-chunk", format, vec![0; 200_000]),
    ];
    for early in [small, large] {
        let mut client = Client::connect(&host).await;
        client.request("en", 0.2).await;
        wait_for("the job to wait", Duration::from_secs(10), || async {
            host.state.queue.waiting() == 1
        })
        .await;
        for (kind, data, payload) in early {
            client.send(kind, data, &payload).await;
        }
        drop(client);
        wait_for(
            "the job to leave the queue",
            Duration::from_secs(10),
            || async { host.state.queue.waiting() == 0 },
        )
        .await;
    }
    host.stop().await;
}

#[tokio::test]
async fn a_broken_frame_gets_an_error_and_the_connection_closes() {
    let host = TestHost::start(&config("")).await.ready().await;
    let mut client = Client::connect(&host).await;
    client
        .stream
        .get_mut()
        .write_all(b"{\"type\":\"audio-chunk\",\"payload_length\":999999999999}\n")
        .await
        .unwrap();
    let (kind, error) = client.recv().await;
    assert_eq!(kind, "error");
    assert_eq!(error["code"], "bad_event");
    assert!(
        error["text"].as_str().unwrap().contains("payload_length"),
        "{error}"
    );
    let mut rest = Vec::new();
    client.stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "closed after the error");
    // A header line past 64 KiB is answered too (exactly one byte too many is sent, so nothing
    // is left unread when the server closes).
    let mut long = Client::connect(&host).await;
    let line = vec![b'x'; 64 * 1024 + 1];
    long.stream.get_mut().write_all(&line).await.unwrap();
    let (kind, error) = long.recv().await;
    assert_eq!(
        (kind.as_str(), &error["code"]),
        ("error", &json!("bad_event"))
    );
    assert!(
        error["text"].as_str().unwrap().contains("longer than"),
        "{error}"
    );
    // Extra data that is not an object is told as such, not as a header without `type`.
    let mut extra = Client::connect(&host).await;
    extra
        .stream
        .get_mut()
        .write_all(b"{\"type\":\"describe\",\"data_length\":3}\nabc")
        .await
        .unwrap();
    let (_, error) = extra.recv().await;
    let text = error["text"].as_str().unwrap();
    assert!(
        text.contains("extra data") && !text.contains("`type`"),
        "{error}"
    );
    // The server goes on.
    let mut next = Client::connect(&host).await;
    next.send("describe", json!({}), &[]).await;
    assert_eq!(next.recv().await.0, "info");
    host.stop().await;
}

#[tokio::test]
async fn pings_are_answered_but_keep_no_stream_of_audio_open() {
    let host = TestHost::start(&config("[http]\nbody_idle_timeout_s = 1.0\n"))
        .await
        .ready()
        .await;
    let mut client = Client::connect(&host).await;
    client
        .send("ping", json!({"text": "are you there"}), &[])
        .await;
    let (kind, pong) = client.recv().await;
    assert_eq!(
        (kind.as_str(), &pong["text"]),
        ("pong", &json!("are you there"))
    );
    // Audio begins, then only pings come: they held the stream (and its job folder) open
    // without end; only audio counts now.
    let format = json!({"rate": 16000, "width": 2, "channels": 1});
    client.send("audio-start", format.clone(), &[]).await;
    client.send("audio-chunk", format, &[0u8; 640]).await;
    let began = std::time::Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(200));
    let mut told = None;
    loop {
        pace.tick().await;
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "pings kept the stream open"
        );
        let ping = b"{\"type\":\"ping\"}\n";
        if client.stream.get_mut().write_all(ping).await.is_err() {
            break;
        }
        match client.try_recv().await {
            Some((kind, _)) if kind == "pong" => {}
            Some((kind, event)) => {
                assert_eq!(kind, "error", "{event}");
                told = Some(event);
            }
            None => break, // closed
        }
    }
    assert!(
        began.elapsed() >= Duration::from_millis(900),
        "closed too early"
    );
    // The client hears why its transcript will not come, not only a closed connection.
    let told = told.expect("the stream was dropped without an `error` event");
    assert_eq!(told["code"], "audio_timeout", "{told}");
    assert!(told["text"].as_str().unwrap().contains("1 s"), "{told}");
    host.stop().await;
}
