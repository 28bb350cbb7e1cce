//! A task: one stage's share of a job, run by one worker. The task line the host writes to a
//! worker's stdin (PROTOCOL.md, "The task") and the fields the pipeline gives each stage: one
//! definition for host, tests and docs.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::JobOptions;

/// What the pipeline sends one stage: its task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
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

impl Task {
    /// The task as the object a worker gets (before the host's own fields are added).
    pub fn into_fields(self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(), // a struct of strings, numbers and maps always serializes to an object
        }
    }
}

/// One line on a worker's stdin: the task's fields plus the host's `_` fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskLine {
    /// The task: a [`Task`]'s fields for pipeline stages, any object for `gpuhost run`, with
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
    /// host cancels the task.
    #[serde(
        rename = "_cancel_path",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cancel_path: Option<PathBuf>,
}

impl TaskLine {
    /// The host's own fields always win over same-named fields of the task.
    pub fn new(
        mut fields: Map<String, Value>,
        output_path: PathBuf,
        cancel_path: Option<PathBuf>,
    ) -> TaskLine {
        for reserved in ["_output_path", "_protocol", "_cancel_path"] {
            fields.remove(reserved);
        }
        TaskLine {
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
        let line = TaskLine::new(fields, "/tmp/out.json".into(), None);
        let text = line.to_line();
        assert!(text.ends_with('\n'));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["_output_path"], "/tmp/out.json");
        assert_eq!(v["_protocol"], 1);
        assert!(v.get("_cancel_path").is_none());
        assert_eq!(serde_json::from_str::<TaskLine>(&text).unwrap(), line);
    }

    #[test]
    fn task_has_the_documented_fields() {
        let task = Task {
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
        let fields = task.clone().into_fields();
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
        let back: Task = serde_json::from_value(Value::Object(fields)).unwrap();
        assert_eq!(back, task);
    }
}
