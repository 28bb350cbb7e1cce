//! `GET /`: the dashboard page. The page itself holds no data (it is open); its script reads
//! `/status`, `/workers`, `/services`, `/gpu/leases` and `/gpu/history` with the token from the
//! URL fragment (`#token=…`) or local storage, and its buttons post to the unload/load and
//! start/stop endpoints.

use axum::http::header;
use axum::response::IntoResponse;

const PAGE: &str = include_str!("dashboard.html");

/// The dashboard (HTML; it reads `/status` and `/workers` with the token).
#[utoipa::path(get, path = "/", responses(
    (status = 200, description = "The dashboard page", content_type = "text/html", body = String),
    (status = 403, description = "A Host this server does not answer to", body = super::error::ErrorBody),
))]
pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
            ),
        ],
        PAGE,
    )
}
