//! A service's grant events: broadcast to every caller of its start, with the state the start
//! is in (queued, making room, starting) kept for a caller who joins it midway.

use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::protocol::GrantEvent;

/// Cloned into the actor and its handle; every clone shares one state.
#[derive(Clone)]
pub(crate) struct Announcer {
    sender: broadcast::Sender<GrantEvent>,
    /// The last `queued`, `making_room` or `starting` of the start under way; `None` between
    /// starts. A std mutex: held only to send or subscribe, never across an `.await`, and taken
    /// by both so that a joining caller neither misses an event nor gets one twice.
    now: Arc<Mutex<Option<GrantEvent>>>,
}

impl Announcer {
    pub(crate) fn new() -> Announcer {
        Announcer {
            sender: broadcast::channel(256).0,
            now: Arc::new(Mutex::new(None)),
        }
    }

    pub(crate) fn send(&self, event: GrantEvent) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        match &event {
            GrantEvent::Queued { .. }
            | GrantEvent::MakingRoom { .. }
            | GrantEvent::Starting { .. } => *now = Some(event.clone()),
            GrantEvent::Log { .. } => {}
            _ => *now = None,
        }
        let _ = self.sender.send(event);
    }

    /// The events from here on, and where the start under way is now (if one is): a caller who
    /// joins a start that waits quietly (in the queue, or a service loading for minutes) hears
    /// at once where it is, and from then on every heartbeat.
    pub(crate) fn subscribe(&self) -> (Option<GrantEvent>, broadcast::Receiver<GrantEvent>) {
        let now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        (now.clone(), self.sender.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_subscriber_hears_where_the_start_is_and_nothing_twice() {
        let events = Announcer::new();
        let (now, _) = events.subscribe();
        assert_eq!(now, None);
        events.send(GrantEvent::Queued {
            position: 1,
            waiting_for: Some("job".into()),
        });
        events.send(GrantEvent::Starting { pid: 7 });
        events.send(GrantEvent::Log {
            line: "loading".into(),
        });
        let (now, mut rx) = events.subscribe();
        assert_eq!(now, Some(GrantEvent::Starting { pid: 7 }));
        assert!(rx.try_recv().is_err(), "nothing sent before it joined");
        events.send(GrantEvent::Healthy {
            pid: Some(7),
            seconds: 1.0,
        });
        assert!(rx.try_recv().unwrap().is_final());
        assert_eq!(events.subscribe().0, None, "the start is over");
    }
}
