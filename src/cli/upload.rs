//! An upload the client watches: a server that stops taking it, or that has it all and never
//! answers, is given up on with a reason instead of waiting without end (a hung server's kernel
//! still accepts the connection, so TCP keep-alive never fires).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

/// How far an upload has gone, written as the request body is read out.
pub(crate) struct Watch {
    started: Instant,
    /// Bytes handed to the connection so far, and whether that was all of them (atomics:
    /// written by the body stream, read by the watchdog, neither waits on the other). A pipe
    /// (`-`, `<(…)`) has no size to compare with: its end is seen, not computed.
    sent: Arc<AtomicU64>,
    ended: Arc<AtomicBool>,
    /// When the last of them went, in milliseconds since `started`.
    last_ms: Arc<AtomicU64>,
}

/// `file` as a request body, and the watch on it.
pub(crate) fn watched(file: tokio::fs::File) -> (reqwest::Body, Watch) {
    let watch = Watch {
        started: Instant::now(),
        sent: Arc::default(),
        ended: Arc::default(),
        last_ms: Arc::default(),
    };
    let (sent, ended, last_ms, started) = (
        Arc::clone(&watch.sent),
        Arc::clone(&watch.ended),
        Arc::clone(&watch.last_ms),
        watch.started,
    );
    let stream = async_stream::stream! {
        let mut chunks = tokio_util::io::ReaderStream::new(file);
        while let Some(chunk) = chunks.next().await {
            if let Ok(chunk) = &chunk {
                sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                last_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            yield chunk;
        }
        last_ms.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        ended.store(true, Ordering::Release);
    };
    (reqwest::Body::wrap_stream(stream), watch)
}

impl Watch {
    /// Resolves, with why, once the server has taken nothing of the upload for `silence`, or
    /// has had all of it for [`answer_within`] without an answer. Never while it keeps up.
    pub(crate) async fn stalled(&self, silence: Duration) -> anyhow::Error {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let sent = self.sent.load(Ordering::Relaxed);
            let (bound, why) = if self.ended.load(Ordering::Acquire) {
                (
                    answer_within(sent, silence),
                    "has had the whole upload without answering for",
                )
            } else {
                (silence, "has taken no more of the upload for")
            };
            let deadline = self.started + last + bound;
            if Instant::now() >= deadline {
                return anyhow::anyhow!(
                    "the server {why} {} s ({sent} bytes sent): it hangs, or the network to it is \
                     gone",
                    bound.as_secs()
                );
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_secs(1))).await;
        }
    }
}

/// How long a server may take to answer once it has an upload of `size` bytes: its decode
/// bound, twice (the ffmpeg fallback after the in-process decoder) and twice again (a decode
/// may wait for another's turn), and `silence` besides.
fn answer_within(size: u64, silence: Duration) -> Duration {
    4 * gpuhost::audio::decode_timeout(size) + silence
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_upload_nobody_takes_or_answers_is_given_up_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.wav");
        std::fs::write(&path, vec![0u8; 100_000]).unwrap();
        let file = tokio::fs::File::open(&path).await.unwrap();
        let (body, watch) = watched(file);
        let silence = Duration::from_secs(30);
        // Nothing read out: the server takes nothing.
        let why = watch.stalled(silence).await.to_string();
        assert!(
            why.contains("taken no more of the upload for 30 s (0 bytes sent)"),
            "{why}"
        );
        // All of it read out: the server has it and does not answer, for the decode bound of
        // 100 000 bytes (60 s, four times) and the silence.
        let mut stream = http_body_util::BodyDataStream::new(body);
        while let Some(chunk) = stream.next().await {
            chunk.unwrap();
        }
        let before = Instant::now();
        let why = watch.stalled(silence).await.to_string();
        assert!(
            why.contains("whole upload without answering for 270 s (100000 bytes sent)"),
            "{why}"
        );
        assert!(
            before.elapsed() >= Duration::from_secs(269),
            "{:?}",
            before.elapsed()
        );
    }
}
