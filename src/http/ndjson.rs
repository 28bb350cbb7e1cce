//! NDJSON responses: one event per line, flushed as it happens, the stream ending with the
//! event that ends the request (`/transcribe`, service starts, leases).

use std::convert::Infallible;

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::protocol::{ClientEvent, GrantEvent};

/// An event that goes out as one NDJSON line.
pub(super) trait Event: Send + 'static {
    /// Whether the request is over with this event.
    fn is_final(&self) -> bool;
    /// The event as one line, newline included.
    fn to_line(&self) -> String;
}

impl Event for ClientEvent {
    fn is_final(&self) -> bool {
        ClientEvent::is_final(self)
    }
    fn to_line(&self) -> String {
        ClientEvent::to_line(self)
    }
}

impl Event for GrantEvent {
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
pub(super) fn from_channel<E: Event>(rx: mpsc::Receiver<E>) -> Response {
    from_first_and_channel(None, rx)
}

/// `from_channel`, with `first` (an event already taken from `rx`) going out first.
pub(super) fn from_first_and_channel<E: Event>(
    mut first: Option<E>,
    mut rx: mpsc::Receiver<E>,
) -> Response {
    response(async_stream::stream! {
        loop {
            let event = match first.take() {
                Some(event) => event,
                None => match rx.recv().await {
                    Some(event) => event,
                    None => break,
                },
            };
            let mut last = event.is_final();
            let mut chunk = event.to_line();
            while !last {
                let Ok(next) = rx.try_recv() else { break };
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
