//! NDJSON responses: one event per line, flushed as it happens, the stream ending with the
//! event that ends the request (`/transcribe`, service starts, leases).

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::protocol::{ClientEvent, GrantEvent};

mod beat;
use beat::{Beat, GrantBeat, JobBeat};

/// An event that goes out as one NDJSON line.
pub(super) trait Event: Sized + Send + 'static {
    /// What the stream remembers to say again after a silence.
    type Beat: Beat<Self>;
    /// Whether the request is over with this event.
    fn is_final(&self) -> bool;
    /// The event as one line, newline included.
    fn to_line(&self) -> String;
}

impl Event for ClientEvent {
    type Beat = JobBeat;
    fn is_final(&self) -> bool {
        ClientEvent::is_final(self)
    }
    fn to_line(&self) -> String {
        ClientEvent::to_line(self)
    }
}

impl Event for GrantEvent {
    type Beat = GrantBeat;
    fn is_final(&self) -> bool {
        GrantEvent::is_final(self)
    }
    fn to_line(&self) -> String {
        GrantEvent::to_line(self)
    }
}

/// The response for a stream of NDJSON chunks (no buffering by proxies either).
pub(super) fn response<S>(stream: S) -> Response
where
    S: Stream<Item = Result<bytes::Bytes, Infallible>> + Send + 'static,
{
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .expect("static headers are valid")
}

/// The events of `rx` as they happen (events that are ready together go out as one chunk),
/// ending with the final one: the client has its answer without waiting for whatever the
/// sender still does afterwards (a job removing its folder).
/// After `heartbeat` without one, the running state is said again (`beat.rs`).
pub(super) fn from_channel<E: Event>(
    rx: mpsc::Receiver<E>,
    heartbeat: std::time::Duration,
) -> Response {
    from_first_and_channel(None, rx, heartbeat)
}

/// `from_channel`, with `first` (an event already taken from `rx`) going out first, and
/// heartbeats after `heartbeat` of silence.
pub(super) fn from_first_and_channel<E: Event>(
    mut first: Option<E>,
    mut rx: mpsc::Receiver<E>,
    heartbeat: std::time::Duration,
) -> Response {
    response(async_stream::stream! {
        let mut beat = E::Beat::default();
        loop {
            let event = match first.take() {
                Some(event) => event,
                None => match tokio::time::timeout(heartbeat, rx.recv()).await {
                    Ok(Some(event)) => event,
                    Ok(None) => break,
                    Err(_) => {
                        let again: String = beat.again().iter().map(Event::to_line).collect();
                        if !again.is_empty() {
                            yield Ok::<_, Infallible>(bytes::Bytes::from(again));
                        }
                        continue;
                    }
                },
            };
            beat.saw(&event);
            let mut last = event.is_final();
            let mut chunk = event.to_line();
            while !last {
                let Ok(next) = rx.try_recv() else { break };
                beat.saw(&next);
                last = next.is_final();
                chunk.push_str(&next.to_line());
            }
            yield Ok::<_, Infallible>(bytes::Bytes::from(chunk));
            if last {
                break;
            }
        }
    })
}
