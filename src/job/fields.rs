//! The task fields a job gives one stage only: the enrolled voiceprints for the `[speakers]
//! stage`, or an enrolment's `action` and `segments`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::{JobKind, PreparedJob};
use crate::AppState;

/// The task fields only the `[speakers] stage` gets: an enrolment's `action`, or the enrolled
/// voiceprints its model made (none for a worker whose `ready` did not say `voiceprints`).
pub(super) fn stage_fields(
    app: &AppState,
    job: &PreparedJob,
) -> HashMap<String, Map<String, Value>> {
    let stage = &app.config.speakers.stage;
    let mut fields = Map::new();
    match &job.kind {
        JobKind::Enroll { segments } => {
            fields.insert("action".into(), "enroll".into());
            if let Some(segments) = segments {
                fields.insert("segments".into(), json!(segments));
            }
        }
        JobKind::Transcribe => {
            if !job.stages.contains(stage) || app.speakers.is_empty() {
                return HashMap::new();
            }
            let loaded = app.supervisor.get(stage).and_then(|w| w.status().loaded);
            let model = loaded.as_ref().map(|l| l.voiceprints.as_deref());
            if model == Some(None) {
                return HashMap::new();
            }
            let prints = app.speakers.prints(model.flatten());
            if prints.is_empty() {
                return HashMap::new();
            }
            fields.insert("voiceprints".into(), Value::Array(prints));
            fields.insert(
                "voiceprint_threshold".into(),
                json!(app.config.speakers.threshold),
            );
        }
    }
    HashMap::from([(stage.clone(), fields)])
}
