//! The client side of the benchmark: latency, throughput and log-delivery measurements.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;

pub type Sample = f64;

pub fn percentile(samples: &[Sample], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank]
}

pub fn wav_bytes(seconds: f64) -> Vec<u8> {
    let rate = 16_000u32;
    let n = (seconds * f64::from(rate)) as u32;
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + n * 2).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    for v in [
        16u32.to_le_bytes().as_slice(),
        &1u16.to_le_bytes(),
        &1u16.to_le_bytes(),
        &rate.to_le_bytes(),
        &(rate * 2).to_le_bytes(),
        &2u16.to_le_bytes(),
        &16u16.to_le_bytes(),
    ] {
        out.extend_from_slice(v);
    }
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(n * 2).to_le_bytes());
    for i in 0..n {
        let v = ((i as f64 * 0.17).sin() * 8000.0) as i16;
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Posts one job and reads the stream to its end; returns each line with its arrival time.
pub async fn run_job(client: &reqwest::Client, url: &str, wav: &[u8]) -> Vec<(String, SystemTime)> {
    let response = client
        .post(url)
        .bearer_auth(super::servers::TOKEN)
        .body(wav.to_vec())
        .send()
        .await
        .expect("request");
    assert!(
        response.status().is_success(),
        "{url}: {}",
        response.status()
    );
    let mut stream = response.bytes_stream();
    let mut buf = Vec::new();
    let mut lines = Vec::new();
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.expect("body"));
        let now = SystemTime::now();
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            lines.push((String::from_utf8_lossy(&line).trim().to_string(), now));
        }
    }
    let last = &lines.last().expect("at least one event").0;
    assert!(
        last.contains("\"result\""),
        "{url}: job did not succeed: {last}"
    );
    lines
}

/// No-op job latency of both hosts and of the two floors (the worker over bare pipes, its job
/// files on disk as the anchor's are, and in memory as gpuhost's small jobs are), interleaved
/// job by job, so that all see the same machine: a burst of load from elsewhere lands on all of
/// them alike instead of on whichever block ran then. The order goes through every permutation
/// in turn, so each runs after each other as often (what one leaves behind, such as a host's
/// cleanup after its answer, lands on all alike). Milliseconds, after a warm-up of 24 rounds:
/// (gpuhost, anchor, floor on disk, floor in memory), `n` rounds rounded up to whole cycles.
pub async fn interleaved_latency(
    client: &reqwest::Client,
    gpuhost_url: &str,
    anchor_url: &str,
    floors: [&mut BarePipe; 2],
    wav: &[u8],
    n: usize,
) -> [Vec<Sample>; 4] {
    let [disk, memory] = floors;
    let orders = permutations(4);
    let mut out: [Vec<Sample>; 4] = Default::default();
    // Whole cycles of orders: `n` rounded up to one, plus one cycle of warm-up.
    for i in 0..(n.div_ceil(orders.len()) + 1) * orders.len() {
        for &which in &orders[i % orders.len()] {
            let started = Instant::now();
            match which {
                0 => {
                    run_job(client, gpuhost_url, wav).await;
                }
                1 => {
                    run_job(client, anchor_url, wav).await;
                }
                2 => tokio::task::block_in_place(|| disk.once()),
                _ => tokio::task::block_in_place(|| memory.once()),
            }
            if i >= orders.len() {
                out[which].push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    out
}

/// Every order of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            out.push(order);
        }
    }
    out
}

/// `total` jobs from `clients` concurrent clients; jobs per second.
pub async fn throughput(
    client: &reqwest::Client,
    url: &str,
    wav: &[u8],
    total: usize,
    clients: usize,
) -> f64 {
    let started = Instant::now();
    let per = total / clients;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, wav) = (client.clone(), url.to_string(), wav.to_vec());
            tokio::spawn(async move {
                for _ in 0..per {
                    run_job(&client, &url, &wav).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (per * clients) as f64 / started.elapsed().as_secs_f64()
}

/// Jobs whose worker writes time-stamped stderr lines; milliseconds from write to arrival.
pub async fn log_latency(
    client: &reqwest::Client,
    url: &str,
    wav: &[u8],
    jobs: usize,
) -> Vec<Sample> {
    let mut out = Vec::new();
    for _ in 0..jobs {
        for (line, arrived) in run_job(client, url, wav).await {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let Some(text) = event.get("line").and_then(|l| l.as_str()) else {
                continue;
            };
            let Some(stamp) = text
                .split_whitespace()
                .next()
                .and_then(|s| s.parse::<f64>().ok())
            else {
                continue;
            };
            let arrived = arrived.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
            out.push((arrived - stamp) * 1000.0);
        }
    }
    assert!(!out.is_empty(), "{url}: no stamped log lines arrived");
    out
}

/// Hammers `url` from `connections` clients for `duration`; (requests/s, latencies in ms).
pub async fn status_load(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    connections: usize,
    duration: Duration,
) -> (f64, Vec<Sample>) {
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let (client, url, token) = (client.clone(), url.to_string(), token.to_string());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let started = Instant::now();
                    let r = client
                        .get(&url)
                        .bearer_auth(&token)
                        .send()
                        .await
                        .expect("status");
                    assert!(r.status().is_success(), "{url}: {}", r.status());
                    let _ = r.bytes().await;
                    lat.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                lat
            })
        })
        .collect();
    let started = Instant::now();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (
        all.len() as f64 / started.elapsed().as_secs_f64().max(duration.as_secs_f64()),
        all,
    )
}

/// The floor under every no-op job: the worker alone, driven over bare pipes (no host, no HTTP):
/// write the job line, wait for `done`. Started exactly as both hosts start it (`argv`), its job
/// files in a folder under `parent` (the system temp dir when `None`).
pub struct BarePipe {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    dir: tempfile::TempDir,
    wav: std::path::PathBuf,
    jobs: usize,
}

impl BarePipe {
    pub fn start(argv: &[String], parent: Option<&std::path::Path>) -> BarePipe {
        use std::process::{Command, Stdio};
        let dir = match parent {
            Some(parent) => tempfile::tempdir_in(parent).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        let wav = dir.path().join("audio.wav");
        std::fs::write(&wav, wav_bytes(0.5)).unwrap();
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut pipe = BarePipe {
            child,
            stdin,
            stdout,
            dir,
            wav,
            jobs: 0,
        };
        assert_eq!(pipe.next_line(), "ready");
        pipe
    }

    fn next_line(&mut self) -> String {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// One no-op job, to its `done`.
    pub fn once(&mut self) {
        use std::io::Write;
        self.jobs += 1;
        let job = serde_json::json!({
            "wav_path": self.wav,
            "_output_path": self.dir.path().join(format!("out{}.json", self.jobs)),
        });
        writeln!(self.stdin, "{job}").unwrap();
        self.stdin.flush().unwrap();
        while self.next_line() != "done" {}
    }
}

impl Drop for BarePipe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
