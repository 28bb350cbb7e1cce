//! The merge step: gives every word a speaker (by overlap with the diarizer's turns) and groups
//! words into subtitle-sized segments. Input: the stage results of the speech pipeline.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

mod shape;
mod views;
pub use shape::fault;
pub use views::clamp_diarizer;

/// A segment ends at a speaker change, a pause this long, or when it would grow past these
/// (its text in columns: see `width`).
const MAX_PAUSE_S: f64 = 0.8;
const MAX_SEGMENT_S: f64 = 6.0;
const MAX_SEGMENT_CHARS: usize = 84;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Word {
    pub word: String,
    pub start: f64,
    pub end: f64,
    pub score: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// Written without a space before it (the ASR's mark: "-disposed" after "ill", "'êtes"
    /// after "n", every word of Chinese or Japanese): the segment's text joins it on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joined: bool,
    /// Whether the aligner placed the word (`true`) or it kept the ASR's own times (`false`:
    /// a stretch the aligner could not align, or a language it has no model for); absent when
    /// no aligner ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aligned: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub start: f64,
    pub end: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    pub text: String,
    #[serde(default)]
    pub words: Vec<Word>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub start: f64,
    pub end: f64,
    pub speaker: String,
}

/// One diarized speaker against the enrolled voices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// Its label in the transcript: the enrolled name it matched, or `SPEAKER_nn`.
    pub speaker: String,
    /// The diarizer's own label for it.
    pub cluster: String,
    /// The enrolled voice it was named after (its score reached `[speakers] threshold`).
    pub voiceprint: Option<String>,
    /// The enrolled voice it resembles most, and how much (cosine similarity).
    pub best: String,
    pub score: f64,
    /// Seconds of its speech the comparison used.
    pub speech_s: f64,
}

/// The merged transcript: what a speech job's `result` holds (beside `duration`, `timings`,
/// `pipeline_seconds` and `audio`), and what the renderers and the OpenAI endpoint read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub segments: Vec<Segment>,
    /// Every speaker, in order of first appearance.
    #[serde(default)]
    pub speakers: Vec<String>,
    /// The diarizer's turns (empty without a diarizer stage). They overlap where the
    /// diarizer heard people talk at once.
    #[serde(default)]
    pub turns: Vec<Turn>,
    /// Spans `[start, end]` of overlapped speech, when the diarizer finds it (`overlap` engine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlaps: Vec<[f64; 2]>,
    /// How each speaker the diarizer found matched the enrolled voices (`/speakers`); empty
    /// when none are enrolled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identities: Vec<Identity>,
    /// The language the ASR used or detected.
    #[serde(default)]
    pub language: Option<String>,
    /// What the ASR says the reader should know of its output (speech that does not sound
    /// like the English an English-only model assumed); absent when nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// All segments' text, space-separated.
    #[serde(default)]
    pub text: String,
}

impl Transcript {
    /// The transcript in a job's `result`, when it has one (a pipeline without `asr` has not).
    pub fn from_result(result: &Value) -> Option<Transcript> {
        result.get("segments")?;
        Transcript::deserialize(result).ok()
    }
}

/// Builds the transcript when the results hold an `asr` stage; `None` otherwise.
pub fn build(stages: &Map<String, Value>) -> Option<Transcript> {
    let asr = stages.get("asr")?;
    let turns: Vec<Turn> = stages
        .get("diarizer")
        .and_then(|d| d.get("turns"))
        .and_then(|t| serde_json::from_value(t.clone()).ok())
        .unwrap_or_default();
    let overlaps: Vec<[f64; 2]> = stages
        .get("diarizer")
        .and_then(|d| d.get("overlaps"))
        .and_then(|o| serde_json::from_value(o.clone()).ok())
        .unwrap_or_default();
    let identities: Vec<Identity> = stages
        .get("diarizer")
        .and_then(|d| d.get("identities"))
        .and_then(|o| serde_json::from_value(o.clone()).ok())
        .unwrap_or_default();
    let source = stages
        .get("aligner")
        .filter(|a| a.get("segments").is_some())
        .unwrap_or(asr);
    let mut words = words_of(source);
    let mut previous: Option<String> = None;
    for w in &mut words {
        w.speaker = speaker_for(w, &turns, previous.as_deref());
        previous.clone_from(&w.speaker);
    }
    let segments = group(words);
    let mut speakers: Vec<String> = Vec::new();
    for s in segments
        .iter()
        .filter_map(|s| s.speaker.clone())
        .chain(turns.iter().map(|t| t.speaker.clone()))
    {
        if !speakers.contains(&s) {
            speakers.push(s);
        }
    }
    let text = join_segments(&segments);
    Some(Transcript {
        segments,
        speakers,
        turns,
        overlaps,
        identities,
        language: asr
            .get("language")
            .and_then(Value::as_str)
            .map(String::from),
        warnings: warnings_of(asr, stages.get("aligner")),
        text,
    })
}

/// The ASR's `warnings` and what the aligner `skipped` (a language it has no model for: the word
/// times are the ASR's): strings, at most 8, each cut to 1000 characters (a worker's words reach
/// every client).
fn warnings_of(asr: &Value, aligner: Option<&Value>) -> Vec<String> {
    let said = asr.get("warnings").and_then(Value::as_array);
    let skipped = aligner.and_then(|a| a.get("skipped"));
    // The aligner's first: the ASR may fill all eight places.
    skipped
        .into_iter()
        .chain(said.into_iter().flatten())
        .filter_map(Value::as_str)
        .take(8)
        .map(|w| crate::text::cut(w.to_string(), 1000))
        .collect()
}

fn number(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// Every word of a stage result shaped like `{segments: [{words: [...]}]}`.
fn words_of(result: &Value) -> Vec<Word> {
    let segments = result
        .get("segments")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for seg in &segments {
        for w in seg
            .get("words")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(start), Some(end)) = (number(w, "start"), number(w, "end")) else {
                continue;
            };
            let text = w.get("word").and_then(Value::as_str).unwrap_or("").trim();
            // Nothing to show (a word of control characters became an empty cue).
            if text.chars().all(|c| c.is_control() || c.is_whitespace()) {
                continue;
            }
            let score = number(w, "score")
                .or_else(|| number(w, "probability"))
                .unwrap_or(0.0);
            out.push(Word {
                word: text.to_string(),
                start,
                end: end.max(start),
                score,
                speaker: None,
                joined: w.get("joined").and_then(Value::as_bool).unwrap_or(false),
                aligned: w.get("aligned").and_then(Value::as_bool),
            });
        }
    }
    out.sort_by(|a, b| a.start.total_cmp(&b.start));
    out
}

/// The turn overlapping the word most; when none overlaps, the nearest one. A word that two
/// turns overlap as much (inside both: overlapped speech) goes to the speaker of the word before
/// it when that is one of them, else to the longer turn: it went to whichever was listed last,
/// and "He was not an old-sposed young man" came out as three lines, "an" the other speaker's.
fn speaker_for(word: &Word, turns: &[Turn], previous: Option<&str>) -> Option<String> {
    let overlap = |t: &Turn| (word.end.min(t.end) - word.start.max(t.start)).max(0.0);
    let most = turns.iter().map(overlap).fold(0.0, f64::max);
    if most > 0.0 {
        let tied = || turns.iter().filter(|t| overlap(t) >= most - 1e-9);
        let best = tied()
            .find(|t| previous == Some(t.speaker.as_str()))
            .or_else(|| tied().max_by(|a, b| (a.end - a.start).total_cmp(&(b.end - b.start))))?;
        return Some(best.speaker.clone());
    }
    let mid = (word.start + word.end) / 2.0;
    let distance = |t: &Turn| {
        if mid < t.start {
            t.start - mid
        } else {
            (mid - t.end).max(0.0)
        }
    };
    turns
        .iter()
        .min_by(|a, b| distance(a).total_cmp(&distance(b)))
        .map(|t| t.speaker.clone())
}

/// How wide `text` shows, in columns: a character each, two for the wide ones of Chinese,
/// Japanese and Korean (it counted bytes: three for each Hangul syllable, so Korean cues were cut
/// at about 28 characters).
fn width(text: &str) -> usize {
    text.chars()
        .map(|c| if unspaced_script(c) { 2 } else { 1 })
        .sum()
}

/// Whether `word` is the rest of the word before it ("-disposed", "'êtes"), not a word of a
/// language written without spaces (Chinese, Japanese), whose words segment like any other.
fn continues(word: &Word) -> bool {
    word.joined && !word.word.chars().next().is_some_and(unspaced_script)
}

/// Han, kana, Hangul and their punctuation and full-width forms.
fn unspaced_script(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x11FF | 0x2E80..=0x30FF | 0x3130..=0x318F | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF)
}

impl Segment {
    /// Whether its text goes on from the segment before without a space (it begins with a
    /// word written on to the one before: Chinese, Japanese).
    pub fn joins_previous(&self) -> bool {
        self.words.first().is_some_and(|w| w.joined)
    }
}

/// The transcript text: segments joined by a space, or without one where the next goes on.
fn join_segments<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> String {
    let mut out = String::new();
    for seg in segments {
        if !out.is_empty() && !seg.joins_previous() {
            out.push(' ');
        }
        out.push_str(&seg.text);
    }
    out
}

fn group(words: Vec<Word>) -> Vec<Segment> {
    let mut segments: Vec<Segment> = Vec::new();
    for mut word in words {
        let start_new = match segments.last() {
            None => true,
            // The rest of a word stays with it, speaker included.
            Some(seg) if continues(&word) => {
                word.speaker = seg.speaker.clone();
                false
            }
            Some(seg) => {
                seg.speaker != word.speaker
                    || word.start - seg.end > MAX_PAUSE_S
                    || word.end - seg.start > MAX_SEGMENT_S
                    || width(&seg.text) + 1 + width(&word.word) > MAX_SEGMENT_CHARS
                    || (ends_sentence(&seg.text) && seg.end - seg.start > 2.0)
            }
        };
        if start_new {
            segments.push(Segment {
                start: word.start,
                end: word.end,
                speaker: word.speaker.clone(),
                text: word.word.clone(),
                words: vec![word],
            });
        } else if let Some(seg) = segments.last_mut() {
            seg.end = seg.end.max(word.end);
            if !word.joined {
                seg.text.push(' ');
            }
            seg.text.push_str(&word.word);
            seg.words.push(word);
        }
    }
    segments
}

fn ends_sentence(text: &str) -> bool {
    text.ends_with(['.', '?', '!'])
}

#[cfg(test)]
mod tests;
