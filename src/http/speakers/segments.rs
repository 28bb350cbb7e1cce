//! The spans `POST /speakers` learns a voice from: given as `segments`, or one speaker's turns
//! in a finished transcript (overlapped speech left out).

use super::ApiError;

/// More spans than anyone marks by hand, or a transcript has for one speaker.
const SEGMENTS_MAX: usize = 100_000;

/// The spans to learn the voice from.
pub(super) struct Spans {
    /// `segments`, or the turns of `speaker` in `transcript`; `None`: all the speech in the
    /// audio.
    pub(super) spans: Option<Vec<[f64; 2]>>,
    /// How long the transcript's recording was, when it says: the audio sent with it must be
    /// that recording.
    pub(super) transcribed_s: Option<f64>,
}

/// The spans to learn the voice from: `segments`, or the turns of `speaker` in `transcript`.
pub(super) fn segments_of(
    segments: Option<&str>,
    transcript: Option<&str>,
    speaker: Option<&str>,
) -> Result<Spans, ApiError> {
    let mut transcribed_s = None;
    let spans: Vec<[f64; 2]> = match (segments, transcript, speaker) {
        (Some(_), Some(_), _) => {
            return Err(ApiError::bad_request(
                "give `segments` or `transcript` + `speaker`, not both",
            ))
        }
        (Some(text), None, _) => serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(format!(
                "`segments` must be JSON like [[0.5, 4.2], [10, 12.5]] (seconds): {e}"
            ))
        })?,
        (None, Some(text), Some(speaker)) => {
            let (turns, duration) = turns_of(text, &crate::speakers::normal_name(speaker))?;
            transcribed_s = duration;
            turns
        }
        (None, Some(_), None) => {
            return Err(ApiError::bad_request(
                "`transcript` needs `speaker`: the label of the voice in it (SPEAKER_01)",
            ))
        }
        (None, None, Some(_)) => {
            return Err(ApiError::bad_request(
                "`speaker` needs `transcript`: the finished transcript of this audio",
            ))
        }
        (None, None, None) => {
            return Ok(Spans {
                spans: None,
                transcribed_s,
            })
        }
    };
    if spans.len() > SEGMENTS_MAX {
        return Err(ApiError::bad_request(format!(
            "more than {SEGMENTS_MAX} segments"
        )));
    }
    if let Some(bad) = spans
        .iter()
        .find(|[s, e]| !(s.is_finite() && e.is_finite() && *s >= 0.0 && e > s))
    {
        return Err(ApiError::bad_request(format!(
            "segment {bad:?} is not [start, end] seconds with 0 <= start < end"
        )));
    }
    if spans.is_empty() {
        return Err(ApiError::bad_request("`segments` is empty"));
    }
    // The worker gets each stretch of time once, however often it was listed.
    Ok(Spans {
        spans: Some(union(&spans)),
        transcribed_s,
    })
}

/// What enrolment reads of a transcript: who spoke when. Nothing else is parsed or kept (a
/// field it does not name is skipped as it is read: an untagged enum of the two shapes buffered
/// the whole document, 18 times its size in memory).
#[derive(serde::Deserialize)]
struct Spoken {
    /// Sent as the whole `result` event: the transcript is in here.
    #[serde(default)]
    result: Option<Box<Spoken>>,
    #[serde(default)]
    turns: Vec<Span>,
    #[serde(default)]
    segments: Vec<Span>,
    #[serde(default)]
    overlaps: Vec<[f64; 2]>,
    /// The recording's length (a job's `result` has it).
    #[serde(default)]
    duration: Option<f64>,
    /// A result without an `asr` stage has no top-level turns: they are its diarizer's.
    #[serde(default)]
    stages: std::collections::BTreeMap<String, Spoken>,
}

#[derive(serde::Deserialize)]
struct Span {
    start: f64,
    end: f64,
    #[serde(default)]
    speaker: Option<String>,
}

/// The turns of `speaker` (a name as [`crate::speakers::normal_name`] keeps it) in a transcript
/// (its segments' times when it has no turns), minus overlapped speech and empty spans; and the
/// recording's length when the transcript says it.
fn turns_of(text: &str, speaker: &str) -> Result<(Vec<[f64; 2]>, Option<f64>), ApiError> {
    let sent: Spoken = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!(
            "`transcript` is not a transcript (send the JSON `result` of a transcription): {e}"
        ))
    })?;
    let mut spoken = match sent.result {
        Some(inside) => *inside,
        None => sent,
    };
    let duration = spoken.duration;
    if spoken.turns.is_empty() && spoken.segments.is_empty() {
        if let Some(stage) = std::mem::take(&mut spoken.stages)
            .into_values()
            .find(|stage| !stage.turns.is_empty())
        {
            spoken = stage;
        }
    }
    let of = |spans: &[Span]| -> Vec<[f64; 2]> {
        spans
            .iter()
            .filter(|s| {
                s.speaker
                    .as_deref()
                    .is_some_and(|s| crate::speakers::normal_name(s) == speaker)
            })
            .map(|s| [s.start, s.end])
            .collect()
    };
    let mut spans = of(&spoken.turns);
    if spans.is_empty() {
        spans = of(&spoken.segments);
    }
    if spans.is_empty() {
        let mut known: Vec<&str> = spoken
            .turns
            .iter()
            .chain(&spoken.segments)
            .filter_map(|s| s.speaker.as_deref())
            .collect();
        known.sort_unstable();
        known.dedup();
        if known.is_empty() {
            return Err(ApiError::bad_request(
                "`transcript` names no speaker: it has no `turns` or `segments` with a `speaker` \
                 (send the JSON `result` of a transcription with the diarizer among its stages)",
            ));
        }
        return Err(ApiError::bad_request(format!(
            "the transcript has no turns of `{speaker}`; its speakers are: {}",
            known.join(", ")
        )));
    }
    for (what, list) in [("turns", &spans), ("overlaps", &spoken.overlaps)] {
        if list.len() > SEGMENTS_MAX {
            return Err(ApiError::bad_request(format!(
                "the transcript has more than {SEGMENTS_MAX} {what}"
            )));
        }
        if let Some(bad) = list
            .iter()
            .find(|[s, e]| !(s.is_finite() && e.is_finite() && s <= e))
        {
            return Err(ApiError::bad_request(format!(
                "the transcript's {what} hold {bad:?}, not [start, end] seconds with start <= end"
            )));
        }
    }
    let clean = minus(&spans, &spoken.overlaps);
    // All of it overlapped: the voice is still in there.
    Ok((if clean.is_empty() { spans } else { clean }, duration))
}

/// `spans` (checked: finite, start <= end) sorted, with the ones that overlap or touch merged:
/// the same stretches of time, each once.
fn union(spans: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let mut sorted = spans.to_vec();
    sorted.sort_by(|x, y| x[0].total_cmp(&y[0]));
    let mut merged: Vec<[f64; 2]> = Vec::with_capacity(sorted.len());
    for [a, b] in sorted {
        match merged.last_mut() {
            Some(last) if a <= last[1] => last[1] = last[1].max(b),
            _ => merged.push([a, b]),
        }
    }
    merged
}

/// `spans` without the parts inside any of `cuts` (both checked: finite, start <= end), parts of
/// 50 ms or less dropped. Spans and cuts are each merged and sorted first, so the parts are at
/// most as many as spans and cuts together, and the work grows with their number, not their
/// product (3 000 copies of one long turn across 100 000 overlaps were 300 million parts, 4.8 GB).
fn minus(spans: &[[f64; 2]], cuts: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let merged = union(cuts);
    let mut out = Vec::new();
    for [start, end] in union(spans) {
        // The first merged cut that ends after this span starts; the ones after it are in order.
        let first = merged.partition_point(|c| c[1] <= start);
        let mut from = start;
        for &[a, b] in merged[first..].iter().take_while(|c| c[0] < end) {
            if a.min(end) - from > 0.05 {
                out.push([from, a.min(end)]);
            }
            from = from.max(b);
        }
        if end - from > 0.05 {
            out.push([from, end]);
        }
    }
    out
}

#[cfg(test)]
mod tests;
