//! A connection's read side, with what was read ahead while a job ran: a client that sends its
//! next request early and then hangs up is seen hanging up only once its early bytes are out of
//! the socket (the end of the stream waits behind them, and behind a full window).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// The most a connection reads ahead while its job runs; past it the job runs to its end.
const READ_AHEAD_MAX: usize = 1 << 20;

pub(super) struct ReadSide {
    /// Read ahead and not yet consumed, from `at` on.
    ahead: Vec<u8>,
    at: usize,
    socket: OwnedReadHalf,
}

impl ReadSide {
    pub(super) fn new(socket: OwnedReadHalf) -> ReadSide {
        ReadSide {
            ahead: Vec::new(),
            at: 0,
            socket,
        }
    }

    /// Completes when the client hangs up (the end of the stream, or an error), reading what it
    /// sends meanwhile into the read-ahead, which later reads get first. Pending for good once
    /// `READ_AHEAD_MAX` is held. Cancel-safe: a read cut off takes nothing from the socket.
    pub(super) async fn hung_up(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        while self.ahead.len() < READ_AHEAD_MAX {
            match self.socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => self.ahead.extend_from_slice(&buf[..n]),
            }
        }
        std::future::pending().await
    }
}

impl AsyncRead for ReadSide {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.ahead.len() {
            let n = buf.remaining().min(this.ahead.len() - this.at);
            buf.put_slice(&this.ahead[this.at..this.at + n]);
            this.at += n;
            if this.at == this.ahead.len() {
                // Its memory goes too: an idle connection holds none.
                this.ahead = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.socket).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn bytes_read_ahead_come_first_and_the_hangup_behind_them_is_seen() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (read, _write) = server.into_split();
        let mut side = ReadSide::new(read);
        // More than a socket's window, then gone.
        let sent: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            drop(client);
            sent
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), side.hung_up())
            .await
            .expect("the hangup is seen");
        let sent = writer.await.unwrap();
        let mut got = Vec::new();
        side.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, sent);
    }
}
