//! What a worker says besides its signals: stderr lines logged (and kept for a crash's message)
//! or turned into events, the result file read back, and the exit explained.

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::TaskError;
use super::{Session, EXIT_GRACE, TAIL_LINES};
use crate::process::describe_exit;
use crate::protocol::WorkerEvent;

impl Session {
    /// Logs the stderr lines still in the pipe after the process ended.
    pub(super) async fn drain_tail(&mut self) {
        if let Some(mut rx) = self.stderr.take() {
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(Some(line)) = tokio::time::timeout_at(until, rx.next_line()).await {
                self.log_line(&line, None);
            }
        }
    }

    /// The last stderr lines, each at most [`TAIL_LINE_MAX`] characters: a crash's message, in
    /// `/workers` `last_error` too (twenty lines of 64 KiB made both 1.3 MB).
    pub(in crate::worker) fn tail_text(&self) -> String {
        if self.tail.is_empty() {
            return "(no stderr output)".into();
        }
        self.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub(super) fn crashed(&self, exit: String) -> TaskError {
        TaskError::Crashed {
            worker: self.name.clone(),
            exit,
            tail: self.tail_text(),
        }
    }

    /// The result, read and parsed here when it is small (most are a few KiB: the hop to the
    /// blocking pool and back, two thread wake-ups, cost more than the read), else on a blocking
    /// thread (megabytes of JSON would stall every other request on this runtime thread,
    /// `/health` too).
    pub(super) async fn read_output(&self, output: &Path) -> Result<Value, TaskError> {
        let read = match crate::files::read_regular(output, INLINE_RESULT_MAX) {
            Err(crate::files::ReadError::TooBig { .. }) => {
                let path = output.to_path_buf();
                tokio::task::spawn_blocking(move || read_result(&path))
                    .await
                    .unwrap_or_else(|e| Err(format!("reading the result failed: {e}")))
            }
            small => small
                .map_err(|e| read_error(output, e))
                .and_then(|text| parse_result(output, &text)),
        };
        read.map_err(|reason| TaskError::BadOutput {
            worker: self.name.clone(),
            reason,
        })
    }

    /// After stdout closed: the exit status (killing a process that lingers), with the last
    /// stderr lines collected for the error message.
    pub(super) async fn collect_exit(&mut self) -> String {
        let (status, killed): (Option<ExitStatus>, bool) =
            match self.group.wait_timeout(EXIT_GRACE).await {
                Some(status) => (Some(status), false),
                None => (self.group.kill().await, true),
            };
        self.drain_tail().await;
        let exit = status
            .as_ref()
            .map(describe_exit)
            .unwrap_or_else(|| "unknown exit".into());
        if killed {
            // Not a crash of its own: it stopped talking and stayed up.
            format!(
                "{exit}: its stdout closed, and gpuhost killed it when it had not exited {} s later",
                EXIT_GRACE.as_secs()
            )
        } else {
            exit
        }
    }

    pub(super) fn drain_stderr(&mut self, events: &mpsc::Sender<WorkerEvent>) {
        // The worker flushed these before its signal: they are in the pipe already.
        let Some(mut rx) = self.stderr.take() else {
            return;
        };
        while let Some(line) = rx.ready_line() {
            self.log_line(&line, Some(events));
        }
        self.stderr = Some(rx);
    }

    pub(super) fn log_line(&mut self, line: &str, events: Option<&mpsc::Sender<WorkerEvent>>) {
        let event = WorkerEvent::parse(line);
        if let WorkerEvent::Log { message, .. } = &event {
            if self.tail.len() == TAIL_LINES {
                self.tail.pop_front();
            }
            self.tail
                .push_back(crate::text::cut_middle(message, TAIL_LINE_MAX));
            tracing::debug!(worker = %self.name, "{message}");
        }
        if let Some(events) = events {
            // A slow or vanished client must never stall the worker: drop instead of waiting.
            let _ = events.try_send(event);
        }
    }
}

/// The largest result file read back. A four-hour transcript with every word's times is a few
/// MB; a worker that writes more (a bug) fails its task instead of filling the host's memory (as
/// parsed JSON a file can take 15 times its size: 134 MB of zeros took 4 GB).
const RESULT_MAX: u64 = 64 << 20;

/// The largest result read and parsed on the runtime thread (at most a few hundred µs of it).
const INLINE_RESULT_MAX: u64 = 32 << 10;

/// The JSON object a worker wrote to `output`, or why not. Only a regular file is read (a link
/// to `/dev/zero` or a FIFO would never end), and no more than [`RESULT_MAX`] of it.
fn read_result(output: &Path) -> Result<Value, String> {
    let text = crate::files::read_regular(output, RESULT_MAX).map_err(|e| read_error(output, e))?;
    parse_result(output, &text)
}

fn read_error(output: &Path, e: crate::files::ReadError) -> String {
    match e {
        crate::files::ReadError::Io(e) => format!("cannot read {}: {e}", output.display()),
        crate::files::ReadError::NotRegular => {
            format!("{} is not a regular file", output.display())
        }
        too_big => format!("{} is {too_big}: too big for a result", output.display()),
    }
}

fn parse_result(output: &Path, text: &[u8]) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(text)
        .map_err(|e| format!("{} is not valid JSON: {e}", output.display()))?;
    if !value.is_object() {
        return Err(format!(
            "{} holds a JSON {}, not an object",
            output.display(),
            kind_of(&value)
        ));
    }
    Ok(value)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The longest stderr line kept for a crash's message, in characters.
const TAIL_LINE_MAX: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_file_past_the_limit_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.result.json");
        std::fs::write(&path, br#"{"text": "ok"}"#).unwrap();
        assert_eq!(read_result(&path).unwrap()["text"], "ok");
        // A sparse file: its size says gigabytes, it holds none.
        std::fs::File::create(&path)
            .unwrap()
            .set_len(RESULT_MAX + 1)
            .unwrap();
        let why = read_result(&path).unwrap_err();
        assert!(why.contains("more than the 64 MiB allowed"), "{why}");
        // A link (to a device that never ends) is not followed.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert!(read_result(&path).is_err());
    }

    #[test]
    fn a_long_stderr_line_is_kept_by_its_ends() {
        let line = format!("Error: {}the end", "é".repeat(70_000));
        let kept = crate::text::cut_middle(&line, super::TAIL_LINE_MAX);
        assert!(
            kept.starts_with("Error: ") && kept.ends_with("the end"),
            "{kept}"
        );
        assert!(kept.chars().count() < 1100, "{}", kept.len());
        assert!(kept.contains("characters left out"));
        assert_eq!(
            crate::text::cut_middle("short", super::TAIL_LINE_MAX),
            "short"
        );
    }
}
