//! Reads a child's pipe as lines of bounded length and forwards them over a channel, so a
//! 1 MB progress line or a missing final newline can neither exhaust memory nor lose data.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;

/// Longest line kept; the rest of a longer line is dropped and its length noted.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Spawns a task that forwards each line of `pipe` (without its newline) until EOF.
/// The channel closes at EOF; a closed receiver stops the task (the pipe is then dropped).
pub fn forward_lines<R>(pipe: R, capacity: usize) -> mpsc::Receiver<String>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(capacity);
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(64 * 1024, pipe);
        let mut line = Vec::with_capacity(256);
        let mut dropped = 0usize;
        while let Ok(buf) = reader.fill_buf().await {
            if buf.is_empty() {
                break;
            }
            let (chunk, newline) = match memchr(buf) {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            let room = MAX_LINE_BYTES.saturating_sub(line.len());
            let take = room.min(chunk.len());
            line.extend_from_slice(&chunk[..take]);
            dropped += chunk.len() - take;
            let used = chunk.len() + usize::from(newline);
            reader.consume(used);
            if newline && tx.send(finish(&mut line, &mut dropped)).await.is_err() {
                return;
            }
        }
        if !line.is_empty() || dropped > 0 {
            let _ = tx.send(finish(&mut line, &mut dropped)).await;
        }
    });
    rx
}

fn memchr(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n')
}

fn finish(line: &mut Vec<u8>, dropped: &mut usize) -> String {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    let mut text = String::from_utf8_lossy(line).into_owned();
    if *dropped > 0 {
        text.push_str(&format!(" … [{} more bytes dropped]", *dropped));
    }
    line.clear();
    *dropped = 0;
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(input: Vec<u8>) -> Vec<String> {
        let mut rx = forward_lines(std::io::Cursor::new(input), 8);
        let mut out = Vec::new();
        while let Some(line) = rx.recv().await {
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
}
