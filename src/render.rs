//! Renders a job result for people and tools: `json`, `txt`, `srt`, `vtt` (speaker-labelled cues)
//! and `rttm` (the diarization).

use std::fmt::Write;

use serde_json::Value;

use crate::transcript::{Segment, Transcript};

/// Output formats of `?format=` and `gpuhost transcribe --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum Format {
    Json,
    Txt,
    Srt,
    Vtt,
    Rttm,
}

/// Read in any case (`?format=SRT`), as people type it; the names are lowercase.
impl<'de> serde::Deserialize<'de> for Format {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Format, D::Error> {
        const NAMES: &[&str] = &["json", "txt", "srt", "vtt", "rttm"];
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "json" => Ok(Format::Json),
            "txt" => Ok(Format::Txt),
            "srt" => Ok(Format::Srt),
            "vtt" => Ok(Format::Vtt),
            "rttm" => Ok(Format::Rttm),
            _ => Err(serde::de::Error::unknown_variant(&text, NAMES)),
        }
    }
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

/// Whether a job of `stages` gives what `format` shows: the text formats need the `asr` stage
/// (no transcript without it), `rttm` the `asr` or the `diarizer`. Checked before the job runs.
pub fn fits(format: Format, stages: &[String]) -> Result<(), String> {
    let has = |stage: &str| stages.iter().any(|s| s == stage);
    match format {
        Format::Json => Ok(()),
        Format::Rttm if has("asr") || has("diarizer") => Ok(()),
        Format::Rttm => Err("format rttm needs the `diarizer` or the `asr` stage".into()),
        _ if has("asr") => Ok(()),
        other => Err(format!(
            "format {} needs the `asr` stage's text; add `asr` to `stages`, or ask for `json`",
            format!("{other:?}").to_lowercase()
        )),
    }
}

/// Renders `result` (the `result` of the final event) in `format`.
pub fn render(result: &Value, format: Format) -> String {
    let transcript = match format {
        Format::Json => return serde_json::to_string_pretty(result).unwrap_or_default() + "\n",
        _ => Transcript::from_result(result),
    };
    match (transcript, format) {
        (Some(t), Format::Srt) => cues(&t, false),
        (Some(t), Format::Vtt) => cues(&t, true),
        (Some(t), Format::Rttm) => rttm(&t),
        (Some(t), _) => text(&t),
        // A diarizer without an ASR: its turns.
        (None, Format::Rttm) => {
            let turns = result
                .pointer("/stages/diarizer/turns")
                .and_then(|t| serde_json::from_value(t.clone()).ok())
                .unwrap_or_default();
            rttm(&Transcript {
                turns,
                ..Transcript::default()
            })
        }
        // No transcript (a pipeline without `asr`): show each stage's result.
        (None, _) => {
            serde_json::to_string_pretty(result.get("stages").unwrap_or(result)).unwrap_or_default()
                + "\n"
        }
    }
}

/// Text a worker wrote, on one line: line breaks and other control characters (which would end
/// a cue or start a forged one) become single spaces.
fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A segment's speaker as shown: one line, and none when that leaves nothing.
fn speaker_of(seg: &Segment) -> Option<String> {
    seg.speaker
        .as_deref()
        .map(one_line)
        .filter(|s| !s.is_empty())
}

fn text(transcript: &Transcript) -> String {
    let mut out = String::new();
    let mut last_speaker = None;
    for seg in &transcript.segments {
        let speaker = speaker_of(seg);
        if speaker.is_some() && speaker != last_speaker {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = write!(out, "{}: ", speaker.as_deref().unwrap_or_default());
        } else if !out.is_empty() && !seg.joins_previous() {
            out.push(' ');
        }
        out.push_str(&one_line(&seg.text));
        last_speaker = speaker;
    }
    out.push('\n');
    out
}

/// Milliseconds of `seconds` (negative: 0).
fn millis(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1000.0).round() as u64
}

/// `HH:MM:SS,mmm` (SRT) or `HH:MM:SS.mmm` (VTT).
fn timestamp(ms: u64, vtt: bool) -> String {
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{}{ms:03}", if vtt { '.' } else { ',' })
}

/// The shortest cue shown: a one-word segment whose word has no length (start = end, as word
/// timestamps often give) made a cue players skip and validators flag.
const MIN_CUE_MS: u64 = 100;

fn cues(transcript: &Transcript, vtt: bool) -> String {
    let mut out = String::from(if vtt { "WEBVTT\n\n" } else { "" });
    let mut number = 0;
    for seg in &transcript.segments {
        let text = one_line(&seg.text);
        if text.is_empty() {
            // A blank line would end the cue before its text.
            continue;
        }
        let start_ms = millis(seg.start);
        let end_ms = millis(seg.end).max(start_ms + MIN_CUE_MS);
        let (start, end) = (timestamp(start_ms, vtt), timestamp(end_ms, vtt));
        // An SRT reader takes a line holding `-->` for a cue's times (WebVTT's `>` is escaped,
        // which keeps the text as it was).
        let line = match (speaker_of(seg), vtt) {
            (Some(sp), true) => format!("<v {}>{}", vtt_escape(&sp), vtt_escape(&text)),
            (None, true) => vtt_escape(&text),
            (Some(sp), false) => srt_escape(&format!("[{sp}] {text}").replace("-->", "->")),
            (None, false) => srt_escape(&text.replace("-->", "->")),
        };
        number += 1;
        if vtt {
            let _ = write!(out, "{start} --> {end}\n{line}\n\n");
        } else {
            let _ = write!(out, "{number}\n{start} --> {end}\n{line}\n\n");
        }
    }
    out
}

/// Text of an SRT cue. SRT has no escapes, and players read `<i>`, `<font …>` and `{\\an8}` in
/// a cue as markup: a zero-width space after such a `<` or `{` shows the characters as they are
/// (an enrolled name `Al<i>ce` was set in italics).
fn srt_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        let next = chars.peek().copied();
        let markup = match c {
            '<' => next.is_some_and(|n| n.is_ascii_alphabetic() || n == '/'),
            '{' => next == Some('\\'),
            _ => false,
        };
        if markup {
            out.push('\u{200B}');
        }
    }
    out
}

/// Text inside a WebVTT cue: `&`, `<` and `>` as entities (an enrolled name may hold them).
fn vtt_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The diarizer's turns, or the segments' speakers when there were none. RTTM fields are
/// space-separated: spaces inside a speaker's name (an enrolled one) become `_`.
fn rttm(transcript: &Transcript) -> String {
    let turns: Vec<(f64, f64, String)> = if transcript.turns.is_empty() {
        let speaker = |s: &Segment| s.speaker.clone().unwrap_or_else(|| "SPEAKER_00".into());
        transcript
            .segments
            .iter()
            .map(|s| (s.start, s.end, speaker(s)))
            .collect()
    } else {
        transcript
            .turns
            .iter()
            .map(|t| (t.start, t.end, t.speaker.clone()))
            .collect()
    };
    let mut out = String::new();
    for (start, end, speaker) in turns {
        let speaker: String = speaker
            .chars()
            .map(|c| {
                if c.is_whitespace() || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        // Every field present: a speaker left blank would shift the columns after it.
        let speaker = if speaker.is_empty() {
            "<NA>".into()
        } else {
            speaker
        };
        // (`+ 0.0`: a worker's `-0.0` is written `0.000`, not `-0.000`.)
        let start = start.max(0.0) + 0.0;
        let _ = writeln!(
            out,
            "SPEAKER audio 1 {start:.3} {:.3} <NA> <NA> {speaker} <NA> <NA>",
            (end - start).max(0.0) + 0.0
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
    fn srt_cues_show_markup_as_text() {
        assert_eq!(srt_escape("[Al<i>ce] a < b"), "[Al<\u{200B}i>ce] a < b");
        assert_eq!(
            srt_escape("</b> {\\an8} {x}"),
            "<\u{200B}/b> {\u{200B}\\an8} {x}"
        );
        assert_eq!(srt_escape("plain 안녕"), "plain 안녕");
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
    fn what_a_worker_writes_cannot_forge_cues_or_shift_columns() {
        let forged = "hi\n\n2\n00:00:00,000 --> 00:00:09,000\nX";
        let result = json!({
            "segments": [
                {"start": 0.5, "end": 2.0, "speaker": forged, "text": forged, "words": []},
                {"start": 3.0, "end": 4.0, "speaker": " \n ", "text": "plain", "words": []}
            ],
            "turns": [
                {"start": -5.0, "end": 1.0, "speaker": ""},
                {"start": 1.0, "end": 2.0, "speaker": "a\tb\nc"}
            ]
        });
        let srt = render(&result, Format::Srt);
        assert_eq!(srt.matches("-->").count(), 2, "{srt}");
        assert_eq!(
            srt.split("\n\n").filter(|c| !c.is_empty()).count(),
            2,
            "{srt}"
        );
        assert!(
            srt.contains("\n[hi 2 00:00:00,000 -> 00:00:09,000 X] hi"),
            "{srt}"
        );
        assert!(
            srt.ends_with("00:00:04,000\nplain\n\n"),
            "a blank speaker is none: {srt}"
        );
        let vtt = render(&result, Format::Vtt);
        assert_eq!(vtt.matches("-->").count(), 2, "{vtt}");
        let rttm = render(&result, Format::Rttm);
        for line in rttm.lines() {
            assert_eq!(line.split(' ').count(), 10, "{line}");
        }
        assert!(
            rttm.starts_with("SPEAKER audio 1 0.000 1.000 <NA> <NA> <NA>"),
            "{rttm}"
        );
        assert!(rttm.contains(" a_b_c "), "{rttm}");
        let txt = render(&result, Format::Txt);
        assert_eq!(txt.lines().count(), 1, "no line breaks but its own: {txt}");
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

    #[test]
    fn enrolled_names_keep_the_formats_intact() {
        let named = json!({
            "segments": [{"start": 0.0, "end": 1.0, "speaker": "Kim <R&D>", "text": "a < b", "words": []}],
            "turns": [{"start": 0.0, "end": 1.0, "speaker": "김 민수"}]
        });
        let vtt = render(&named, Format::Vtt);
        assert!(vtt.contains("<v Kim &lt;R&amp;D&gt;>a &lt; b\n"), "{vtt}");
        assert!(render(&named, Format::Rttm).contains(" 김_민수 <NA>"));
    }

    #[test]
    fn every_cue_has_text_and_a_length() {
        let result = json!({
            "segments": [
                {"start": 1.0, "end": 1.0, "text": "Yes.", "words": []},
                {"start": 2.0, "end": 2.5, "text": "\u{7}", "words": []},
                {"start": 3.0, "end": 3.5, "text": "a-->b", "words": []}
            ],
            "turns": [{"start": -0.0, "end": 0.5, "speaker": "A"}]
        });
        let srt = render(&result, Format::Srt);
        assert_eq!(
            srt,
            "1\n00:00:01,000 --> 00:00:01,100\nYes.\n\n2\n00:00:03,000 --> 00:00:03,500\na->b\n\n"
        );
        // WebVTT's escape keeps the text as it was.
        let vtt = render(&result, Format::Vtt);
        assert!(vtt.ends_with("00:00:03.500\na--&gt;b\n\n"), "{vtt}");
        assert!(render(&result, Format::Rttm).starts_with("SPEAKER audio 1 0.000 0.500 "));
    }
}
