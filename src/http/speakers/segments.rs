//! The spans `POST /speakers` learns a voice from: given as `segments`, or one speaker's turns
//! in a finished transcript (overlapped speech left out).

use super::ApiError;

/// More spans than anyone marks by hand, or a transcript has for one speaker.
const SEGMENTS_MAX: usize = 100_000;

/// The spans to learn the voice from: `segments`, or the turns of `speaker` in `transcript`;
/// `None`: all the speech in the audio.
pub(super) fn segments_of(
    segments: Option<&str>,
    transcript: Option<&str>,
    speaker: Option<&str>,
) -> Result<Option<Vec<[f64; 2]>>, ApiError> {
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
        (None, Some(text), Some(speaker)) => turns_of(text, speaker.trim())?,
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
        (None, None, None) => return Ok(None),
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
    Ok(Some(spans))
}

/// What enrolment reads of a transcript: who spoke when (nothing else is parsed).
#[derive(serde::Deserialize)]
struct Spoken {
    #[serde(default)]
    turns: Vec<Span>,
    #[serde(default)]
    segments: Vec<Span>,
    #[serde(default)]
    overlaps: Vec<[f64; 2]>,
}

#[derive(serde::Deserialize)]
struct Span {
    start: f64,
    end: f64,
    #[serde(default)]
    speaker: Option<String>,
}

/// A transcript as sent: a job's `result`, or the whole `result` event around it.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Sent {
    Event { result: Spoken },
    Result(Spoken),
}

/// The turns of `speaker` in a transcript (its segments' times when it has no turns), minus
/// overlapped speech and empty spans.
fn turns_of(text: &str, speaker: &str) -> Result<Vec<[f64; 2]>, ApiError> {
    let sent: Sent = serde_json::from_str(text).map_err(|e| {
        ApiError::bad_request(format!(
            "`transcript` is not a transcript (send the JSON `result` of a transcription): {e}"
        ))
    })?;
    let (Sent::Event { result: spoken } | Sent::Result(spoken)) = sent;
    let of = |spans: &[Span]| -> Vec<[f64; 2]> {
        spans
            .iter()
            .filter(|s| s.speaker.as_deref() == Some(speaker))
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
        return Err(ApiError::bad_request(format!(
            "the transcript has no turns of `{speaker}`; its speakers are: {}",
            known.join(", ")
        )));
    }
    let clean: Vec<[f64; 2]> = minus(&spans, &spoken.overlaps)
        .into_iter()
        .filter(|[s, e]| e > s)
        .collect();
    // All of it overlapped: the voice is still in there.
    Ok(if clean.is_empty() { spans } else { clean })
}

/// `spans` without the parts inside any of `cuts`.
fn minus(spans: &[[f64; 2]], cuts: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let mut out = Vec::new();
    for &[start, end] in spans {
        let mut parts = vec![[start, end]];
        for &[a, b] in cuts {
            parts = parts
                .into_iter()
                .flat_map(|[s, e]| [[s, e.min(a)], [s.max(b), e]])
                .filter(|[s, e]| e - s > 0.05)
                .collect();
        }
        out.extend(parts);
    }
    out
}
