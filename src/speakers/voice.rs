//! One enrolled voice: its samples and their mean, and the checks every voice passes (its name,
//! its vectors, a worker's answer).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{SpeakerError, DIM, NAME_MAX};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub vector: Vec<f32>,
    /// Seconds of speech it was taken from.
    pub seconds: f64,
    /// Unix time it was enrolled.
    pub added: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Voice {
    pub name: String,
    /// The embedding model (the worker's `ready` key `voiceprints`).
    pub model: String,
    pub samples: Vec<Sample>,
}

impl Voice {
    /// What `GET /speakers` shows of a voice (never the vectors).
    pub fn summary(&self) -> Value {
        json!({
            "name": self.name,
            "model": self.model,
            "samples": self.samples.len(),
            "seconds": (self.samples.iter().map(|s| s.seconds).sum::<f64>() * 100.0).round() / 100.0,
            "created": self.samples.iter().map(|s| s.added).min(),
            "updated": self.samples.iter().map(|s| s.added).max(),
        })
    }

    /// The unit mean of the samples: what speakers are matched against.
    pub fn print(&self) -> Vec<f32> {
        let mut mean = vec![0f32; DIM];
        for sample in &self.samples {
            for (m, x) in mean.iter_mut().zip(&sample.vector) {
                *m += x;
            }
        }
        let norm = mean.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        mean.iter().map(|x| x / norm).collect()
    }
}

/// A voice read from disk is one the API could have made.
pub(super) fn sound(voice: &Voice) -> Result<(), String> {
    // As the API keeps it: a name stored otherwise (" Hal", an older build's NFD) could be
    // listed but never deleted, since DELETE looks the normalized name up.
    if check_name(&voice.name).map_err(|e| e.to_string())? != voice.name {
        return Err(format!(
            "its name {:?} is not written as names are kept (trimmed, one space between words, NFC)",
            voice.name
        ));
    }
    if voice.samples.is_empty() {
        return Err("it has no samples".into());
    }
    voice
        .samples
        .iter()
        .try_for_each(|s| check_vector(&s.vector))
}

/// 256 finite numbers, not all zero.
fn check_vector(vector: &[f32]) -> Result<(), String> {
    if vector.len() != DIM {
        return Err(format!("{} numbers instead of {DIM}", vector.len()));
    }
    if vector.iter().any(|x| !x.is_finite()) {
        return Err("numbers that are not finite".into());
    }
    if vector.iter().all(|x| *x == 0.0) {
        return Err("a vector of zeros".into());
    }
    Ok(())
}

/// A name as it is kept and looked up: trimmed, each run of spaces of any kind one plain space
/// ("Bob\u{A0}Smith" and "Bob  Smith" are "Bob Smith": they look alike, and RTTM wrote both as
/// `Bob_Smith`), in Unicode NFC (so "민수" typed on any system is one name).
pub fn normal_name(name: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    // Control characters (a newline, a tab) are left for `check_name` to refuse.
    let spaced: Vec<&str> = name
        .trim()
        .split(|c: char| c.is_whitespace() && !c.is_control())
        .filter(|word| !word.is_empty())
        .collect();
    spaced.join(" ").nfc().collect()
}

/// A voice's name as given, normalized ([`normal_name`]); refused when empty, too long, with control characters, or
/// shaped like the labels of unknown speakers.
pub fn check_name(name: &str) -> Result<String, SpeakerError> {
    let name = normal_name(name);
    let name = name.as_str();
    if name.is_empty() {
        return Err(SpeakerError::BadName(
            "the form field `name` is missing or empty".into(),
        ));
    }
    if name.len() > NAME_MAX {
        return Err(SpeakerError::BadName(format!(
            "`name` is longer than {NAME_MAX} bytes"
        )));
    }
    // Control characters, and the invisible ones that make two names look alike (joiners too:
    // a voice's name is how it is told apart).
    if !crate::protocol::label::shows_as_text(name) || name.contains(['\u{200C}', '\u{200D}']) {
        return Err(SpeakerError::BadName(
            "`name` must not contain control or invisible characters".into(),
        ));
    }
    // URLs take `.` and `..` as steps in the path: `DELETE /speakers/..` could never reach it.
    if name == "." || name == ".." {
        return Err(SpeakerError::BadName(
            "`.` and `..` cannot be names (a URL cannot hold them); choose another".into(),
        ));
    }
    if name.starts_with("SPEAKER_") {
        return Err(SpeakerError::BadName(
            "names starting with `SPEAKER_` are the labels of speakers nobody enrolled; choose another".into(),
        ));
    }
    Ok(name.to_string())
}

/// The voiceprint in a worker's enrolment result: `(model, sample)`.
pub fn sample_of(
    stage: &str,
    result: &Value,
    now: u64,
    audio_seconds: f64,
) -> Result<(String, Sample), SpeakerError> {
    let bad = |why: &str| SpeakerError::BadVoiceprint {
        stage: stage.into(),
        why: why.into(),
    };
    let vector: Vec<f32> = result
        .get("vector")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or_else(|| bad("no `vector` in its result; does its engine make voiceprints?"))?;
    check_vector(&vector).map_err(|why| bad(&why))?;
    let model = result
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let seconds = result.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
    // Its speech is part of the audio it was given: a sum of such lengths must stay a number.
    if !(0.0..=audio_seconds + 1.0).contains(&seconds) {
        return Err(bad(&format!(
            "`seconds` {seconds} is not a length of speech in {audio_seconds:.1} s of audio"
        )));
    }
    Ok((
        model,
        Sample {
            vector,
            seconds,
            added: now,
        },
    ))
}
