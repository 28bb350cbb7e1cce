//! Gives requests that hyper refuses before routing (a NUL byte in a header, an oversized head, a
//! malformed request line) the same JSON error body as every other error. Hyper answers those
//! itself with an empty body and offers no hook, so this connection wrapper rewrites exactly that
//! answer on its way out: a 400/414/431 with `content-length: 0`, which the router never sends
//! (every response of ours has a JSON body).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(super) struct JsonParseErrors<T> {
    inner: T,
    /// A rewritten response being written, and how far; it stands for `reported` bytes of hyper's.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T> JsonParseErrors<T> {
    pub(super) fn new(inner: T) -> JsonParseErrors<T> {
        JsonParseErrors {
            inner,
            pending: None,
        }
    }
}

/// The JSON response for hyper's automatic one in `buf`, if `buf` is one.
fn rewrite(buf: &[u8]) -> Option<Vec<u8>> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if head_end != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?.to_ascii_lowercase();
    if !head.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let (status, code, message) = match head.get(..13)? {
        "http/1.1 400 " | "http/1.0 400 " => (
            "400 Bad Request",
            "malformed_request",
            "the request could not be parsed: check the request line and headers (no control characters such as NUL)",
        ),
        "http/1.1 414 " | "http/1.0 414 " => (
            "414 URI Too Long",
            "uri_too_long",
            "the request URI is too long; send long values in the body",
        ),
        "http/1.1 431 " | "http/1.0 431 " => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request headers are too large",
        ),
        _ => return None,
    };
    let body = format!("{{\"error\":\"{code}\",\"message\":\"{message}\"}}");
    Some(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonParseErrors<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending.is_none() {
            match rewrite(buf) {
                Some(replacement) => this.pending = Some((replacement, 0, buf.len())),
                None => return Pin::new(&mut this.inner).poll_write(cx, buf),
            }
        }
        loop {
            let (bytes, written, reported) = this.pending.as_mut().expect("set above");
            if *written == bytes.len() {
                let reported = *reported;
                this.pending = None;
                return Poll::Ready(Ok(reported));
            }
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn only_hypers_empty_errors_are_rewritten() {
        let auto = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite(auto).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(out.ends_with("\"}"));
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "malformed_request");
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 40\r\n\r\n";
        assert!(rewrite(ours).is_none());
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
