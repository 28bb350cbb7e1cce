//! Refusals reach clients that send their whole upload before reading: the unread rest of a
//! refused request's body is read and dropped before the error goes out.
//!
//! A client like Python's urllib writes the entire body first. When the host answers early (a
//! wrong token, a full queue, a bad option) and closes the connection with unread data, the
//! kernel resets it and the client sees a broken pipe instead of the error. One layer around the
//! whole router covers every such refusal, whichever middleware or handler made it.

use std::sync::{Arc, Mutex};
use std::task::Poll;

use axum::body::{Body, BodyDataStream};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

use super::upload::{declared_length, guard, BodyLimits};
use crate::AppState;

/// How much of a refused request's body is read and dropped before the error goes out.
const DRAIN_BYTES: u64 = 32 * 1024 * 1024;

/// The body as the handler reads it, and what the layer drains after a refusal. A std mutex:
/// it is locked only inside one `poll_next`, or to take the stream out, never across an await.
type Shared = Arc<Mutex<Option<BodyDataStream>>>;

/// The layer: runs the request, and when the answer is a refusal (4xx or 5xx) and the handler
/// left part of the body unread, reads the rest (at most [`DRAIN_BYTES`], never past a pause
/// longer than the idle timeout) before answering. A client that asked
/// `Expect: 100-continue` has sent nothing yet and is answered at once; so is one whose declared
/// body is larger than the drain limit (its connection is closed on it).
pub(super) async fn refused(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if !may_drain(request.headers()) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let shared: Shared = Arc::new(Mutex::new(Some(body.into_data_stream())));
    let reader = shared.clone();
    let body = futures_util::stream::poll_fn(move |cx| {
        let mut slot = reader.lock().unwrap_or_else(|e| e.into_inner());
        let Some(stream) = slot.as_mut() else {
            return Poll::Ready(None); // taken by the layer: the handler is done with it
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
    if is_refusal(response.status()) {
        let rest = shared.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(rest) = rest {
            drop_rest(rest, BodyLimits::from_config(&app.config)).await;
        }
    }
    response
}

/// Whether a request may have a body worth draining: one is declared (a length above zero, or
/// chunked), the client is not waiting for `100 Continue`, and it is not too big to read.
fn may_drain(headers: &HeaderMap) -> bool {
    let expects = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let length = declared_length(headers);
    let chunked = headers.contains_key(header::TRANSFER_ENCODING);
    !expects
        && (chunked || length.is_some_and(|n| n > 0))
        && !length.is_some_and(|n| n > DRAIN_BYTES)
}

/// An answer after which the body is drained: an error, except the two that cut the body off
/// on purpose (too large, stalled), where reading on would undo the cut.
fn is_refusal(status: StatusCode) -> bool {
    (status.is_client_error() || status.is_server_error())
        && status != StatusCode::PAYLOAD_TOO_LARGE
        && status != StatusCode::REQUEST_TIMEOUT
}

async fn drop_rest(rest: BodyDataStream, limits: BodyLimits) {
    let limits = BodyLimits {
        max_bytes: DRAIN_BYTES,
        ..limits
    };
    let (request, _) = guard(Request::new(Body::from_stream(rest)), limits);
    let mut data = request.into_body().into_data_stream();
    while let Some(Ok(_)) = data.next().await {}
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
    fn only_bodies_a_client_is_sending_are_drained() {
        assert!(may_drain(&headers(&[(header::CONTENT_LENGTH, "5000")])));
        assert!(may_drain(&headers(&[(
            header::TRANSFER_ENCODING,
            "chunked"
        )])));
        assert!(!may_drain(&headers(&[])), "no body");
        assert!(!may_drain(&headers(&[(header::CONTENT_LENGTH, "0")])));
        assert!(!may_drain(&headers(&[
            (header::CONTENT_LENGTH, "5000"),
            (header::EXPECT, "100-Continue"),
        ])));
        assert!(!may_drain(&headers(&[(
            header::CONTENT_LENGTH,
            "40000000"
        )])));
    }

    #[test]
    fn cut_off_bodies_are_not_read_on() {
        assert!(is_refusal(StatusCode::UNAUTHORIZED));
        assert!(is_refusal(StatusCode::TOO_MANY_REQUESTS));
        assert!(is_refusal(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!is_refusal(StatusCode::OK));
        assert!(!is_refusal(StatusCode::PAYLOAD_TOO_LARGE));
        assert!(!is_refusal(StatusCode::REQUEST_TIMEOUT));
    }
}
