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
/// long the body had been trickling. `held` hears once the server has taken the body for 600 ms
/// without an answer (it holds a full slot). A connection told at once that the server is busy
/// (a connection of the test's client still holds a slot) is tried again.
fn trickle(
    addr: String,
    head: &'static str,
    chunk: &'static [u8],
    held: std::sync::mpsc::Sender<()>,
) -> JoinHandle<(String, Duration)> {
    std::thread::spawn(move || loop {
        let (reply, took) = trickle_once(&addr, head, chunk, &held);
        if !reply.starts_with("HTTP/1.1 503") {
            return (reply, took);
        }
        std::thread::sleep(Duration::from_millis(50));
    })
}

fn trickle_once(
    addr: &str,
    head: &str,
    chunk: &[u8],
    held: &std::sync::mpsc::Sender<()>,
) -> (String, Duration) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(head.as_bytes()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let mut told = false;
    let mut got = Vec::new();
    while started.elapsed() < Duration::from_secs(60) {
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
                if !told && got.is_empty() && started.elapsed() > Duration::from_millis(600) {
                    told = true;
                    let _ = held.send(());
                }
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
    // 40 bytes every 200 ms is 200 bytes/s: never a pause of 8 s, but a tenth of the pace (cut
    // off after about 9 s: the checks below run while both uploads still hold their slots).
    let host = TestHost::start(&config(
        "header_timeout_s = 1\nbody_idle_timeout_s = 8\nmin_body_rate_bytes_per_s = 2000\nmax_connections = 2",
    ))
    .await
    .ready()
    .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let head =
        "POST /transcribe HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\nRIFF";
    let chunk: &[u8] = &[0u8; 40];
    let (held, holding) = std::sync::mpsc::channel();
    let slow: Vec<_> = (0..2)
        .map(|_| trickle(addr.clone(), head, chunk, held.clone()))
        .collect();
    tokio::task::spawn_blocking(move || {
        for _ in 0..2 {
            holding
                .recv_timeout(Duration::from_secs(30))
                .expect("both uploads hold a slot");
        }
    })
    .await
    .unwrap();
    // Both slots are taken: a third upload is told the server is busy.
    let busy = host
        .post("/transcribe")
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(busy.status(), 503);
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
    // A client that sends its whole upload before reading gets the 503 too, not a reset.
    let whole = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut tcp = TcpStream::connect(&addr).unwrap();
            let body = vec![0u8; 2 << 20];
            tcp.write_all(
                format!(
                    "POST /transcribe HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .unwrap();
            tcp.write_all(&body).map_err(|e| e.to_string())?;
            let mut reply = String::new();
            tcp.read_to_string(&mut reply).map_err(|e| e.to_string())?;
            Ok::<_, String>(reply)
        }
    });
    let reply = tokio::task::spawn_blocking(move || whole.join().unwrap())
        .await
        .unwrap()
        .expect("the whole upload was sent and the answer read");
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(reply.contains("\"busy\""), "{reply}");
    // The probes answer on the spare connections meanwhile: alive, but not ready for traffic.
    let health = host.get("/health").send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(host.get("/live").send().await.unwrap().status(), 200);
    let ready = host.get("/ready").send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert!(
        ready["reasons"][0]
            .as_str()
            .unwrap()
            .contains("connection slots are in use"),
        "{ready}"
    );
    for handle in slow {
        let (reply, took) = tokio::task::spawn_blocking(move || handle.join().unwrap())
            .await
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
        assert!(reply.contains("min_body_rate_bytes_per_s"), "{reply}");
        assert!(took < Duration::from_secs(20), "{took:?}");
    }
    // The slots are free again: uploads are served in full.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    result_of(&events);
    host.stop().await;
}

#[tokio::test]
async fn idle_connections_hold_the_probes_spares_only_briefly() {
    // One idle connection takes the only slot (for header_timeout_s, 60 s), sixteen more every
    // spare one: the probe behind them is answered once a spare's 2 s head timeout frees it.
    let host = TestHost::start(&config("header_timeout_s = 60\nmax_connections = 1"))
        .await
        .ready()
        .await;
    let addr = host.url.trim_start_matches("http://").to_string();
    let idle: Vec<TcpStream> = (0..17)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let started = Instant::now();
    let health = tokio::time::timeout(Duration::from_secs(20), host.get("/health").send())
        .await
        .expect("the probe is answered long before header_timeout_s")
        .unwrap();
    assert_eq!(health.status(), 200);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(idle);
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
    let (held, _holding) = std::sync::mpsc::channel();
    let (reply, took) =
        tokio::task::spawn_blocking(move || trickle(addr, head, b"x", held).join().unwrap())
            .await
            .unwrap();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("body_timeout"), "{reply}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    host.stop().await;
}

/// A TCP connection to `addr` with a 1 KiB receive buffer (set before connecting, so the window
/// stays small): a client that stops reading fills it at once.
fn small_window(addr: std::net::SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(v4) = addr else {
        panic!("the test server listens on IPv4")
    };
    // SAFETY: plain socket calls on a descriptor this function owns until it is wrapped.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 1024;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let rc = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

#[tokio::test]
async fn a_client_that_never_reads_its_answers_loses_its_slot() {
    let host = TestHost::start(&config("send_timeout_s = 1\nmax_connections = 1"))
        .await
        .ready()
        .await;
    let addr: std::net::SocketAddr = host.url.trim_start_matches("http://").parse().unwrap();
    // Pipelined requests, their answers never read: the server's writes block.
    let (held, holding) = std::sync::mpsc::channel();
    let flood = std::thread::spawn(move || {
        // On the one full slot, not a spare one (an idle keep-alive connection of the test's
        // client may hold the slot a moment longer): the first answer is read, and is not a 503.
        let request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";
        let mut tcp = loop {
            let mut tcp = small_window(addr);
            tcp.write_all(request).unwrap();
            let mut head = [0u8; 12];
            tcp.read_exact(&mut head).unwrap();
            if &head != b"HTTP/1.1 503" {
                break tcp;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        held.send(()).unwrap();
        let requests = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(2000);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if tcp.write_all(&requests).is_err() {
                return started.elapsed(); // the server dropped the connection
            }
        }
        started.elapsed()
    });
    tokio::task::spawn_blocking(move || holding.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the flood holds the slot");
    // While the flood holds the one slot, other requests are told the server is busy; once
    // the blocked write has waited send_timeout_s, the slot is free and they are served.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut busy = 0;
    loop {
        let reply = host.get("/status").send().await.unwrap();
        match reply.status().as_u16() {
            503 => busy += 1,
            200 if busy > 0 => break,
            _ => {}
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = tokio::task::spawn_blocking(move || flood.join().unwrap())
        .await
        .unwrap();
    assert!(held < Duration::from_secs(30), "{held:?}");
    host.stop().await;
}
