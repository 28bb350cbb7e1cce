//! The GPU queue through HTTP: FIFO order, positions, and clients that go away.

use std::time::Duration;

use gpuhost::protocol::ClientEvent;
use tokio::sync::{mpsc, oneshot};

use super::support::*;

#[tokio::test]
async fn fifty_concurrent_requests_are_served_in_arrival_order() {
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    for i in 0..50usize {
        let request = host
            .post("/transcribe?prompt=fake:sleep=15")
            .body(wav(0.2, 16000, 1));
        let (arrived_tx, arrived) = oneshot::channel();
        let done_tx = done_tx.clone();
        tokio::spawn(async move {
            let mut reader = EventReader::new(request.send().await.unwrap());
            let first = reader.next().await.unwrap();
            let _ = arrived_tx.send(());
            let mut events = vec![first];
            while let Some(e) = reader.next().await {
                events.push(e);
            }
            done_tx.send((i, events)).unwrap();
        });
        // The next request is sent once this one holds its place in the queue.
        arrived.await.unwrap();
    }
    drop(done_tx);
    let mut served = vec![0u64; 50];
    let mut waited = 0;
    while let Some((i, events)) = done_rx.recv().await {
        let positions: Vec<usize> = events
            .iter()
            .filter_map(|e| match e {
                ClientEvent::Queued { position, .. } => Some(*position),
                _ => None,
            })
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] > w[1]),
            "request {i}: positions {positions:?}"
        );
        if !positions.is_empty() {
            waited += 1;
        }
        served[i] = result_of(&events)["stages"]["w"]["seq"].as_u64().unwrap();
    }
    assert_eq!(
        served,
        (1..=50).collect::<Vec<u64>>(),
        "served in arrival order"
    );
    assert!(waited >= 40, "most requests had to queue ({waited})");
    host.stop().await;
}

#[tokio::test]
async fn client_leaving_the_queue_is_gone_at_once() {
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    let mut a = EventReader::new(
        host.post_body("/transcribe?prompt=fake:sleep=1500", wav(0.2, 16000, 1))
            .await,
    );
    a.until(started).await;
    let mut b = EventReader::new(host.post_body("/transcribe", wav(0.2, 16000, 1)).await);
    assert_eq!(
        b.next().await,
        Some(ClientEvent::Queued {
            position: 1,
            waiting_for: Some("speech job".into())
        })
    );
    assert_eq!(host.state.queue.waiting(), 1);
    drop(b);
    let queue = host.state.queue.clone();
    wait_for(
        "the disconnected client to leave the queue",
        Duration::from_secs(1),
        || {
            let q = queue.clone();
            async move { q.waiting() == 0 }
        },
    )
    .await;
    let mut c = EventReader::new(host.post_body("/transcribe", wav(0.2, 16000, 1)).await);
    assert_eq!(
        c.next().await,
        Some(ClientEvent::Queued {
            position: 1,
            waiting_for: Some("speech job".into())
        })
    );
    let mut c_events = Vec::new();
    while let Some(e) = c.next().await {
        c_events.push(e);
    }
    assert_eq!(
        result_of(&c_events)["stages"]["w"]["seq"],
        2,
        "the job of the client that left never ran"
    );
    while a.next().await.is_some() {}
    host.stop().await;
}

#[tokio::test]
async fn client_leaving_while_running_never_keeps_the_gpu() {
    let config = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", ""),
        fake_worker("b", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    abandon_job(&host, 700).await;
    // The next client gets the GPU once stage `a` of the abandoned job is over; `b` is skipped.
    let events = host.transcribe("", wav(0.2, 16000, 1)).await;
    let result = result_of(&events);
    assert_eq!(result["stages"]["a"]["seq"], 2);
    assert_eq!(
        result["stages"]["b"]["seq"], 1,
        "the abandoned job's stage b never ran"
    );
    assert_eq!(host.state.queue.running(), 0);
    host.stop().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_does_not_keep_the_gpu() {
    use tokio::io::AsyncWriteExt;
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    // 3000 progress events of 4 KB (12 MB of NDJSON) to a client that reads none of them, with
    // a small receive buffer: the host's socket and the job's channel fill up.
    let addr: std::net::SocketAddr = host.url.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let body = wav(0.5, 16000, 1);
    let head = format!(
        "POST /transcribe?prompt=fake:chatter=3000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(&body).await.unwrap();
    // Its worker gets to the end (its events are dropped, not waited for)...
    wait_for(
        "the unread job's task to end",
        Duration::from_secs(120),
        || async { host.worker("w").await["tasks_done"] == 1 },
    )
    .await;
    // ...and the GPU goes to the next job while that client still holds its connection.
    let events = tokio::time::timeout(
        Duration::from_secs(60),
        host.transcribe("", wav(0.5, 16000, 1)),
    )
    .await
    .expect("the next job got the GPU");
    result_of(&events);
    drop(stalled);
    host.stop().await;
}

#[tokio::test]
async fn health_tells_the_busy_workers_among_the_ready_ones() {
    // `/health` counted a worker running a task as `ready` and nothing else: a monitor could not
    // tell an idle pipeline from one at work.
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    let idle = host.get_json("/health").await;
    assert_eq!(
        (&idle["workers"]["ready"], &idle["workers"]["busy"]),
        (&serde_json::json!(1), &serde_json::json!(0)),
        "{idle}"
    );
    let mut running = EventReader::new(
        host.post_body("/transcribe?prompt=fake:sleep=3000", wav(0.2, 16000, 1))
            .await,
    );
    running.until(started).await;
    wait_for(
        "/health to say the worker is busy",
        Duration::from_secs(10),
        || async { host.get_json("/health").await["workers"]["busy"] == 1 },
    )
    .await;
    let busy = host.get_json("/health").await;
    assert_eq!(busy["workers"]["ready"], 1, "loaded, busy included: {busy}");
    drop(running);
    wait_for(
        "the worker to be free again",
        Duration::from_secs(10),
        || async { host.get_json("/health").await["workers"]["busy"] == 0 },
    )
    .await;
    host.stop().await;
}
