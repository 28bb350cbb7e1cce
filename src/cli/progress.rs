//! Renders the job's event stream on stderr: a progress bar on a terminal, plain lines elsewhere.

use std::io::{IsTerminal, Write};

use gpuhost::protocol::{ClientEvent, StageStatus};

pub(crate) struct Progress {
    tty: bool,
    verbose: bool,
    /// Whether the cursor sits at the end of a bar line that `\r` may overwrite.
    bar_open: bool,
}

impl Progress {
    pub(crate) fn new(verbose: bool) -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            verbose,
            bar_open: false,
        }
    }

    pub(crate) fn show(&mut self, event: &ClientEvent) {
        let mut err = std::io::stderr().lock();
        match event {
            ClientEvent::Queued {
                position,
                waiting_for,
            } => {
                let why = waiting_for
                    .as_deref()
                    .map(|w| format!(" (the GPU is held by {w})"))
                    .unwrap_or_default();
                self.line(&mut err, &format!("queued: position {position}{why}"))
            }
            ClientEvent::Stage {
                stage,
                status: StageStatus::Started,
                ..
            } => self.line(&mut err, &format!("▸ {stage} …")),
            ClientEvent::Stage {
                stage,
                status: StageStatus::Done,
                seconds,
            } => self.line(
                &mut err,
                &format!("✓ {stage} {:.2} s", seconds.unwrap_or(0.0)),
            ),
            ClientEvent::Stage {
                stage,
                status: StageStatus::CalledOff,
                ..
            } => self.line(&mut err, &format!("✗ {stage} called off")),
            ClientEvent::Progress {
                stage,
                fraction,
                message,
                ..
            } => {
                let f = fraction.unwrap_or(0.0);
                let filled = (f * 30.0).round() as usize;
                let bar = format!(
                    "  {stage} [{}{}] {:>3.0}% {}",
                    "#".repeat(filled),
                    "-".repeat(30 - filled.min(30)),
                    f * 100.0,
                    message.as_deref().unwrap_or("")
                );
                if self.tty {
                    let shown: String = bar.chars().take(120).collect();
                    let _ = write!(err, "\r\x1b[2K{shown}");
                    self.bar_open = true;
                } else {
                    let _ = writeln!(err, "{bar}");
                }
            }
            ClientEvent::Log { stage, line, .. } if self.verbose => {
                self.line(&mut err, &format!("  [{stage}] {line}"))
            }
            ClientEvent::Log { .. } => {}
            ClientEvent::Error { code, message } => {
                self.line(&mut err, &format!("✗ {code}: {message}"))
            }
            ClientEvent::Result { .. } => self.close(&mut err),
        }
        let _ = err.flush();
    }

    fn line(&mut self, err: &mut impl Write, text: &str) {
        self.close(err);
        let _ = writeln!(err, "{text}");
    }

    fn close(&mut self, err: &mut impl Write) {
        if self.bar_open {
            let _ = writeln!(err);
            self.bar_open = false;
        }
    }
}
