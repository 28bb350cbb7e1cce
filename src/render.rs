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
    render_named(result, format, "audio")
}

/// [`render`], with `file_id` as RTTM's file field (a recording's name, so that the RTTM of
/// several files can be put together and scored; `audio` when there is none). Spaces and control
/// characters in it become `_`, as in speakers' names.
pub fn render_named(result: &Value, format: Format, file_id: &str) -> String {
    let file_id = rttm_field(file_id);
    let file_id = if file_id.is_empty() {
        "audio"
    } else {
        &file_id
    };
    let rttm = |t: &Transcript| rttm(t, file_id);
    let transcript = match format {
        Format::Json => return serde_json::to_string_pretty(result).unwrap_or_default() + "\n",
        _ => Transcript::from_result(result),
    };
    match (transcript, format) {
        (Some(t), Format::Srt) => cues(&t, false, result["duration"].as_f64()),
        (Some(t), Format::Vtt) => cues(&t, true, result["duration"].as_f64()),
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

/// The cues; one lengthened to [`MIN_CUE_MS`] stops at the next cue and at the recording's end
/// (`duration`).
fn cues(transcript: &Transcript, vtt: bool, duration: Option<f64>) -> String {
    let mut out = String::from(if vtt { "WEBVTT\n\n" } else { "" });
    let mut number = 0;
    let segments = &transcript.segments;
    for (i, seg) in segments.iter().enumerate() {
        let text = one_line(&seg.text);
        if text.is_empty() {
            // A blank line would end the cue before its text.
            continue;
        }
        let (start_ms, end_ms) = cue_times(
            millis(seg.start),
            millis(seg.end),
            segments.get(i + 1).map(|next| millis(next.start)),
            duration.map(millis),
        );
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

/// A cue's start and end (ms) for a segment of `start`–`end`: at least [`MIN_CUE_MS`] long where
/// that does not run into the next cue or past the audio's end, and never of no length (players
/// skip such a cue, validators flag it). A segment that starts with the next one (three words the
/// aligner put at one instant, then a reply) gets its tenth of a second beside it, overlapping
/// as overlapped speech does; one of no length at the very end ends there and starts earlier.
fn cue_times(start: u64, end: u64, next: Option<u64>, duration: Option<u64>) -> (u64, u64) {
    let limit = duration.unwrap_or(u64::MAX);
    let cap = match next {
        Some(next) if next > start => next.min(limit),
        _ => limit,
    };
    let end = end.max((start + MIN_CUE_MS).min(cap));
    if end > start {
        return (start, end);
    }
    (end.saturating_sub(MIN_CUE_MS), end.max(1))
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
/// `text` as one RTTM field: whitespace and control characters become `_`.
fn rttm_field(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

fn rttm(transcript: &Transcript, file_id: &str) -> String {
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
        let speaker = rttm_field(&speaker);
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
            "SPEAKER {file_id} 1 {start:.3} {:.3} <NA> <NA> {speaker} <NA> <NA>",
            (end - start).max(0.0) + 0.0
        );
    }
    out
}

#[cfg(test)]
mod tests;
