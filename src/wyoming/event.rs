//! Wyoming framing: a JSON header line, then `data_length` bytes of JSON merged into its `data`,
//! then `payload_length` bytes of payload (PCM audio). Every length is bounded before reading.

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest header line and longest extra data accepted.
const MAX_HEADER_BYTES: u64 = 64 * 1024;
/// Largest payload of one event: an audio chunk is a few KiB (Home Assistant's are 20 ms); 1 MiB
/// is 32 s of 16 kHz mono. Each connection may hold one while it arrives.
pub(super) const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The protocol version written in our headers.
const VERSION: &str = "1.5.4";

/// One event as read.
#[derive(Debug)]
pub(super) struct Event {
    pub(super) kind: String,
    pub(super) data: Map<String, Value>,
    pub(super) payload: Vec<u8>,
}

impl Event {
    /// A whole number in `data` (`16000` or `16000.0`); absent or null: `None`. Anything else
    /// is the client's mistake, said, not read as absent (a `"channels": "2"` was taken for
    /// mono).
    pub(super) fn u32(&self, key: &str) -> Result<Option<u32>, String> {
        let value = match self.data.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(v) => v,
        };
        let whole = value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX))
                .map(|f| f as u64)
        });
        whole
            .and_then(|v| u32::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a whole number, not {value}"))
    }

    /// A string in `data`; absent or null: `None`; anything else is said.
    pub(super) fn text(&self, key: &str) -> Result<Option<&str>, String> {
        match self.data.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("`{key}` must be a string, not {v}")),
        }
    }

    pub(super) fn str(&self, key: &str) -> Option<&str> {
        self.data.get(key)?.as_str()
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("an event header is longer than {MAX_HEADER_BYTES} bytes")]
    HeaderTooLong,
    #[error("a malformed event: {0}")]
    BadHeader(String),
    #[error("`{field}` of {len} is over the limit of {max}")]
    TooLarge {
        field: &'static str,
        len: u64,
        max: u64,
    },
}

/// The next event; `None` at a clean end of stream.
pub(super) async fn read_event<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> Result<Option<Event>, FrameError> {
    let mut line = Vec::new();
    (&mut *r)
        .take(MAX_HEADER_BYTES + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(if line.len() as u64 > MAX_HEADER_BYTES {
            FrameError::HeaderTooLong
        } else {
            FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())
        });
    }
    let header: Value = serde_json::from_slice(&line)
        .map_err(|e| FrameError::BadHeader(format!("its header line is not JSON ({e})")))?;
    let kind = header
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            FrameError::BadHeader("its header is no object with a string `type`".into())
        })?
        .to_string();
    let mut data = match header.get("data") {
        Some(Value::Object(d)) => d.clone(),
        Some(Value::Null) | None => Map::new(),
        Some(_) => return Err(FrameError::BadHeader("its `data` is not an object".into())),
    };
    let length = |field: &'static str, max: u64| -> Result<u64, FrameError> {
        // A length that is not a count of bytes ("4", -4, 2.0) cannot be skipped over: reading
        // it as 0 ran the payload as the next event.
        let len = match header.get(field) {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_u64().ok_or_else(|| {
                FrameError::BadHeader(format!("its `{field}` is not a whole number of bytes: {v}"))
            })?,
        };
        if len > max {
            return Err(FrameError::TooLarge { field, len, max });
        }
        Ok(len)
    };
    let data_length = length("data_length", MAX_HEADER_BYTES)?;
    let payload_length = length("payload_length", MAX_PAYLOAD_BYTES as u64)?;
    if data_length > 0 {
        let extra = read_exactly(r, data_length).await?;
        match serde_json::from_slice(&extra) {
            Ok(Value::Object(more)) => data.extend(more),
            _ => {
                return Err(FrameError::BadHeader(
                    "its extra data (`data_length` bytes) is not a JSON object".into(),
                ))
            }
        }
    }
    let payload = read_exactly(r, payload_length).await?;
    Ok(Some(Event {
        kind,
        data,
        payload,
    }))
}

/// Reads `len` bytes, growing the buffer as they arrive: a header that announces a payload it
/// never sends costs nothing.
async fn read_exactly<R: AsyncBufRead + Unpin>(r: &mut R, len: u64) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    (&mut *r).take(len).read_to_end(&mut out).await?;
    if (out.len() as u64) < len {
        return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(out)
}

/// Writes one event with `data` (no payload).
pub(super) async fn write_event<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: &str,
    data: Value,
) -> std::io::Result<()> {
    let data = serde_json::to_vec(&data)?;
    let header = json!({"type": kind, "version": VERSION, "data_length": data.len()});
    let mut out = serde_json::to_vec(&header)?;
    out.push(b'\n');
    out.extend_from_slice(&data);
    w.write_all(&out).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn data_is_merged_and_payload_read() {
        let mut input: &[u8] = b"{\"type\":\"audio-chunk\",\"data\":{\"rate\":16000},\"data_length\":13,\"payload_length\":4}\n{\"width\": 2} \x01\x02\x03\x04{\"type\":\"audio-stop\"}\n";
        let e = read_event(&mut input).await.unwrap().unwrap();
        assert_eq!(e.kind, "audio-chunk");
        assert_eq!(
            (e.u32("rate"), e.u32("width")),
            (Ok(Some(16000)), Ok(Some(2)))
        );
        assert_eq!(e.payload, [1, 2, 3, 4]);
        let e = read_event(&mut input).await.unwrap().unwrap();
        assert_eq!(e.kind, "audio-stop");
        assert!(read_event(&mut input).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn lengths_are_bounded_before_reading() {
        let mut input: &[u8] = b"{\"type\":\"audio-chunk\",\"payload_length\":99999999999}\n";
        assert!(matches!(
            read_event(&mut input).await,
            Err(FrameError::TooLarge {
                field: "payload_length",
                ..
            })
        ));
        let long = vec![b'x'; 70 * 1024];
        assert!(matches!(
            read_event(&mut &long[..]).await,
            Err(FrameError::HeaderTooLong)
        ));
        assert!(matches!(
            read_event(&mut &b"[1]\n"[..]).await,
            Err(FrameError::BadHeader(_))
        ));
        for bad in ["\"4\"", "-4", "2.0", "true"] {
            let header = format!("{{\"type\":\"audio-chunk\",\"payload_length\":{bad}}}\n");
            assert!(
                matches!(
                    read_event(&mut header.as_bytes()).await,
                    Err(FrameError::BadHeader(_))
                ),
                "{bad}"
            );
        }
        // A payload cut short is an error, not a zero-padded chunk.
        let mut short: &[u8] = b"{\"type\":\"audio-chunk\",\"payload_length\":1048576}\n\x01\x02";
        assert!(matches!(
            read_event(&mut short).await,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof
        ));
    }

    #[tokio::test]
    async fn written_events_read_back() {
        let mut out = Vec::new();
        write_event(&mut out, "transcript", json!({"text": "안녕하세요"}))
            .await
            .unwrap();
        let e = read_event(&mut &out[..]).await.unwrap().unwrap();
        assert_eq!(
            (e.kind.as_str(), e.str("text")),
            ("transcript", Some("안녕하세요"))
        );
    }
}
