//! A service's grant events: broadcast to every caller of its start, with the state the start
//! is in (queued, making room, starting) kept for a caller who joins it midway, and a count of
//! the starts that have ended, so that a caller whose outcome was already sent starts nothing.

use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::protocol::GrantEvent;

/// Cloned into the actor and its handle; every clone shares one state.
#[derive(Clone)]
pub(crate) struct Announcer {
    sender: broadcast::Sender<GrantEvent>,
    /// A std mutex: held only to send or subscribe, never across an `.await`, and taken by both
    /// so that a joining caller neither misses an event nor gets one twice.
    now: Arc<Mutex<Now>>,
}

#[derive(Default)]
struct Now {
    /// The last `queued`, `making_room` or `starting` of the start under way; `None` between
    /// starts and while a failed one is torn down.
    state: Option<GrantEvent>,
    /// Starts that have ended (final events sent).
    ended: u64,
    /// A failed start is being torn down: its final `error` is still to come, and a caller who
    /// joins now is not one of its callers (it wants the next start).
    ending: bool,
}

impl Now {
    /// Where the start is once `event` is sent.
    fn note(&mut self, event: &GrantEvent) {
        match event {
            GrantEvent::Queued { .. }
            | GrantEvent::MakingRoom { .. }
            | GrantEvent::Starting { .. } => self.state = Some(event.clone()),
            GrantEvent::Log { .. } => {}
            _ => {
                self.state = None;
                self.ending = false;
                self.ended += 1;
            }
        }
    }
}

/// What a caller of a start gets: the events, and where it stands.
pub(crate) struct Joined {
    /// Where the start under way is now, to say first (a caller who joins a start that waits
    /// quietly, in the queue or loading for minutes, hears at once and then every heartbeat).
    pub(crate) now: Option<GrantEvent>,
    pub(crate) events: broadcast::Receiver<GrantEvent>,
    /// The next final event ends the failed start being torn down, not this caller's: skip it.
    pub(crate) skip_final: bool,
    /// How many starts will have ended before this caller's: its start request is stale (its
    /// answer was sent) once more than that have.
    pub(crate) ticket: u64,
}

impl Announcer {
    pub(crate) fn new() -> Announcer {
        Announcer {
            sender: broadcast::channel(256).0,
            now: Arc::new(Mutex::new(Now::default())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Now> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn send(&self, event: GrantEvent) {
        let mut now = self.lock();
        now.note(&event);
        let _ = self.sender.send(event);
    }

    /// Sends the final `event` when no caller listens any more (a caller's stream ends when
    /// its client leaves); whether it did. Under the lock a joining caller takes: one who
    /// joins now is heard, not told its start was given up.
    pub(crate) fn end_if_unheard(&self, event: GrantEvent) -> bool {
        let mut now = self.lock();
        if self.sender.receiver_count() > 0 {
            return false;
        }
        now.note(&event);
        let _ = self.sender.send(event);
        true
    }

    /// A failed start's teardown begins; its `error` follows when the process is gone.
    pub(crate) fn ending(&self) {
        let mut now = self.lock();
        now.state = None;
        now.ending = true;
    }

    pub(crate) fn subscribe(&self) -> Joined {
        let now = self.lock();
        Joined {
            now: now.state.clone(),
            events: self.sender.subscribe(),
            skip_final: now.ending,
            ticket: now.ended + u64::from(now.ending),
        }
    }

    /// Whether a start asked for with `ticket` has had its answer already (it joined a start
    /// that has ended since, failed most likely): then it starts nothing, nobody would listen.
    pub(crate) fn answered(&self, ticket: u64) -> bool {
        ticket < self.lock().ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_subscriber_hears_where_the_start_is_and_nothing_twice() {
        let events = Announcer::new();
        assert_eq!(events.subscribe().now, None);
        events.send(GrantEvent::Queued {
            position: 1,
            waiting_for: Some("job".into()),
        });
        events.send(GrantEvent::Starting { pid: 7 });
        events.send(GrantEvent::Log {
            line: "loading".into(),
        });
        let mut joined = events.subscribe();
        assert_eq!(joined.now, Some(GrantEvent::Starting { pid: 7 }));
        assert!(!joined.skip_final);
        assert!(
            joined.events.try_recv().is_err(),
            "nothing sent before it joined"
        );
        events.send(GrantEvent::Healthy {
            pid: Some(7),
            seconds: 1.0,
        });
        assert!(joined.events.try_recv().unwrap().is_final());
        assert_eq!(events.subscribe().now, None, "the start is over");
    }

    #[test]
    fn a_caller_joining_a_failed_starts_teardown_waits_for_the_next_start() {
        let events = Announcer::new();
        let during = events.subscribe();
        events.send(GrantEvent::Starting { pid: 7 });
        events.ending();
        let late = events.subscribe();
        assert_eq!(late.now, None, "not the dying process's `starting`");
        assert!(late.skip_final);
        events.send(GrantEvent::Error {
            code: "service_timeout".into(),
            message: "not healthy".into(),
        });
        // The first caller got its answer: its queued start request starts nothing. The one
        // who joined during the teardown still wants a start.
        assert!(events.answered(during.ticket));
        assert!(!events.answered(late.ticket));
        assert!(!events.answered(events.subscribe().ticket));
    }
}
