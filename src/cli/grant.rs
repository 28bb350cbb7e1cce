//! Reading a grant's event stream (`POST /gpu/lease`, a service's start) as a client command:
//! the waiting (queued, making room) said on stderr once each, the rest handed to the caller.

use anyhow::Context;
use futures_util::Stream;
use gpuhost::protocol::GrantEvent;

type Chunks = std::pin::Pin<Box<dyn Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// The NDJSON events of one grant's response, in order.
pub(crate) struct GrantEvents {
    chunks: Chunks,
    buf: Vec<u8>,
    /// Who the waiting lines are said for (`gpuhost lease`, a service's name).
    who: String,
    /// The last waiting state shown: the server says it again every heartbeat, shown once.
    shown: Option<GrantEvent>,
}

impl GrantEvents {
    pub(crate) fn new(response: reqwest::Response, who: &str) -> GrantEvents {
        GrantEvents {
            chunks: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
            who: who.to_string(),
            shown: None,
        }
    }

    /// The next event that is not a waiting state (`Ok(None)`: the stream ended); waiting
    /// states are said on stderr, a new one each time it changes.
    pub(crate) async fn next(&mut self) -> anyhow::Result<Option<GrantEvent>> {
        loop {
            while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let event: GrantEvent =
                    serde_json::from_slice(&line).context("a malformed event")?;
                if !self.said(&event) {
                    return Ok(Some(event));
                }
            }
            match super::next_chunk(&mut self.chunks).await? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }

    /// Says `event` when it is a waiting state not shown last (true: the caller need not see
    /// it). `Starting` is the caller's to say, but a repeat of it is skipped here too.
    fn said(&mut self, event: &GrantEvent) -> bool {
        let waiting = matches!(
            event,
            GrantEvent::Queued { .. } | GrantEvent::MakingRoom { .. } | GrantEvent::Starting { .. }
        );
        if !waiting {
            return false;
        }
        if super::said_again(&mut self.shown, event) {
            return true;
        }
        let who = &self.who;
        match event {
            GrantEvent::Queued {
                position,
                waiting_for,
            } => gpuhost::say!(
                "{who}: queued, position {position}{}",
                waiting_for
                    .as_ref()
                    .map(|w| format!(" (waiting for {})", super::shown(w)))
                    .unwrap_or_default()
            ),
            GrantEvent::MakingRoom { action, target } => {
                gpuhost::say!(
                    "{who}: making room: {}",
                    super::shown(&format!("{action} {target}"))
                )
            }
            _ => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::GrantEvents;
    use gpuhost::protocol::GrantEvent;

    fn response(body: &str) -> reqwest::Response {
        reqwest::Response::from(axum::http::Response::new(body.to_string()))
    }

    #[tokio::test]
    async fn waiting_states_are_said_once_and_the_rest_handed_on() {
        let body = concat!(
            "{\"type\":\"queued\",\"position\":1}\n",
            "{\"type\":\"queued\",\"position\":1}\n",
            "{\"type\":\"starting\",\"pid\":7}\n",
            "{\"type\":\"starting\",\"pid\":7}\n",
            "{\"type\":\"healthy\",\"pid\":7,\"seconds\":0.5}\n",
        );
        let mut events = GrantEvents::new(response(body), "llm");
        assert!(matches!(
            events.next().await.unwrap(),
            Some(GrantEvent::Starting { pid: 7 })
        ));
        assert!(matches!(
            events.next().await.unwrap(),
            Some(GrantEvent::Healthy { .. })
        ));
        assert!(events.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_malformed_event_is_an_error() {
        let mut events = GrantEvents::new(response("{\"type\":\"nope\"}\n"), "llm");
        let why = events.next().await.unwrap_err().to_string();
        assert!(why.contains("malformed"), "{why}");
    }
}
