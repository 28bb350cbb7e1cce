//! Wire types of both protocols: host↔worker lines (see `protocol/PROTOCOL.md`) and the
//! NDJSON events streamed to HTTP clients. One definition serves the host, the tests and the docs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod code;
mod job;
pub mod label;
pub mod language;
mod task;
pub use code::ErrorCode;
pub use job::{JobOptions, OptionsError};
pub use task::{Task, TaskLine};

/// Protocol version this host speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Prefix of a structured event on a worker's stderr; every other stderr line is a plain log line.
pub const EVENT_PREFIX: &str = "@gpuhost ";

/// Metadata a worker may put after `ready` (all optional; a bare `ready` is protocol 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadyInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Languages the loaded model transcribes (`["en"]` for an English-only model); absent, `"*"`
    /// or `["*"]`: no restriction. Requests for another language are refused before they queue.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "languages"
    )]
    pub languages: Option<Vec<String>>,
    /// The loaded model can translate to English (a task with `translate: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub translate: bool,
    /// The worker abandons a job on `SIGINT` and answers `error` with kind `cancelled`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
    /// The voiceprint model of a worker that makes and matches voiceprints (`POST /speakers`):
    /// voices enrolled with another model are not compared with its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voiceprints: Option<String>,
    /// Seconds the worker's warm-up took before `ready` (shown in `/workers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_s: Option<f64>,
    /// Anything else the worker wants shown in `/workers`.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl ReadyInfo {
    /// Whether the worker said it runs on the CPU (`device` `cpu`, `cpu/int8`, `CPU:0`): it
    /// holds no GPU memory, so nobody unloads it to make room there.
    pub fn runs_on_cpu(&self) -> bool {
        self.device
            .as_deref()
            .and_then(|d| d.split(['/', ':']).next())
            .is_some_and(|kind| kind.trim().eq_ignore_ascii_case("cpu"))
    }
}

/// The longest failure message of a worker passed on, in characters.
const FAILURE_MESSAGE_MAX: usize = 4000;

/// Why a worker says a job failed (`error {json}` on stdout). The worker stays up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskFailure {
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// One line a worker wrote on stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "signal", rename_all = "lowercase")]
pub enum Signal {
    Ready(ReadyInfo),
    Done,
    Error(TaskFailure),
    /// `ready` with a JSON object gpuhost cannot read (a key of the wrong type): the worker
    /// meant it, so its load fails at once and says why, instead of running into the timeout.
    BadReady {
        line: String,
        error: String,
    },
    /// Not a signal: logged as a warning, never breaks a job.
    Other {
        line: String,
    },
}

/// `languages` as a list, or the one string `"*"` (any language).
fn languages<'de, D>(deserializer: D) -> Result<Option<Vec<String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Languages {
        List(Vec<String>),
        Any(String),
    }
    match Option::<Languages>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Languages::List(list)) => Ok(Some(list)),
        Some(Languages::Any(any)) if any == "*" => Ok(Some(vec![any])),
        Some(Languages::Any(other)) => Err(serde::de::Error::custom(format!(
            "`languages` is a list of language codes or \"*\", not {other:?}"
        ))),
    }
}

impl Signal {
    pub fn parse(line: &str) -> Signal {
        let trimmed = line.trim();
        let (word, rest) = match trimmed.split_once(char::is_whitespace) {
            Some((word, rest)) => (word, rest.trim()),
            None => (trimmed, ""),
        };
        match word {
            "ready" if rest.is_empty() => Signal::Ready(ReadyInfo::default()),
            "ready" => match serde_json::from_str::<ReadyInfo>(rest) {
                Ok(info) => Signal::Ready(info),
                // A JSON object is the worker's own `ready`; anything else after the word is a
                // library's line that happens to start with it.
                Err(e) if serde_json::from_str::<serde_json::Map<String, Value>>(rest).is_ok() => {
                    Signal::BadReady {
                        line: line.into(),
                        error: e.to_string(),
                    }
                }
                Err(_) => Signal::Other { line: line.into() },
            },
            "done" if rest.is_empty() => Signal::Done,
            "error" => {
                let mut failure =
                    serde_json::from_str::<TaskFailure>(rest).unwrap_or_else(|_| TaskFailure {
                        message: rest.into(),
                        kind: None,
                    });
                if failure.message.trim().is_empty() {
                    // An object of another shape (`{"error": "CUDA out of memory"}`) is its own
                    // reason; one that says nothing but its kind gave none.
                    let said_more = serde_json::from_str::<serde_json::Map<String, Value>>(rest)
                        .is_ok_and(|o| o.keys().any(|k| k != "kind" && k != "message"));
                    failure.message = if said_more {
                        rest.to_string()
                    } else {
                        "the worker gave no reason".into()
                    };
                }
                // It goes to the client and into `/workers`: a worker's 64 KiB line is a dump.
                failure.message = crate::text::cut(failure.message, FAILURE_MESSAGE_MAX);
                Signal::Error(failure)
            }
            _ => Signal::Other { line: line.into() },
        }
    }
}

/// One line a worker wrote on stderr.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum WorkerEvent {
    /// Progress of the current job: `fraction` in 0..=1, optional message and partial result.
    Progress {
        #[serde(default)]
        fraction: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partial: Option<Value>,
    },
    /// A log line (plain stderr lines become this with no level).
    Log {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<String>,
        message: String,
    },
}

impl WorkerEvent {
    pub fn parse(line: &str) -> WorkerEvent {
        if let Some(json) = line.strip_prefix(EVENT_PREFIX) {
            if let Ok(mut event) = serde_json::from_str::<WorkerEvent>(json) {
                if let WorkerEvent::Progress {
                    fraction: Some(f), ..
                } = &mut event
                {
                    *f = if f.is_finite() {
                        f.clamp(0.0, 1.0)
                    } else {
                        0.0
                    };
                }
                return event;
            }
        }
        WorkerEvent::Log {
            level: None,
            message: line.to_string(),
        }
    }
}

/// Whether a stage started or finished, in `stage` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    Started,
    Done,
    /// Given up because a stage running beside it failed (that failure ends the job).
    CalledOff,
}

/// One line of the NDJSON stream of `POST /transcribe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientEvent {
    /// Waiting for the GPU; `position` 1 is next in line. Sent again whenever it changes.
    /// `waiting_for` names who holds the GPU (or why nothing is granted).
    Queued {
        position: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waiting_for: Option<String>,
    },
    Stage {
        stage: String,
        status: StageStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seconds: Option<f64>,
    },
    Log {
        stage: String,
        line: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<String>,
    },
    Progress {
        stage: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fraction: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        partial: Option<Value>,
    },
    /// The final event of a successful job.
    Result {
        #[schema(value_type = Object)]
        result: Value,
    },
    /// The final event of a failed job.
    Error { code: ErrorCode, message: String },
}

/// One line of the NDJSON stream of a GPU grant: `POST /gpu/lease` (with `wait`) and
/// `POST /services/{name}/start`. Ends with `granted`, `healthy` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GrantEvent {
    /// Waiting for the GPU; `position` 1 is next; `waiting_for` names who holds it (or why not).
    Queued {
        position: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waiting_for: Option<String>,
    },
    /// Someone is stopped, unloaded or asked to free memory so this request fits: `action` is
    /// `unload` or `release`.
    MakingRoom { action: String, target: String },
    /// The service process was started.
    Starting { pid: u32 },
    /// A line the service wrote (stdout or stderr).
    Log { line: String },
    /// The service answers its health URL: done.
    Healthy {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
        seconds: f64,
    },
    /// The lease is yours until `ttl_s` passes without a renewal: done.
    Granted { lease_id: u64, ttl_s: f64 },
    /// The request failed: done.
    Error { code: String, message: String },
}

impl GrantEvent {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            GrantEvent::Healthy { .. } | GrantEvent::Granted { .. } | GrantEvent::Error { .. }
        )
    }

    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("grant events always serialize");
        line.push('\n');
        line
    }
}

impl ClientEvent {
    pub fn is_final(&self) -> bool {
        matches!(self, ClientEvent::Result { .. } | ClientEvent::Error { .. })
    }

    /// The event as one NDJSON line, newline included.
    pub fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).expect("client events always serialize");
        line.push('\n');
        line
    }
}

#[cfg(test)]
mod tests;
