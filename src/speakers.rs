//! Enrolled voices: the voiceprints kept in `<state_dir>/speakers/`, one file per voice (owner
//! read/write only: a voiceprint is personal data), read once at startup and changed only through
//! `/speakers`. A voice is the samples it was enrolled from; what the diarizer matches is their
//! mean. Deleting a voice removes its file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Longest name, in bytes (a file name holds it twice over in hex).
pub const NAME_MAX: usize = 100;
/// Length of a voiceprint.
pub const DIM: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpeakerError {
    #[error("{0}")]
    BadName(String),
    #[error("no enrolled voice is named `{0}`")]
    NotFound(String),
    #[error("{max} voices are enrolled already ([speakers] max_voices); delete some first")]
    Full { max: usize },
    #[error("`{name}` was enrolled with the model {had}, and this sample comes from {got}; delete `{name}` and enrol it again")]
    OtherModel {
        name: String,
        had: String,
        got: String,
    },
    #[error("the {stage} worker answered without a valid voiceprint (256 finite numbers): {why}")]
    BadVoiceprint { stage: String, why: String },
    #[error("cannot keep the voiceprint in the state folder: {0}")]
    Io(String),
}

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

#[derive(Debug)]
pub struct Speakers {
    dir: PathBuf,
    /// std Mutex: map reads and a small file write, never held across `.await`.
    voices: Mutex<BTreeMap<String, Voice>>,
}

impl Speakers {
    /// Reads every voice in `dir` (missing: none yet). An unreadable file is skipped with a
    /// warning, never a reason not to start.
    pub fn load(dir: PathBuf) -> Speakers {
        let mut voices = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().map_or(true, |e| e != "json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    serde_json::from_slice::<Voice>(&bytes).map_err(|e| e.to_string())
                }) {
                Ok(voice) => {
                    voices.insert(voice.name.clone(), voice);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable voiceprint file")
                }
            }
        }
        Speakers {
            dir,
            voices: Mutex::new(voices),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Voice>> {
        self.voices.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn list(&self) -> Vec<Value> {
        self.lock().values().map(Voice::summary).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// What a diarization task carries: `[{name, vector}]` of every voice made by `model`
    /// (every voice when the worker's model is not known yet).
    pub fn prints(&self, model: Option<&str>) -> Vec<Value> {
        self.lock()
            .values()
            .filter(|v| model.map_or(true, |m| m == v.model))
            .map(|v| json!({ "name": v.name, "vector": v.print() }))
            .collect()
    }

    /// Adds a sample to the voice `name` (creating it), keeping at most `max_samples`.
    pub fn add(
        &self,
        name: &str,
        model: &str,
        sample: Sample,
        max_voices: usize,
        max_samples: usize,
    ) -> Result<Value, SpeakerError> {
        let mut voices = self.lock();
        let mut voice = match voices.get(name) {
            Some(v) if v.model != model => {
                return Err(SpeakerError::OtherModel {
                    name: name.into(),
                    had: v.model.clone(),
                    got: model.into(),
                })
            }
            Some(v) => v.clone(),
            None if voices.len() >= max_voices => {
                return Err(SpeakerError::Full { max: max_voices })
            }
            None => Voice {
                name: name.into(),
                model: model.into(),
                samples: Vec::new(),
            },
        };
        voice.samples.push(sample);
        let excess = voice.samples.len().saturating_sub(max_samples);
        voice.samples.drain(..excess);
        self.write(&voice)
            .map_err(|e| SpeakerError::Io(e.to_string()))?;
        let summary = voice.summary();
        voices.insert(name.into(), voice);
        Ok(summary)
    }

    /// Forgets `name` and removes its file.
    pub fn delete(&self, name: &str) -> Result<(), SpeakerError> {
        let mut voices = self.lock();
        if !voices.contains_key(name) {
            return Err(SpeakerError::NotFound(name.into()));
        }
        match std::fs::remove_file(self.file(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SpeakerError::Io(e.to_string())),
        }
        voices.remove(name);
        Ok(())
    }

    /// `<dir>/<name in hex>.json`: any name, Korean included, is a safe file name.
    fn file(&self, name: &str) -> PathBuf {
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.json"))
    }

    /// Writes the voice's file whole (temporary file, then rename), readable by its owner only.
    fn write(&self, voice: &Voice) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".voice-")
            .tempfile_in(&self.dir)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        tmp.write_all(&serde_json::to_vec(voice).map_err(std::io::Error::other)?)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.file(&voice.name)).map_err(|e| e.error)?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A voice's name as given, trimmed; refused when empty, too long, with control characters, or
/// shaped like the labels of unknown speakers.
pub fn check_name(name: &str) -> Result<String, SpeakerError> {
    let name = name.trim();
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
    if name.chars().any(char::is_control) {
        return Err(SpeakerError::BadName(
            "`name` must not contain control characters".into(),
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
pub fn sample_of(stage: &str, result: &Value, now: u64) -> Result<(String, Sample), SpeakerError> {
    let bad = |why: &str| SpeakerError::BadVoiceprint {
        stage: stage.into(),
        why: why.into(),
    };
    let vector: Vec<f32> = result
        .get("vector")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .ok_or_else(|| bad("no `vector` in its result; does its engine make voiceprints?"))?;
    if vector.len() != DIM || vector.iter().any(|x| !x.is_finite()) {
        return Err(bad(&format!("{} numbers", vector.len())));
    }
    let model = result
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let seconds = result.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
    Ok((
        model,
        Sample {
            vector,
            seconds,
            added: now,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(x: f32) -> Sample {
        let mut vector = vec![0.0; DIM];
        vector[0] = x;
        vector[1] = 1.0;
        Sample {
            vector,
            seconds: 3.0,
            added: 1,
        }
    }

    #[test]
    fn voices_survive_a_restart_and_deletion_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Speakers::load(dir.path().join("speakers"));
        store.add("민수", "m", sample(1.0), 10, 2).unwrap();
        store.add("민수", "m", sample(0.0), 10, 2).unwrap();
        let summary = store.add("민수", "m", sample(-1.0), 10, 2).unwrap();
        assert_eq!(summary["samples"], 2, "the oldest sample is dropped");
        let again = Speakers::load(dir.path().join("speakers"));
        assert_eq!(again.list()[0]["name"], "민수");
        let print = &again.prints(Some("m"))[0]["vector"];
        // The mean of (0, 1) and (-1, 1), made a unit vector.
        assert!((print[1].as_f64().unwrap() - 2.0 / 5f64.sqrt()).abs() < 1e-4);
        assert!(again.prints(Some("other")).is_empty());
        let mode = std::fs::metadata(again.file("민수")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
        again.delete("민수").unwrap();
        assert_eq!(std::fs::read_dir(again.dir()).unwrap().count(), 0);
        assert_eq!(
            again.delete("민수"),
            Err(SpeakerError::NotFound("민수".into()))
        );
    }

    #[test]
    fn limits_and_models_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Speakers::load(dir.path().to_path_buf());
        store.add("a", "m", sample(1.0), 1, 5).unwrap();
        assert_eq!(
            store.add("b", "m", sample(1.0), 1, 5),
            Err(SpeakerError::Full { max: 1 })
        );
        assert!(matches!(
            store.add("a", "n", sample(1.0), 1, 5),
            Err(SpeakerError::OtherModel { .. })
        ));
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(check_name("  Alice ").unwrap(), "Alice");
        assert!(check_name("").is_err());
        assert!(check_name("SPEAKER_00").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"가".repeat(40)).is_err()); // 120 bytes
        let bad = sample_of("diarizer", &json!({"vector": [1.0]}), 0).unwrap_err();
        assert!(bad.to_string().contains("1 numbers"));
    }
}
