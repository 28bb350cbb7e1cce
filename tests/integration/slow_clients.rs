//! Clients that hold connections: bodies trickled below the minimum pace are cut off (uploads and
//! lease requests alike), and while every connection slot is held the probes still answer.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::support::*;

fn config(http: &str) -> String {
    format!(
        "[http]\n{http}\n[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "")
    )
}

/// Sends `head`, then `chunk` every 200 ms until the server answers; returns the answer and how
/// long the body had been trickling. A connection told at once that the server is busy (an idle
/// keep-alive connection of the test's client still holds a slot) is tried again.
fn trickle(
    addr: String,
    head: &'static str,
    chunk: &'static [u8],
) -> JoinHandle<(String, Duration)> {
    std::thread::spawn(move || loop {
        let (reply, took) = trickle_once(&addr, head, chunk);
        if !reply.starts_with("HTTP/1.1 503") {
            return (reply, took);
        }
        std::thread::sleep(Duration::from_millis(50));
    })
}

fn trickle_once(addr: &str, head: &str, chunk: &[u8]) -> (String, Duration) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        let mut buf = [0u8; 4096];
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}") {
                    break;
                }
            }
            Err(_) => {
                if tcp.write_all(chunk).is_err() {
                    break;
                }
            }
        }
    }
    (String::from_utf8_lossy(&got).to_string(), started.elapsed())
}

#[tokio::test]
async fn a_trickled_upload_is_cut_off_and_probes_answer_while_it_holds_every_slot() {
    // 40 bytes every 200 ms is 200 bytes/s: never a pause of a second, but a tenth of the pace.
    let host = TestHost::start(&config(
        "header_timeout_s = 1\nbody_idle_timeout_s = 3\nmin_body_rate_bytes_per_s = 2000\nmax_connections = 2",
    ))
    .await
    .ready()
    .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let head =
        "POST /transcribe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\nRIFF";
    let chunk: &[u8] = &[0u8; 40];
    let slow: Vec<_> = (0..2).map(|_| trickle(addr.clone(), head, chunk)).collect();
    // Both slots are taken once a third upload is told the server is busy.
    let deadline = Instant::now() + Duration::from_secs(10);
    let busy = loop {
        let reply = host
            .post("/transcribe")
            .body(wav(0.2, 16000, 1))
            .send()
            .await;
        match reply {
            Ok(reply) if reply.status() == 503 => break reply,
            _ => assert!(Instant::now() < deadline, "the slots were never all held"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(busy.headers()["retry-after"], "1");
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["error"], "busy", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("max_connections"),
        "{body}"
    );
    // The probes answer on the spare connections meanwhile.
    for probe in ["/health", "/ready"] {
        let reply = host.get(probe).send().await.unwrap();
        assert_eq!(reply.status(), 200, "{probe}");
    }
    for handle in slow {
        let (reply, took) = tokio::task::spawn_blocking(move || handle.join().unwrap())
            .await
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("min_body_rate_bytes_per_s"), "{reply}");
        assert!(took < Duration::from_secs(10), "{took:?}");
    }
    // The slots are free again: uploads are served in full.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    result_of(&events);
    host.stop().await;
}

#[tokio::test]
async fn a_trickled_lease_request_is_cut_off() {
    let host = TestHost::start(&config(
        "body_idle_timeout_s = 1\nmin_body_rate_bytes_per_s = 2000",
    ))
    .await
    .ready()
    .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let head = "POST /gpu/lease HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{\"holder\": \"";
    let (reply, took) =
        tokio::task::spawn_blocking(move || trickle(addr, head, b"x").join().unwrap())
            .await
            .unwrap();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("body_timeout"), "{reply}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    host.stop().await;
}
