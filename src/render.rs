//! Renders a job result for people and tools: `json`, `txt`, `srt`, `vtt` (speaker-labelled cues)
//! and `rttm` (the diarization).

use std::fmt::Write;

use serde_json::Value;

/// Output formats of `?format=` and `gpuhost transcribe --format`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, clap::ValueEnum, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Json,
    Txt,
    Srt,
    Vtt,
    Rttm,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Txt => "text/plain; charset=utf-8",
            Format::Srt => "application/x-subrip; charset=utf-8",
            Format::Vtt => "text/vtt; charset=utf-8",
            Format::Rttm => "text/plain; charset=utf-8",
        }
    }
}

/// Renders `result` (the `result` of the final event) in `format`.
pub fn render(result: &Value, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(result).unwrap_or_default() + "\n",
        Format::Txt => text(result),
        Format::Srt => cues(result, false),
        Format::Vtt => cues(result, true),
        Format::Rttm => rttm(result),
    }
}

fn segments(result: &Value) -> Vec<Value> {
    result
        .get("segments")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn s<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn text(result: &Value) -> String {
    if result.get("segments").is_none() {
        // No transcript: show each stage's result.
        return serde_json::to_string_pretty(result.get("stages").unwrap_or(result))
            .unwrap_or_default()
            + "\n";
    }
    let mut out = String::new();
    let mut last_speaker = None;
    for seg in segments(result) {
        let speaker = s(&seg, "speaker").map(String::from);
        let text = s(&seg, "text").unwrap_or("").trim();
        if speaker.is_some() && speaker != last_speaker {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = write!(out, "{}: ", speaker.as_deref().unwrap_or_default());
        } else if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(text);
        last_speaker = speaker;
    }
    out.push('\n');
    out
}

/// `HH:MM:SS,mmm` (SRT) or `HH:MM:SS.mmm` (VTT).
fn timestamp(seconds: f64, vtt: bool) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{}{ms:03}", if vtt { '.' } else { ',' })
}

fn cues(result: &Value, vtt: bool) -> String {
    let mut out = String::from(if vtt { "WEBVTT\n\n" } else { "" });
    for (i, seg) in segments(result).iter().enumerate() {
        let (start, end) = (
            timestamp(f(seg, "start"), vtt),
            timestamp(f(seg, "end"), vtt),
        );
        let text = s(seg, "text").unwrap_or("").trim();
        let speaker = s(seg, "speaker");
        if vtt {
            let line = match speaker {
                Some(sp) => format!("<v {sp}>{text}"),
                None => text.to_string(),
            };
            let _ = write!(out, "{start} --> {end}\n{line}\n\n");
        } else {
            let line = match speaker {
                Some(sp) => format!("[{sp}] {text}"),
                None => text.to_string(),
            };
            let _ = write!(out, "{}\n{start} --> {end}\n{line}\n\n", i + 1);
        }
    }
    out
}

fn rttm(result: &Value) -> String {
    let turns: Vec<Value> = match result.get("turns").and_then(Value::as_array) {
        Some(turns) if !turns.is_empty() => turns.clone(),
        _ => segments(result),
    };
    let mut out = String::new();
    for t in turns {
        let (start, end) = (f(&t, "start"), f(&t, "end"));
        let speaker = s(&t, "speaker").unwrap_or("SPEAKER_00");
        let _ = writeln!(
            out,
            "SPEAKER audio 1 {start:.3} {:.3} <NA> <NA> {speaker} <NA> <NA>",
            end - start
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "segments": [
                {"start": 0.5, "end": 2.25, "speaker": "SPEAKER_00", "text": "Hello there.", "words": []},
                {"start": 3661.0, "end": 3662.5, "speaker": "SPEAKER_01", "text": "Hi.", "words": []}
            ],
            "turns": [{"start": 0.4, "end": 2.3, "speaker": "SPEAKER_00"}]
        })
    }

    #[test]
    fn srt_and_vtt_cues() {
        let srt = render(&sample(), Format::Srt);
        assert!(
            srt.starts_with(
                "1\n00:00:00,500 --> 00:00:02,250\n[SPEAKER_00] Hello there.\n\n2\n01:01:01,000"
            ),
            "{srt}"
        );
        let vtt = render(&sample(), Format::Vtt);
        assert!(
            vtt.starts_with(
                "WEBVTT\n\n00:00:00.500 --> 00:00:02.250\n<v SPEAKER_00>Hello there.\n"
            ),
            "{vtt}"
        );
    }

    #[test]
    fn txt_and_rttm() {
        assert_eq!(
            render(&sample(), Format::Txt),
            "SPEAKER_00: Hello there.\nSPEAKER_01: Hi.\n"
        );
        assert_eq!(
            render(&sample(), Format::Rttm),
            "SPEAKER audio 1 0.400 1.900 <NA> <NA> SPEAKER_00 <NA> <NA>\n"
        );
    }
}
