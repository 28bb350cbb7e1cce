//! Heartbeats of an NDJSON stream: when nothing was sent for a while (a diarizer's long silent
//! stretch, a long wait in the queue), what is still going on is said again, so a client or a
//! proxy with a read timeout keeps the stream. Only events that are safe to repeat are sent:
//! the last `queued`, and a `progress` per running stage with its last fraction and message;
//! on a grant stream the last `queued`, `making_room` or `starting`.

use crate::protocol::{ClientEvent, GrantEvent, StageStatus};

/// What a stream remembers to say again.
pub(in crate::http) trait Beat<E>: Default + Send + 'static {
    /// Notes an event that went out.
    fn saw(&mut self, event: &E);
    /// The events to send after a silence.
    fn again(&self) -> Vec<E>;
}

/// A job's stream: its place in the queue, then its running stages.
#[derive(Default)]
pub(in crate::http) struct JobBeat {
    queued: Option<ClientEvent>,
    /// Running stages, in the order they started: last fraction and message.
    running: Vec<(String, Option<f64>, Option<String>)>,
}

impl Beat<ClientEvent> for JobBeat {
    fn saw(&mut self, event: &ClientEvent) {
        match event {
            ClientEvent::Queued { .. } => self.queued = Some(event.clone()),
            ClientEvent::Stage {
                stage,
                status: StageStatus::Started,
                ..
            } => {
                self.queued = None;
                self.running.retain(|(s, ..)| s != stage);
                self.running.push((stage.clone(), None, None));
            }
            ClientEvent::Stage { stage, .. } => self.running.retain(|(s, ..)| s != stage),
            ClientEvent::Progress {
                stage,
                fraction,
                message,
                ..
            } => {
                if let Some(entry) = self.running.iter_mut().find(|(s, ..)| s == stage) {
                    entry.1 = fraction.or(entry.1);
                    entry.2 = message.clone().or(entry.2.take());
                }
            }
            ClientEvent::Log { .. } | ClientEvent::Result { .. } | ClientEvent::Error { .. } => {}
        }
    }

    fn again(&self) -> Vec<ClientEvent> {
        if !self.running.is_empty() {
            return self
                .running
                .iter()
                .map(|(stage, fraction, message)| ClientEvent::Progress {
                    stage: stage.clone(),
                    fraction: *fraction,
                    message: message.clone(),
                    partial: None,
                })
                .collect();
        }
        self.queued.iter().cloned().collect()
    }
}

/// A grant's stream (a lease waiting with `wait`, a service start): where it is, said again
/// while it stays there: its place in the queue, the room being made, the service starting (a
/// quiet service may load for minutes before its health URL answers).
#[derive(Default)]
pub(in crate::http) struct GrantBeat {
    state: Option<GrantEvent>,
}

impl Beat<GrantEvent> for GrantBeat {
    fn saw(&mut self, event: &GrantEvent) {
        match event {
            GrantEvent::Queued { .. }
            | GrantEvent::MakingRoom { .. }
            | GrantEvent::Starting { .. } => self.state = Some(event.clone()),
            // A service's log line is no change of state.
            GrantEvent::Log { .. } => {}
            _ => self.state = None,
        }
    }

    fn again(&self) -> Vec<GrantEvent> {
        self.state.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, status: StageStatus) -> ClientEvent {
        ClientEvent::Stage {
            stage: name.into(),
            status,
            seconds: None,
        }
    }

    fn progress(name: &str, fraction: Option<f64>, message: Option<&str>) -> ClientEvent {
        ClientEvent::Progress {
            stage: name.into(),
            fraction,
            message: message.map(String::from),
            partial: None,
        }
    }

    #[test]
    fn a_silence_repeats_the_queue_place_then_each_running_stage() {
        let mut beat = JobBeat::default();
        assert!(beat.again().is_empty());
        let queued = ClientEvent::Queued {
            position: 2,
            waiting_for: None,
        };
        beat.saw(&queued);
        assert_eq!(beat.again(), [queued]);
        beat.saw(&stage("diarizer", StageStatus::Started));
        beat.saw(&stage("asr", StageStatus::Started));
        beat.saw(&ClientEvent::Progress {
            stage: "diarizer".into(),
            fraction: Some(0.25),
            message: Some("window 4/1439".into()),
            partial: Some(serde_json::json!({"text": "not again"})),
        });
        beat.saw(&progress("diarizer", None, None));
        assert_eq!(
            beat.again(),
            [
                progress("diarizer", Some(0.25), Some("window 4/1439")),
                progress("asr", None, None)
            ]
        );
        beat.saw(&stage("asr", StageStatus::Done));
        assert_eq!(
            beat.again(),
            [progress("diarizer", Some(0.25), Some("window 4/1439"))]
        );
        beat.saw(&stage("diarizer", StageStatus::CalledOff));
        assert!(beat.again().is_empty());
    }

    #[test]
    fn a_grant_stream_repeats_where_it_is_until_its_end() {
        let mut beat = GrantBeat::default();
        assert!(beat.again().is_empty());
        let starting = GrantEvent::Starting { pid: 7 };
        beat.saw(&starting);
        beat.saw(&GrantEvent::Log {
            line: "loading".into(),
        });
        assert_eq!(beat.again(), [starting]);
        beat.saw(&GrantEvent::Healthy {
            pid: Some(7),
            seconds: 1.0,
        });
        assert!(beat.again().is_empty());
    }
}
