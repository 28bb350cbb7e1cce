//! Renders the job's event stream on stderr: one `indicatif` bar per running stage on a terminal
//! (parallel stages each get their own), plain lines elsewhere.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use gpuhost::protocol::{ClientEvent, StageStatus};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Bar positions are thousandths of the stage.
const STEPS: u64 = 1000;

pub(crate) struct Progress {
    /// `Some` on a terminal: the bars, drawn below the lines printed through it.
    bars: Option<MultiProgress>,
    /// The bar of each stage that has reported progress and not finished.
    running: HashMap<String, ProgressBar>,
    verbose: bool,
    /// The last place in the queue shown: the server says it again while the wait lasts.
    queued: Option<ClientEvent>,
}

impl Progress {
    pub(crate) fn new(verbose: bool) -> Progress {
        let bars = std::io::stderr()
            .is_terminal()
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Progress {
            bars,
            running: HashMap::new(),
            verbose,
            queued: None,
        }
    }

    pub(crate) fn show(&mut self, event: &ClientEvent) {
        match event {
            ClientEvent::Queued { .. } if super::said_again(&mut self.queued, event) => {}
            ClientEvent::Queued {
                position,
                waiting_for,
            } => {
                let why = waiting_for
                    .as_deref()
                    .map(|w| format!(" (the GPU is held by {w})"))
                    .unwrap_or_default();
                self.line(&format!("queued: position {position}{why}"))
            }
            ClientEvent::Stage {
                stage,
                status: StageStatus::Started,
                ..
            } => self.line(&format!("▸ {stage} …")),
            ClientEvent::Stage {
                stage,
                status: StageStatus::Done,
                seconds,
            } => {
                self.finish(stage);
                self.line(&format!("✓ {stage} {:.2} s", seconds.unwrap_or(0.0)))
            }
            ClientEvent::Stage {
                stage,
                status: StageStatus::CalledOff,
                ..
            } => {
                self.finish(stage);
                self.line(&format!("✗ {stage} called off"))
            }
            ClientEvent::Progress {
                stage,
                fraction,
                message,
                ..
            } => self.progress(stage, fraction.unwrap_or(0.0), message.as_deref()),
            ClientEvent::Log { stage, line, .. } if self.verbose => {
                self.line(&format!("  [{stage}] {line}"))
            }
            ClientEvent::Log { .. } => {}
            // The command ends with the error as its own last line: said once, not twice.
            ClientEvent::Error { .. } => self.clear(),
            ClientEvent::Result { .. } => self.clear(),
        }
    }

    fn progress(&mut self, stage: &str, fraction: f64, message: Option<&str>) {
        let message = message.map(super::shown);
        let message = message.as_deref();
        let Some(bars) = &self.bars else {
            let filled = ((fraction * 30.0).round() as usize).min(30);
            let bar = format!(
                "  {stage} [{}{}] {:>3.0}% {}",
                "#".repeat(filled),
                "-".repeat(30 - filled),
                fraction * 100.0,
                message.unwrap_or("")
            );
            return self.line(&bar);
        };
        let bar = self.running.entry(stage.to_string()).or_insert_with(|| {
            let style = ProgressStyle::with_template(
                "  {prefix} [{bar:30.cyan/blue}] {percent:>3}% {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("#>-");
            let bar = bars.add(ProgressBar::new(STEPS).with_style(style));
            bar.set_prefix(stage.to_string());
            bar
        });
        bar.set_position((fraction.clamp(0.0, 1.0) * STEPS as f64).round() as u64);
        bar.set_message(message.unwrap_or("").to_string());
    }

    fn finish(&mut self, stage: &str) {
        if let Some(bar) = self.running.remove(stage) {
            bar.finish_and_clear();
        }
    }

    fn clear(&mut self) {
        for (_, bar) in self.running.drain() {
            bar.finish_and_clear();
        }
    }

    /// A line above the bars (or a plain line when stderr is not a terminal), with what the
    /// server sent in it escaped (`shown`).
    fn line(&self, text: &str) {
        let text = super::shown(text);
        match &self.bars {
            Some(bars) if !self.running.is_empty() => {
                let _ = bars.println(text);
            }
            _ => {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{text}");
                let _ = err.flush();
            }
        }
    }
}
