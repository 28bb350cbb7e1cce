//! Drops a connection whose client stops reading: a write that cannot proceed for
//! `[http] send_timeout_s` (the client's receive window and our send buffer full) fails, and
//! hyper closes the connection. Without it, a client that pipelines requests and never reads the
//! answers holds its connection slot forever. Only a blocked write counts: a stream that is
//! quiet because it has nothing to send (a job waiting in the queue) is not timed.
//!
//! A slow reader that keeps reading must not look stalled: with a large send buffer the kernel
//! wakes a blocked writer only once much of it has drained, which at 20 KB/s can take longer
//! than the limit. So when the clock runs out, the socket's send queue is asked (`TIOCOUTQ`): if
//! it shrank since the clock started, the client is reading, and the clock starts again. (The
//! kernel keeps its large buffer: an answer handed to it is delivered even after hyper closes.)

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How much of what was written still waits in the kernel for the client, if that can be known.
pub(super) trait Backlog {
    fn backlog(&self) -> Option<u64>;
}

impl Backlog for tokio::net::TcpStream {
    fn backlog(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int through the pointer; the socket is ours.
        let rc = unsafe { libc::ioctl(self.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
        (rc == 0).then_some(queued.max(0) as u64)
    }
}

pub(super) struct WriteStall<T> {
    inner: T,
    limit: Duration,
    /// Running while a write waits on the client: set at the first `Pending` (with the send
    /// queue's length then), cleared by progress.
    blocked: Option<(Pin<Box<Sleep>>, Option<u64>)>,
}

impl<T: Backlog> WriteStall<T> {
    pub(super) fn new(inner: T, limit: Duration) -> WriteStall<T> {
        WriteStall {
            inner,
            limit,
            blocked: None,
        }
    }

    /// `result` of a write-side call, with the stall clock started, checked or cleared.
    fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if result.is_ready() {
            self.blocked = None;
            return result;
        }
        let limit = self.limit;
        loop {
            let backlog = self.inner.backlog();
            let (clock, queued) = self
                .blocked
                .get_or_insert_with(|| (Box::pin(tokio::time::sleep(limit)), backlog));
            if clock.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            match (*queued, backlog) {
                // The client took some in meanwhile: slow, not stalled.
                (Some(then), Some(now)) if now < then => self.blocked = None,
                _ => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client took in nothing of the answer for send_timeout_s",
                    )))
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin + Backlog> AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin + Backlog> AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.timed(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// An in-memory pipe has no kernel queue to ask.
    impl Backlog for tokio::io::DuplexStream {
        fn backlog(&self) -> Option<u64> {
            None
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_reads_fails_after_the_limit() {
        // A pipe of 64 bytes whose other end is never read: writes block once it is full.
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut stalled = WriteStall::new(ours, Duration::from_secs(60));
        stalled.write_all(&[0; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        let err = stalled.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_never_cut_off() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut writer = WriteStall::new(ours, Duration::from_secs(60));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 64 * 20 {
                tokio::time::sleep(Duration::from_secs(50)).await;
                total += tokio::io::AsyncReadExt::read(&mut theirs, &mut buf)
                    .await
                    .unwrap();
            }
        });
        // Each write waits 50 s for the reader, under the limit each time: 1000 s in all.
        for _ in 0..20 {
            writer.write_all(&[1; 64]).await.unwrap();
        }
        reader.await.unwrap();
    }
}
