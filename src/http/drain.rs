//! Refusals reach clients that send their whole upload before reading: the unread rest of a
//! refused request's body is read and dropped after the answer goes out (a lingering close).
//!
//! A client like Python's urllib writes the entire body first. When the host answers early (a
//! wrong token, a full queue, a bad option) and closes the connection with unread data, the
//! kernel resets it and the client sees a broken pipe instead of the error. One layer around the
//! whole router covers every such refusal, whichever middleware or handler made it: the answer is
//! sent at once, and a background task keeps reading the rest so the connection closes cleanly.
//! That task is bounded in bytes, in time and in number, so a client that trickles a refused body
//! (no token needed) holds nothing for long: past a bound the connection is simply closed, as it
//! was before this layer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use tokio::sync::Semaphore;

use super::upload::{declared_length, guard, BodyLimits};
use crate::AppState;

/// How much of a refused request's body is read and dropped (and of a Wyoming client's audio
/// after its error).
pub(crate) const DRAIN_BYTES: u64 = 32 * 1024 * 1024;
/// How long a refused body is read for, pauses included.
pub(crate) const DRAIN_FOR: Duration = Duration::from_secs(30);
/// How long a refused body on a spare connection is read for.
const SPARE_DRAIN_FOR: Duration = Duration::from_secs(2);
/// How many refused bodies are read at once; past that, the connection is closed on the body.
const DRAINS_AT_ONCE: usize = 16;

/// The drains running now: one permit each. Lives in `AppState` (one per server).
#[derive(Debug)]
pub struct Drains(Arc<Semaphore>);

impl Default for Drains {
    fn default() -> Drains {
        Drains(Arc::new(Semaphore::new(DRAINS_AT_ONCE)))
    }
}

/// The body as the handler reads it, and what the layer drains after a refusal.
struct Shared {
    /// std Mutex: locked only inside one `poll_next`, or to take the stream out, never across an
    /// await.
    stream: Mutex<Option<BodyDataStream>>,
    /// The handler read from the body at least once (so hyper sent any `100 Continue`).
    polled: AtomicBool,
}

/// Why the handler's view of the body ended early: the layer took the rest.
#[derive(Debug, thiserror::Error)]
#[error("the request body was taken over by the drain after the answer")]
struct Taken;

/// The layer: runs the request and, when the answer is a refusal (4xx or 5xx) and the handler
/// left part of the body unread, hands the rest to a bounded background drain.
pub(super) async fn refused(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if !may_have_body(request.headers()) {
        return next.run(request).await;
    }
    let expects = expects_continue(request.headers());
    // A spare connection (past `max_connections`) is drained briefly: it must be free again
    // soon for the probes.
    let drain_for = if request
        .extensions()
        .get::<super::SpareConnection>()
        .is_some()
    {
        SPARE_DRAIN_FOR
    } else {
        DRAIN_FOR
    };
    let (parts, body) = request.into_parts();
    let shared = Arc::new(Shared {
        stream: Mutex::new(Some(body.into_data_stream())),
        polled: AtomicBool::new(false),
    });
    let reader = shared.clone();
    let body = futures_util::stream::poll_fn(move |cx| {
        reader.polled.store(true, Ordering::Relaxed);
        let mut slot = reader.stream.lock().unwrap_or_else(|e| e.into_inner());
        let Some(stream) = slot.as_mut() else {
            return Poll::Ready(Some(Err(axum::Error::new(Taken))));
        };
        let next = stream.poll_next_unpin(cx);
        if let Poll::Ready(None) = next {
            *slot = None; // read to the end: nothing left to drain
        }
        next
    });
    let response = next
        .run(Request::from_parts(parts, Body::from_stream(body)))
        .await;
    // With `Expect: 100-continue` and nothing read, the client was never told to send: nothing
    // is coming, and reading would ask for it.
    let sending = !expects || shared.polled.load(Ordering::Relaxed);
    if sending && is_refusal(response.status()) {
        let rest = shared
            .stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let (Some(rest), Ok(permit)) = (rest, app.drains.0.clone().try_acquire_owned()) {
            let limits = BodyLimits {
                max_bytes: DRAIN_BYTES,
                ..BodyLimits::from_config(&app.config)
            };
            tokio::spawn(async move {
                let _permit = permit;
                drop_rest(rest, limits, drain_for).await;
            });
        }
    }
    response
}

/// Whether a request may have a body: one is declared (a length above zero, or chunked) and is
/// not larger than what a drain reads (such a body's connection is closed on it).
fn may_have_body(headers: &HeaderMap) -> bool {
    let length = declared_length(headers);
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    (chunked || length.is_some_and(|n| n > 0)) && length.is_none_or(|n| n <= DRAIN_BYTES)
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// An answer after which the body is drained: any error but 408 (the body stalled: nothing is
/// coming).
fn is_refusal(status: StatusCode) -> bool {
    (status.is_client_error() || status.is_server_error()) && status != StatusCode::REQUEST_TIMEOUT
}

/// Reads and drops `rest` until it ends, errs, passes `limits` (through the upload's own body
/// guard: [`DRAIN_BYTES`], the pause and pace limits), or `drain_for` has passed; then drops
/// it (the connection closes).
async fn drop_rest(rest: BodyDataStream, limits: BodyLimits, drain_for: Duration) {
    let (guarded, _) = guard(Request::new(Body::from_stream(rest)), limits);
    let mut data = guarded.into_body().into_data_stream();
    let _ = tokio::time::timeout(drain_for, async {
        while let Some(Ok(_)) = data.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_bodies_a_client_may_be_sending_are_drained() {
        assert!(may_have_body(&headers(&[(header::CONTENT_LENGTH, "5000")])));
        assert!(may_have_body(&headers(&[(
            header::TRANSFER_ENCODING,
            "chunked"
        )])));
        assert!(!may_have_body(&headers(&[])), "no body");
        assert!(!may_have_body(&headers(&[(header::CONTENT_LENGTH, "0")])));
        assert!(!may_have_body(&headers(&[(
            header::CONTENT_LENGTH,
            "40000000"
        )])));
        assert!(expects_continue(&headers(&[(
            header::EXPECT,
            "100-Continue"
        )])));
    }

    #[test]
    fn every_error_but_a_stalled_body_is_drained() {
        assert!(is_refusal(StatusCode::UNAUTHORIZED));
        assert!(is_refusal(StatusCode::PAYLOAD_TOO_LARGE));
        assert!(is_refusal(StatusCode::TOO_MANY_REQUESTS));
        assert!(is_refusal(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!is_refusal(StatusCode::OK));
        assert!(!is_refusal(StatusCode::REQUEST_TIMEOUT));
    }

    #[tokio::test]
    async fn a_trickled_body_is_given_up_after_its_pause_limit() {
        // One chunk, then a stream that never ends: the drain stops at the idle limit.
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(vec![0u8; 10])])
            .chain(futures_util::stream::pending());
        let rest = Body::from_stream(stream).into_data_stream();
        let started = std::time::Instant::now();
        let limits = BodyLimits {
            max_bytes: DRAIN_BYTES,
            keep_free: 0,
            idle: Duration::from_millis(50),
            min_rate: 0,
        };
        drop_rest(rest, limits, DRAIN_FOR).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
