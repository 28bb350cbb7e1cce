//! Browser defences, in front of every route but the probes: a `Host` the server does not answer
//! to is refused (DNS rebinding: a page on evil.example that resolves its name to 127.0.0.1 must
//! not read `/status`), and a state-changing request that a browser marks as cross-site is refused
//! (a `text/plain` form POST from any web page would otherwise start a job).

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::{AppState, Config};

pub(super) async fn check(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if let Err(e) = check_request(request.method(), request.headers(), &app.config) {
        return e.into_response();
    }
    next.run(request).await
}

fn check_request(method: &Method, headers: &HeaderMap, config: &Config) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(host) = host {
        if !host_allowed(host, config) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                format!(
                    "this server does not answer to Host `{host}`; add it to [http] allowed_hosts"
                ),
            ));
        }
    }
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if let Some(site) = fetch_site {
        if !matches!(site, "same-origin" | "none") {
            return Err(cross_site(&format!("Sec-Fetch-Site: {site}")));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null");
        let origin_host = origin
            .split_once("://")
            .map(|(_, rest)| rest.trim_end_matches('/'));
        let same = match (origin_host, host) {
            (Some(o), Some(h)) => o.eq_ignore_ascii_case(h),
            _ => false,
        };
        if !same {
            return Err(cross_site(&format!("Origin: {origin}")));
        }
    }
    Ok(())
}

fn cross_site(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "cross_site_request",
        format!("cross-site requests may not change anything here ({what}); call the API from a program, not a web page"),
    )
}

/// The host name of a `Host` value: `[::1]:9090` → `::1`, `localhost:9090` → `localhost`.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':')
        .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
        .map_or(host, |(name, _)| name)
}

fn host_allowed(host: &str, config: &Config) -> bool {
    let name = host_name(host).to_ascii_lowercase();
    let loopback = name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return true;
    }
    let allowed = &config.http.allowed_hosts;
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(&name))
    {
        return true;
    }
    let listen = config.listen.ip();
    if !listen.is_unspecified() && name.trim_matches(['[', ']']) == listen.to_string() {
        return true;
    }
    // With a token, a rebinding page cannot read anything it does not already hold the key to.
    config.token.is_some() && allowed.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn hosts() {
        let mut config = Config::default();
        for ok in [
            "localhost:9090",
            "127.0.0.1:9090",
            "[::1]:9090",
            "127.0.0.2",
            "a.localhost",
        ] {
            assert!(host_allowed(ok, &config), "{ok}");
        }
        for bad in [
            "evil.example:9090",
            "evil.example",
            "10.0.0.1:9090",
            "localhost.evil.example",
        ] {
            assert!(!host_allowed(bad, &config), "{bad}");
        }
        config.http.allowed_hosts = vec!["gpu.lan".into()];
        assert!(host_allowed("gpu.lan:9090", &config));
        assert!(!host_allowed("evil.example", &config));
        config.http.allowed_hosts.clear();
        config.token = Some("t".into());
        assert!(host_allowed("gpuhost.default.svc:9090", &config));
    }

    #[test]
    fn cross_site_posts_are_refused() {
        let config = Config::default();
        let post = Method::POST;
        let local = [("host", "127.0.0.1:9090")];
        assert!(check_request(&post, &headers(&local), &config).is_ok());
        let with = |extra: (&'static str, &'static str)| {
            check_request(&post, &headers(&[local[0], extra]), &config)
        };
        assert!(with(("sec-fetch-site", "cross-site")).is_err());
        assert!(with(("sec-fetch-site", "same-site")).is_err());
        assert!(with(("sec-fetch-site", "same-origin")).is_ok());
        assert!(with(("origin", "https://evil.example")).is_err());
        assert!(with(("origin", "null")).is_err());
        assert!(with(("origin", "http://127.0.0.1:9090")).is_ok());
        let get = headers(&[local[0], ("sec-fetch-site", "cross-site")]);
        assert!(check_request(&Method::GET, &get, &config).is_ok());
    }
}
