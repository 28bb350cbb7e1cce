//! The control endpoints take no query string: their options are in the path or the JSON body.
//! A parameter there was ignored without a word (`POST /gpu/lease?wait=true` did not wait, it was
//! refused with a 409 as if `wait` had not been asked for); now it is a 400 that names it.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

pub(super) async fn refuse(request: Request, next: Next) -> Response {
    match request.uri().query().filter(|q| !q.is_empty()) {
        Some(query) => refusal(request.method(), request.uri().path(), query).into_response(),
        None => next.run(request).await,
    }
}

fn refusal(method: &axum::http::Method, path: &str, query: &str) -> ApiError {
    let names: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let name = p.split('=').next().unwrap_or(p);
            // Shown, not trusted: escaped and cut.
            name.chars().take(40).flat_map(char::escape_debug).collect()
        })
        .take(5)
        .collect();
    let body = if path == "/gpu/lease" {
        ": a lease's options go in its JSON body"
    } else {
        ""
    };
    ApiError::bad_request(format!(
        "{method} {path} takes no query parameters (given: {}){body}",
        names.join(", ")
    ))
    .at(names.first().cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_what_was_given() {
        let e = refusal(&axum::http::Method::POST, "/gpu/lease", "wait=true&ttl_s=9");
        assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("(given: wait, ttl_s)"), "{}", e.message);
        assert!(e.message.ends_with("go in its JSON body"), "{}", e.message);
        let e = refusal(
            &axum::http::Method::POST,
            "/services/x/stop",
            "f\u{1b}[31m=1",
        );
        assert!(e.message.contains("given: f\\u{1b}[31m)"), "{}", e.message);
    }
}
