//! Reads a child's pipe as lines of bounded length, so a 1 MB progress line or a missing final
//! newline can neither exhaust memory nor lose data. `next_line` is cancel-safe, so the session
//! can `select!` over stdout and stderr and keep their order.

use futures_util::FutureExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Longest line kept; the rest of a longer line is dropped and its length noted.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

pub struct LineReader<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    dropped: usize,
    eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(pipe: R) -> LineReader<R> {
        LineReader {
            reader: BufReader::with_capacity(64 * 1024, pipe),
            line: Vec::with_capacity(256),
            dropped: 0,
            eof: false,
        }
    }

    /// The next line without its newline (`\r\n` too); `None` at EOF. A last line without a
    /// newline is returned at EOF. Cancel-safe: all state lives in `self`, and the only await is
    /// `fill_buf`, which consumes nothing.
    pub async fn next_line(&mut self) -> Option<String> {
        loop {
            if self.eof {
                return None;
            }
            let buf = match self.reader.fill_buf().await {
                Ok(buf) => buf,
                Err(_) => &[],
            };
            if buf.is_empty() {
                self.eof = true;
                if self.line.is_empty() && self.dropped == 0 {
                    return None;
                }
                return Some(self.take_line());
            }
            let newline = buf.iter().position(|&b| b == b'\n');
            let chunk = &buf[..newline.unwrap_or(buf.len())];
            let take = MAX_LINE_BYTES
                .saturating_sub(self.line.len())
                .min(chunk.len());
            self.line.extend_from_slice(&chunk[..take]);
            self.dropped += chunk.len() - take;
            let used = chunk.len() + usize::from(newline.is_some());
            self.reader.consume(used);
            if newline.is_some() {
                return Some(self.take_line());
            }
        }
    }

    /// A line that is already readable without waiting, if any.
    pub fn ready_line(&mut self) -> Option<String> {
        self.next_line().now_or_never().flatten()
    }

    fn take_line(&mut self) -> String {
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        let mut text = String::from_utf8_lossy(&self.line).into_owned();
        if self.dropped > 0 {
            text.push_str(&format!(" … [{} more bytes dropped]", self.dropped));
        }
        self.line.clear();
        self.dropped = 0;
        text
    }
}

/// Reads from an optional pipe; once it closes it is set to `None` and never polled again
/// (pending forever), so a `select!` over several pipes keeps working after one ends.
pub async fn next_line_opt<R: AsyncRead + Unpin>(
    reader: &mut Option<LineReader<R>>,
) -> Option<String> {
    match reader {
        Some(inner) => match inner.next_line().await {
            Some(line) => Some(line),
            None => {
                *reader = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(input: Vec<u8>) -> Vec<String> {
        let mut reader = LineReader::new(std::io::Cursor::new(input));
        let mut out = Vec::new();
        while let Some(line) = reader.next_line().await {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_and_keeps_partial_tail() {
        let lines = collect(b"ready\r\nhello\npartial".to_vec()).await;
        assert_eq!(lines, ["ready", "hello", "partial"]);
    }

    #[tokio::test]
    async fn caps_huge_lines() {
        let mut input = vec![b'x'; 1_000_000];
        input.extend_from_slice(b"\ndone\n");
        let lines = collect(input).await;
        assert_eq!(lines.len(), 2);
        assert!(lines[0].len() < MAX_LINE_BYTES + 64);
        assert!(lines[0].ends_with(&format!(
            "[{} more bytes dropped]",
            1_000_000 - MAX_LINE_BYTES
        )));
        assert_eq!(lines[1], "done");
    }

    #[tokio::test]
    async fn partial_line_survives_cancellation() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut reader = LineReader::new(rx);
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"half a li")
            .await
            .unwrap();
        // Cancelled mid-line: nothing may be lost.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), reader.next_line())
                .await
                .is_err()
        );
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"ne\n")
            .await
            .unwrap();
        assert_eq!(reader.next_line().await.as_deref(), Some("half a line"));
    }
}
