//! Where log lines go: a bounded queue and a thread of their own that writes them to stderr. A
//! stderr nobody reads (a paused terminal, a stalled journal, a full pipe) must cost log lines,
//! never the host: written from the async runtime, the first blocked write stopped every
//! request, `/health` included.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// Log lines held while stderr does not take them; past it new lines are dropped and counted.
const QUEUE_LINES: usize = 4096;

/// What the log thread is given.
enum Message {
    Line(Vec<u8>),
    /// This many lines were dropped here (the queue was full).
    Lost(u64),
    /// Answer once everything queued before is written.
    Flush(SyncSender<()>),
}

/// The `MakeWriter` for `tracing_subscriber`: each event is formatted into a buffer of its own
/// and queued whole when the buffer is dropped.
pub struct NonBlocking {
    queue: SyncSender<Message>,
    dropped: Arc<AtomicU64>,
}

/// Kept by `main` until exit: dropping it writes what is queued, waiting at most a second (a
/// stderr nobody reads does not hold up the exit).
pub struct Flush {
    queue: SyncSender<Message>,
}

impl Flush {
    /// Returns once every line queued before it is written, or after a second: for a line
    /// written to stderr directly that must come after them (`gpuhost listening on …`, which
    /// scripts wait for).
    pub fn now(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        let (ack, written) = sync_channel(1);
        let mut message = Message::Flush(ack);
        loop {
            match self.queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let _ = written.recv_timeout(left);
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.now();
    }
}

/// A writer to `out` (stderr in `main`) through the queue, and what flushes it at exit.
pub fn non_blocking<W: Write + Send + 'static>(out: W) -> (NonBlocking, Flush) {
    let (queue, messages) = sync_channel::<Message>(QUEUE_LINES);
    let dropped = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&dropped);
    let spawned = std::thread::Builder::new()
        .name("gpuhost-log".into())
        .spawn(move || write_all(out, &messages, &counted));
    if spawned.is_err() {
        crate::say!("gpuhost: cannot start the log thread; log lines are dropped");
    }
    (
        NonBlocking {
            queue: queue.clone(),
            dropped,
        },
        Flush { queue },
    )
}

/// The log thread: each line as it comes, with a count of those lost before it.
fn write_all<W: Write>(mut out: W, messages: &Receiver<Message>, dropped: &AtomicU64) {
    let say_lost = |out: &mut W, lost: u64| {
        if lost > 0 {
            let _ = writeln!(
                out,
                "gpuhost: {lost} log lines dropped (stderr was not read)"
            );
        }
    };
    while let Ok(message) = messages.recv() {
        match message {
            Message::Line(line) => {
                let _ = out.write_all(&line);
            }
            Message::Lost(lost) => say_lost(&mut out, lost),
            Message::Flush(ack) => {
                // Lines lost last, with nothing queued after them to carry the count.
                say_lost(&mut out, dropped.swap(0, Ordering::Relaxed));
                let _ = out.flush();
                let _ = ack.send(());
            }
        }
        let _ = out.flush();
    }
}

/// One event's text, queued when dropped.
pub struct Line<'a> {
    buf: Vec<u8>,
    owner: &'a NonBlocking,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let owner = self.owner;
        // Lines dropped before this one are said where they were lost, before it.
        // Taken whole (another thread logging at once must not say or subtract it too), and
        // given back with this line when it cannot be said yet.
        let lost = owner.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 && owner.queue.try_send(Message::Lost(lost)).is_err() {
            owner.dropped.fetch_add(lost + 1, Ordering::Relaxed);
            return;
        }
        if owner
            .queue
            .try_send(Message::Line(std::mem::take(&mut self.buf)))
            .is_err()
        {
            owner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for NonBlocking {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            buf: Vec::new(),
            owner: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    /// A stderr that takes nothing until told to.
    struct Stalled(Arc<std::sync::Mutex<Vec<u8>>>, Receiver<()>);

    impl Write for Stalled {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.1.recv();
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stderr_costs_lines_not_the_caller() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (go, wait) = sync_channel(0);
        let (writer, flush) = non_blocking(Stalled(Arc::clone(&seen), wait));
        let started = std::time::Instant::now();
        for i in 0..QUEUE_LINES + 100 {
            writeln!(writer.make_writer(), "line {i}").unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "logging waited for stderr"
        );
        // Let it write: what was kept comes out, then how many were lost, then what follows.
        std::thread::spawn(move || while go.send(()).is_ok() {});
        let last = format!("line {}\n", QUEUE_LINES - 1);
        let text = || String::from_utf8(seen.lock().unwrap().clone()).unwrap();
        while !text().contains(&last) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the queue never drained"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        writeln!(writer.make_writer(), "after").unwrap();
        drop(writer);
        drop(flush);
        let text = text();
        assert!(text.starts_with("line 0\n"), "{}", &text[..40]);
        // (The thread may hold one line when it stalls, so the queue keeps one more than its size.)
        assert!(
            text.ends_with(" log lines dropped (stderr was not read)\nafter\n"),
            "{}",
            &text[text.len() - 200..]
        );
        let kept = text.lines().filter(|l| l.starts_with("line ")).count();
        let lost: usize = text
            .lines()
            .find_map(|l| l.strip_prefix("gpuhost: ")?.split(' ').next()?.parse().ok())
            .unwrap();
        assert_eq!(kept + lost, QUEUE_LINES + 100);
    }
}
