//! The job line the host writes to a worker's stdin (PROTOCOL.md, "The job"), and the fields
//! the pipeline of `POST /transcribe` gives each stage: one definition for host, tests and docs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Per-request options handed to every stage, checked by [`JobOptions::validated`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobOptions {
    /// Language code (`en`, `ko`); absent: the ASR detects it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_speakers: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_speakers: Option<u32>,
    /// Text that primes the ASR (names, spelling).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// Why request options were refused (400, or 413 for an over-long prompt).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionsError {
    #[error("speaker counts must be at least 1")]
    ZeroSpeakers,
    #[error("min_speakers ({min}) is above max_speakers ({max})")]
    MinAboveMax { min: u32, max: u32 },
    #[error("num_speakers ({num}) is outside min_speakers..max_speakers ({min}..{max})")]
    NumOutsideRange { num: u32, min: u32, max: u32 },
    #[error("`language` must be a language code such as `en` or `ko` (at most {LANGUAGE_MAX} characters, no control characters)")]
    BadLanguage,
    #[error("`prompt` is longer than {max} bytes (limits.max_field_bytes)")]
    PromptTooLong { max: usize },
    #[error(
        "language `{language}` is not supported by the `{stage}` worker: {model} knows {} only. \
         Leave `language` out, or configure a multilingual model for it \
         ([workers.{stage}.options] model = …)",
        .known.join(", ")
    )]
    UnsupportedLanguage {
        language: String,
        stage: String,
        model: String,
        known: Vec<String>,
    },
}

/// Longest `language` accepted (codes are 2–3 letters; engines also take a few names).
const LANGUAGE_MAX: usize = 64;

impl JobOptions {
    /// The one check of request options, whichever door they came in by (query string, OpenAI
    /// form, CLI flags): empty strings mean "not given", counts must make sense, text is bounded.
    pub fn validated(mut self, max_prompt_bytes: usize) -> Result<JobOptions, OptionsError> {
        self.language = self
            .language
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty());
        self.prompt = self.prompt.filter(|p| !p.trim().is_empty());
        if let Some(l) = &self.language {
            if l.chars().count() > LANGUAGE_MAX || l.chars().any(char::is_control) {
                return Err(OptionsError::BadLanguage);
            }
        }
        if self
            .prompt
            .as_ref()
            .is_some_and(|p| p.len() > max_prompt_bytes)
        {
            return Err(OptionsError::PromptTooLong {
                max: max_prompt_bytes,
            });
        }
        let counts = [self.num_speakers, self.min_speakers, self.max_speakers];
        if counts.contains(&Some(0)) {
            return Err(OptionsError::ZeroSpeakers);
        }
        if let (Some(min), Some(max)) = (self.min_speakers, self.max_speakers) {
            if min > max {
                return Err(OptionsError::MinAboveMax { min, max });
            }
        }
        if let Some(num) = self.num_speakers {
            let (min, max) = (
                self.min_speakers.unwrap_or(1),
                self.max_speakers.unwrap_or(u32::MAX),
            );
            if num < min || num > max {
                return Err(OptionsError::NumOutsideRange { num, min, max });
            }
        }
        Ok(self)
    }
}

/// What the pipeline sends one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageJob {
    /// The normalized audio: 16 kHz mono PCM16 WAV.
    pub audio_path: PathBuf,
    /// The same path under the name the original workers read.
    pub wav_path: PathBuf,
    /// Its length in seconds.
    pub duration: f64,
    #[serde(flatten)]
    pub options: JobOptions,
    /// The result of every earlier stage, by stage name.
    pub results: Map<String, Value>,
    /// This stage's name.
    #[serde(rename = "_stage")]
    pub stage: String,
}

impl StageJob {
    /// The job as the object a worker gets (before the host's own fields are added).
    pub fn into_fields(self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(), // a struct of strings, numbers and maps always serializes to an object
        }
    }
}

/// One line on a worker's stdin: the job's fields plus the host's `_` fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobLine {
    /// The job: a [`StageJob`]'s fields for pipeline stages, any object for `gpuhost run`, with
    /// the worker's configured `options` merged under them.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
    /// Where the worker must write its result JSON.
    #[serde(rename = "_output_path")]
    pub output_path: PathBuf,
    /// The host's protocol version (absent, read as 0, in lines of the original host).
    #[serde(rename = "_protocol", default)]
    pub protocol: u32,
    /// Only for workers whose `ready` said `"cancel": true`: the file that appears when the
    /// host cancels the job.
    #[serde(
        rename = "_cancel_path",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cancel_path: Option<PathBuf>,
}

impl JobLine {
    /// The host's own fields always win over same-named fields of the job.
    pub fn new(
        mut fields: Map<String, Value>,
        output_path: PathBuf,
        cancel_path: Option<PathBuf>,
    ) -> JobLine {
        for reserved in ["_output_path", "_protocol", "_cancel_path"] {
            fields.remove(reserved);
        }
        JobLine {
            fields,
            output_path,
            protocol: super::PROTOCOL_VERSION,
            cancel_path,
        }
    }

    /// The line as written to stdin, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|_| "{}".into());
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_fields_win_and_round_trip() {
        let mut fields = Map::new();
        fields.insert("text".into(), "hi".into());
        fields.insert("_output_path".into(), "/etc/passwd".into());
        let line = JobLine::new(fields, "/tmp/out.json".into(), None);
        let text = line.to_line();
        assert!(text.ends_with('\n'));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["_output_path"], "/tmp/out.json");
        assert_eq!(v["_protocol"], 1);
        assert!(v.get("_cancel_path").is_none());
        assert_eq!(serde_json::from_str::<JobLine>(&text).unwrap(), line);
    }

    #[test]
    fn options_are_checked_in_one_place() {
        let ok = JobOptions {
            language: Some(" ko ".into()),
            prompt: Some("  ".into()),
            min_speakers: Some(2),
            max_speakers: Some(3),
            ..JobOptions::default()
        }
        .validated(10)
        .unwrap();
        assert_eq!(ok.language.as_deref(), Some("ko"));
        assert_eq!(ok.prompt, None, "blank means not given");
        let check = |o: JobOptions| o.validated(4).unwrap_err();
        let speakers = |num, min, max| JobOptions {
            num_speakers: num,
            min_speakers: min,
            max_speakers: max,
            ..JobOptions::default()
        };
        assert_eq!(
            check(speakers(Some(0), None, None)),
            OptionsError::ZeroSpeakers
        );
        assert_eq!(
            check(speakers(None, Some(3), Some(2))),
            OptionsError::MinAboveMax { min: 3, max: 2 }
        );
        assert!(matches!(
            check(speakers(Some(5), None, Some(3))),
            OptionsError::NumOutsideRange { num: 5, .. }
        ));
        let prompt = JobOptions {
            prompt: Some("names".into()),
            ..JobOptions::default()
        };
        assert_eq!(check(prompt), OptionsError::PromptTooLong { max: 4 });
        let language = JobOptions {
            language: Some("e\u{7}n".into()),
            ..JobOptions::default()
        };
        assert_eq!(check(language), OptionsError::BadLanguage);
    }

    #[test]
    fn stage_job_has_the_documented_fields() {
        let job = StageJob {
            audio_path: "/j/audio.wav".into(),
            wav_path: "/j/audio.wav".into(),
            duration: 1.5,
            options: JobOptions {
                language: Some("ko".into()),
                ..JobOptions::default()
            },
            results: Map::new(),
            stage: "asr".into(),
        };
        let fields = job.clone().into_fields();
        let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "_stage",
                "audio_path",
                "duration",
                "language",
                "results",
                "wav_path"
            ]
        );
        let back: StageJob = serde_json::from_value(Value::Object(fields)).unwrap();
        assert_eq!(back, job);
    }
}
