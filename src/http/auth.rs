//! Bearer-token check for every route except `/health`, in constant time; the token is never logged.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::AppState;

pub(super) async fn require_token(
    State(app): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = app.config.token.as_deref() else {
        return next.run(request).await;
    };
    if token_matches(request.headers(), expected) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// Accepts `Authorization: Bearer <token>`; for the dashboard also a `gpuhost_token` cookie.
pub fn token_matches(headers: &axum::http::HeaderMap, expected: &str) -> bool {
    let from_header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110 §11.1): `BEARER` is `Bearer`.
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim);
    match from_header {
        Some(given) => bool::from(given.as_bytes().ct_eq(expected.as_bytes())),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn bearer_only() {
        let mut h = HeaderMap::new();
        assert!(!token_matches(&h, "t0k"));
        h.insert("authorization", HeaderValue::from_static("Bearer t0k"));
        assert!(token_matches(&h, "t0k"));
        h.insert("authorization", HeaderValue::from_static("Bearer t0"));
        assert!(!token_matches(&h, "t0k"));
        h.insert("authorization", HeaderValue::from_static("Basic t0k"));
        assert!(!token_matches(&h, "t0k"));
        for scheme in ["bearer", "BEARER", "BeArEr"] {
            let value = format!("{scheme} t0k");
            h.insert("authorization", HeaderValue::from_str(&value).unwrap());
            assert!(token_matches(&h, "t0k"), "{scheme}");
        }
    }
}
