//! `[speakers]`: enrolled voiceprints — which stage makes and matches them, and how alike a
//! voice must be to get an enrolled name.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpeakersConfig {
    /// The pipeline stage that enrols voices (`POST /speakers`) and names the speakers it
    /// finds after them: a worker whose `ready` says `voiceprints` (the packaged diarizer).
    pub stage: String,
    /// Cosine similarity (−1..1) from which a speaker gets an enrolled name. Higher: fewer
    /// wrong names, more speakers left as `SPEAKER_nn`.
    pub threshold: f64,
    /// Voices kept at most; enrolling more is refused (409) until some are deleted.
    pub max_voices: usize,
    /// Samples kept per voice; enrolling another drops the oldest. The voiceprint is their mean.
    pub max_samples: usize,
}

impl Default for SpeakersConfig {
    fn default() -> Self {
        SpeakersConfig {
            stage: "diarizer".into(),
            // Tuned on the real meeting clips' train split (docs/benchmarks.md, "Voiceprints").
            threshold: 0.4,
            max_voices: 1000,
            max_samples: 20,
        }
    }
}

impl SpeakersConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        if !(self.threshold.is_finite() && (-1.0..=1.0).contains(&self.threshold)) {
            return Err(format!(
                "[speakers] threshold must be a cosine similarity between -1 and 1, got {}",
                self.threshold
            ));
        }
        if self.max_voices == 0 || self.max_samples == 0 {
            return Err("[speakers] max_voices and max_samples must be at least 1".into());
        }
        if self.stage.trim().is_empty() {
            return Err("[speakers] stage must name a pipeline stage (default `diarizer`)".into());
        }
        Ok(())
    }
}
