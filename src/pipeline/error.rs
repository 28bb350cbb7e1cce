//! How a job's run through the stages fails: a stage's own error, an unknown stage, the client
//! gone, or a stage called off because one beside it failed; each with its wire `ErrorCode`.

use crate::protocol::ErrorCode;
use crate::worker::TaskError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum PipelineError {
    #[error("stage `{stage}`: {source}")]
    Stage { stage: String, source: TaskError },
    #[error("unknown stage `{0}`")]
    UnknownStage(String),
    #[error("the client went away; the job was abandoned")]
    Cancelled,
    /// Given up because the stage `by`, running beside it, failed (not the client's doing).
    #[error("stage `{stage}` was called off because stage `{by}` failed")]
    CalledOff { stage: String, by: String },
}

impl PipelineError {
    /// A stage given up because the job's cancel token fired (a sibling failed, or the client).
    pub(super) fn cancelled(&self) -> bool {
        matches!(
            self,
            PipelineError::Stage {
                source: TaskError::Cancelled { .. },
                ..
            } | PipelineError::CalledOff { .. }
        )
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            PipelineError::Stage { source, .. } => source.code(),
            PipelineError::UnknownStage(_) => ErrorCode::UnknownStage,
            PipelineError::Cancelled => ErrorCode::Cancelled,
            PipelineError::CalledOff { .. } => ErrorCode::CalledOff,
        }
    }
}
