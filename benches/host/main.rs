//! Side-by-side benchmark: gpuhost vs the seed anchor (`shared/bench/seed_anchor/server.py`), both
//! running `worker.py` unmodified as their worker, measured in one run by the same client.
//!
//! `cargo bench --bench host` prints no-op job latency p50/p99 and throughput over HTTP,
//! stderr-line-to-client latency, idle host RSS and `/status` throughput and latency, each with
//! the ratio gpuhost/anchor, and each host's overhead above the floor: the same worker driven
//! over bare pipes with no host at all, measured in the same run. The anchor's Python venv is made under `.bench/` on first use.
#![allow(clippy::unwrap_used, unreachable_pub)] // test and bench code: a panic is the failure report
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)] // the benchmark starts both servers as processes

mod measure;
mod servers;

use measure::{percentile, Sample};
use servers::{Anchor, Gpuhost, Server};

const NOOP_JOBS: usize = 500;
const THROUGHPUT_JOBS: usize = 400;
const THROUGHPUT_CLIENTS: usize = 8;
const LOG_JOBS: usize = 10;

fn main() {
    if let Err(why) = servers::anchor_available() {
        println!("skipped: {why}");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let anchor = Anchor::start().await;
        let host = Gpuhost::start().await;
        let client = reqwest::Client::new();
        let wav = measure::wav_bytes(0.5);

        println!("# gpuhost vs seed anchor (same machine, same client, same worker.py)\n");
        let mut rows = Vec::new();

        // What each host adds above the floor: the worker's own round trip over bare pipes,
        // measured interleaved with both hosts' jobs. Each host against the floor whose job
        // files are where its worker's are: the anchor's on disk, gpuhost's (a 0.5 s 16 kHz WAV
        // is a small job) in /dev/shm.
        let shm = std::path::Path::new("/dev/shm");
        let memory = shm.is_dir().then_some(shm);
        if memory.is_none() {
            println!(
                "(no /dev/shm here: both floors write to the temp dir, as gpuhost then does)\n"
            );
        }
        let mut disk_floor = measure::BarePipe::start(&servers::worker_argv(), None);
        let mut memory_floor = measure::BarePipe::start(&servers::worker_argv(), memory);
        let [g, a, disk, memory] = measure::interleaved_latency(
            &client,
            &host.transcribe_url("seed"),
            &anchor.transcribe_url(0, 0),
            [&mut disk_floor, &mut memory_floor],
            &wav,
            NOOP_JOBS,
        )
        .await;
        rows.extend(percentile_rows("no-op job latency", &g, &a));
        let (disk_p50, memory_p50) = (percentile(&disk, 50.0), percentile(&memory, 50.0));
        println!(
            "worker floor (bare pipes, no host) p50 {disk_p50:.3} ms with its files on disk \
             (the anchor's), {memory_p50:.3} ms in /dev/shm (gpuhost's small jobs); p99 {:.3} / \
             {:.3} ms\n",
            percentile(&disk, 99.0),
            percentile(&memory, 99.0)
        );
        rows.push(row(
            "no-op job p50 above its worker floor (ms)",
            percentile(&g, 50.0) - memory_p50,
            percentile(&a, 50.0) - disk_p50,
        ));

        // HOST_BENCH_ONLY=latency stops here (for profiling the no-op path).
        if std::env::var("HOST_BENCH_ONLY").is_ok_and(|only| only == "latency") {
            println!("| metric | gpuhost | anchor | gpuhost/anchor |\n|---|---|---|---|");
            for r in &rows {
                println!("{r}");
            }
            host.stop();
            anchor.stop();
            return;
        }

        let a = measure::throughput(
            &client,
            &anchor.transcribe_url(0, 0),
            &wav,
            THROUGHPUT_JOBS,
            THROUGHPUT_CLIENTS,
        )
        .await;
        let g = measure::throughput(
            &client,
            &host.transcribe_url("seed"),
            &wav,
            THROUGHPUT_JOBS,
            THROUGHPUT_CLIENTS,
        )
        .await;
        rows.push(row(
            &format!("no-op jobs/s, {THROUGHPUT_CLIENTS} clients"),
            g,
            a,
        ));

        let a =
            measure::log_latency(&client, &anchor.transcribe_url(200, 20), &wav, LOG_JOBS).await;
        let g =
            measure::log_latency(&client, &host.transcribe_url("seedlog"), &wav, LOG_JOBS).await;
        rows.extend(percentile_rows("stderr line → client", &g, &a));

        rows.push(row("idle host RSS (MiB)", host.rss_mib(), anchor.rss_mib()));
        rows.push(row(
            "idle host RSS, anonymous only (MiB)",
            host.rss_anon_mib(),
            anchor.rss_anon_mib(),
        ));

        for (connections, busy) in [(16, false), (16, true)] {
            let (g_rps, g_lat) = status_load(&client, &host, connections, busy).await;
            let (a_rps, a_lat) = status_load(&client, &anchor, connections, busy).await;
            let during = if busy { ", GPU job running" } else { "" };
            rows.push(row(
                &format!("/status req/s, {connections} conns{during}"),
                g_rps,
                a_rps,
            ));
            rows.push(row(
                &format!("/status p99 (ms), {connections} conns{during}"),
                percentile(&g_lat, 99.0),
                percentile(&a_lat, 99.0),
            ));
        }

        println!("| metric | gpuhost | anchor | gpuhost/anchor |\n|---|---|---|---|");
        for r in &rows {
            println!("{r}");
        }
        host.stop();
        anchor.stop();
    });
}

/// Runs `/status` load for 3 s; with `busy`, a long job holds the GPU lock meanwhile.
async fn status_load<S: Server>(
    client: &reqwest::Client,
    server: &S,
    connections: usize,
    busy: bool,
) -> (f64, Vec<Sample>) {
    let job = busy.then(|| {
        let client = client.clone();
        let (url, wav) = (server.long_job_url(), measure::wav_bytes(0.5));
        tokio::spawn(async move { measure::run_job(&client, &url, &wav).await })
    });
    if busy {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let out = measure::status_load(
        client,
        &server.status_url(),
        server.token(),
        connections,
        std::time::Duration::from_secs(3),
    )
    .await;
    if let Some(job) = job {
        job.abort();
    }
    out
}

/// p50 and p99 rows (ms) of one latency measured on both servers.
fn percentile_rows(name: &str, gpuhost: &[f64], anchor: &[f64]) -> [String; 2] {
    [50.0, 99.0].map(|p| {
        row(
            &format!("{name} p{p} (ms)"),
            percentile(gpuhost, p),
            percentile(anchor, p),
        )
    })
}

fn row(name: &str, gpuhost: f64, anchor: f64) -> String {
    format!(
        "| {name} | {gpuhost:.3} | {anchor:.3} | {:.3} |",
        gpuhost / anchor
    )
}
