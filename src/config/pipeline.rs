//! `[pipeline]`, `[limits]` and `[audio]`: which stages a job runs, how big it may be, and how
//! its audio is decoded.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// Stages that work on another's result (the aligner aligns the ASR's words): the pipeline must
/// run that one first, and a request may not ask for the one without the other.
pub const WORKS_ON: &[(&str, &str)] = &[("aligner", "asr")];

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// Worker names run in order for `POST /transcribe`.
    pub stages: Vec<String>,
    /// Groups of consecutive stages that run at the same time when all their workers are
    /// resident (each sees the results of the stages before its group). Default: diarizer and
    /// asr together, when the pipeline has both.
    pub parallel: Option<Vec<Vec<String>>>,
    /// The earlier stages a stage waits for, when not all of them: it starts once these are
    /// done, beside whatever else runs (resident workers only). Default: none named, so every
    /// stage waits for all before it (on 2 CPU cores, the aligner beside the diarizer gained
    /// nothing: docs/benchmarks.md).
    pub needs: Option<BTreeMap<String, Vec<String>>>,
}

impl PipelineConfig {
    /// The parallel groups in effect.
    pub fn parallel_groups(&self) -> Vec<Vec<String>> {
        match &self.parallel {
            Some(groups) => groups.clone(),
            None => {
                let default = ["diarizer", "asr"];
                if default.iter().all(|d| self.stages.iter().any(|s| s == d)) {
                    vec![default.map(String::from).to_vec()]
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// The `needs` in effect.
    pub fn needs_map(&self) -> BTreeMap<String, Vec<String>> {
        self.needs.clone().unwrap_or_default()
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        self.inputs_first()?;
        for (stage, needs) in self.needs.iter().flatten() {
            let at = self.stages.iter().position(|s| s == stage).ok_or_else(|| {
                format!("[pipeline] needs names `{stage}`, which is not in [pipeline] stages")
            })?;
            if let Some(later) = needs
                .iter()
                .find(|n| !self.stages[..at].iter().any(|s| s == *n))
            {
                return Err(format!(
                    "[pipeline] needs: `{stage}` can only need stages before it in [pipeline] stages, not `{later}`"
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for group in self.parallel.iter().flatten() {
            let at: Vec<usize> = group
                .iter()
                .map(|name| {
                    self.stages.iter().position(|s| s == name).ok_or_else(|| {
                        format!(
                            "[pipeline] parallel names `{name}`, which is not in [pipeline] stages"
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            if at.windows(2).any(|w| w[1] != w[0] + 1) {
                return Err(format!(
                    "[pipeline] parallel group {group:?} must list consecutive stages in pipeline order"
                ));
            }
            if let Some(twice) = group.iter().find(|name| !seen.insert(name.as_str())) {
                return Err(format!(
                    "[pipeline] parallel names `{twice}` more than once"
                ));
            }
        }
        Ok(())
    }
}

impl PipelineConfig {
    /// Each stage of [`WORKS_ON`] has its input before it: in `stages`, in an earlier parallel
    /// group, and among its `needs` when it names any. (Without it, every job failed in the
    /// worker with its traceback.)
    fn inputs_first(&self) -> Result<(), String> {
        let position = |name: &str| self.stages.iter().position(|s| s == name);
        for (stage, input) in WORKS_ON {
            let Some(at) = position(stage) else {
                continue;
            };
            if position(input).is_none_or(|i| i >= at) {
                return Err(format!(
                    "[pipeline] stages: `{stage}` works on the `{input}` stage's result, so \
                     `{input}` must come before it (stages = [\"diarizer\", \"{input}\", \"{stage}\"])"
                ));
            }
            let together = self
                .parallel_groups()
                .into_iter()
                .any(|group| group.iter().any(|g| g == stage) && group.iter().any(|g| g == input));
            if together {
                return Err(format!(
                    "[pipeline] parallel: `{stage}` works on the `{input}` stage's result, so it \
                     cannot run beside it"
                ));
            }
            let needs = self.needs.as_ref().and_then(|n| n.get(*stage));
            if needs.is_some_and(|n| !n.iter().any(|x| x == input)) {
                return Err(format!(
                    "[pipeline] needs: `{stage}` works on the `{input}` stage's result, so its \
                     needs must include `{input}`"
                ));
            }
        }
        Ok(())
    }
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            stages: vec!["diarizer".into(), "asr".into(), "aligner".into()],
            parallel: None,
            needs: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body, every multipart field included.
    pub max_upload_bytes: u64,
    pub max_audio_seconds: f64,
    /// Longest text field of a form (`prompt`, `language`, …) and `prompt` query value.
    pub max_field_bytes: usize,
    /// Jobs waiting for the GPU at most; beyond it `/transcribe` answers 429 with `Retry-After`.
    pub max_queue: usize,
    /// Where job folders go (default: the system temp dir). Leftovers of a host that died are
    /// swept from here at start.
    pub temp_dir: Option<PathBuf>,
    /// Where folders of small jobs go: uploads that already are 16 kHz mono PCM16 WAV of at most
    /// 256 KiB (8 s: voice commands, short clips). Default: `/dev/shm` when it exists, a folder
    /// in memory, which spares them the disk filesystem's file creation and removal. `""` turns
    /// it off. A folder that cannot be used there falls back to `temp_dir`.
    pub small_temp_dir: Option<PathBuf>,
    /// Free space kept on the temp dir's filesystem: an upload (HTTP or Wyoming) that would
    /// leave less is refused with 507 `insufficient_storage` while it streams, and a decode is
    /// stopped once the disk is below it (looked at every second). 0 turns the check off.
    pub min_free_bytes: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_upload_bytes: 512 * 1024 * 1024,
            max_audio_seconds: 4.0 * 3600.0,
            max_field_bytes: 8 * 1024,
            max_queue: 64,
            temp_dir: None,
            small_temp_dir: None,
            min_free_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AudioConfig {
    /// `ffmpeg` used for what symphonia cannot decode; looked up on PATH when relative.
    /// Empty string disables the fallback.
    pub ffmpeg: String,
    /// The `gpuhost` executable whose hidden `decode-audio` subcommand decodes uploads in a
    /// child process (`audio/child.rs`). Not read from TOML: the `gpuhost` binary sets it to
    /// itself; `None` (a library user) decodes in process.
    #[serde(skip)]
    pub decoder: Option<std::path::PathBuf>,
}

impl Default for AudioConfig {
    fn default() -> Self {
        AudioConfig {
            ffmpeg: "ffmpeg".into(),
            decoder: None,
        }
    }
}
