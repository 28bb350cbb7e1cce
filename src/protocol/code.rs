//! `ErrorCode`: why a job failed, as its `error` event names it, and the one HTTP status each
//! code answers with.

use serde::{Deserialize, Serialize};

/// Why a job failed: the `code` of its `error` event, and (for `?format=` and the OpenAI
/// endpoint, which answer with one HTTP response) its status code, decided here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A worker could not be started or is restarting after a failure.
    WorkerUnavailable,
    /// A worker died during the job.
    WorkerCrashed,
    /// A worker took longer than its `task_timeout_s`.
    WorkerTimeout,
    /// A worker reported that this job failed for a reason of its own (an exception it did not
    /// classify: a bug, CUDA out of memory); input it cannot take is `Refused`.
    JobFailed,
    /// A worker declined what the job asked (`kind: "refused"`: a language or a translation its
    /// model cannot do, too little speech for a voiceprint): the request's to change, a 400 as
    /// the host's own refusals before the queue are.
    Refused,
    /// A worker said `done` but its result file is missing or not JSON.
    BadOutput,
    /// A worker's disk (or quota) was full (`kind: "no_space"`), as the host's own full temp
    /// dir answers before a job.
    InsufficientStorage,
    /// gpuhost is stopping.
    ShuttingDown,
    /// The client went away; the job was abandoned.
    Cancelled,
    /// This stage was called off because a stage running beside it failed.
    CalledOff,
    /// The job named a stage the pipeline does not have.
    UnknownStage,
    /// A bug in gpuhost (see its log).
    Internal,
}

impl ErrorCode {
    /// The HTTP status of a request that ends with this error.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::WorkerUnavailable | ErrorCode::ShuttingDown => 503,
            ErrorCode::WorkerTimeout => 504,
            // Input a model cannot take is `refused` (400): what is left failed on the server
            // side (a worker bug, CUDA out of memory), which a client may try again.
            ErrorCode::JobFailed => 500,
            ErrorCode::Refused => 400,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::WorkerCrashed | ErrorCode::BadOutput => 502,
            // Nobody reads the answer of a cancelled job; 499 is nginx's "client closed request".
            ErrorCode::Cancelled => 499,
            ErrorCode::CalledOff => 502,
            ErrorCode::UnknownStage => 400,
            ErrorCode::Internal => 500,
        }
    }

    /// The wire name (`worker_crashed`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::WorkerUnavailable => "worker_unavailable",
            ErrorCode::WorkerCrashed => "worker_crashed",
            ErrorCode::WorkerTimeout => "worker_timeout",
            ErrorCode::JobFailed => "job_failed",
            ErrorCode::Refused => "refused",
            ErrorCode::BadOutput => "bad_output",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::CalledOff => "called_off",
            ErrorCode::UnknownStage => "unknown_stage",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
