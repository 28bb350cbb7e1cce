//! What a request may ask of the pipeline, whichever door it came in by: the stages it runs
//! (known, at least one, none without the stage whose result it works on) and its options
//! (checked once, the language against the loaded models, none for a stage it leaves out).

use crate::pipeline::JobOptions;
use crate::protocol::OptionsError;
use crate::AppState;

/// Stages that work on another's result: asked for without it, the request is refused before it
/// waits in the queue.
use crate::config::WORKS_ON;

/// The stages a request runs, in pipeline order: all of them when `requested` is absent or
/// blank, else the named ones (comma-separated), each known, at least one, and none without
/// the stage whose result it works on.
pub fn select_stages(pipeline: &[String], requested: Option<&str>) -> Result<Vec<String>, String> {
    if pipeline.is_empty() {
        // A host for leases and services only: a job would run nothing and answer 200.
        return Err(
            "there is no pipeline to run ([pipeline] stages is empty): this config serves GPU \
             leases and services only"
                .into(),
        );
    }
    let Some(requested) = requested.filter(|s| !s.trim().is_empty()) else {
        return Ok(pipeline.to_vec());
    };
    let wanted: Vec<&str> = requested
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(unknown) = wanted.iter().find(|w| !pipeline.iter().any(|p| p == *w)) {
        return Err(format!(
            "unknown stage `{unknown}`; the configured pipeline is: {}",
            pipeline.join(", ")
        ));
    }
    if wanted.is_empty() {
        return Err(format!(
            "`stages` names no stage; name some of {} (comma-separated), or leave it out for all",
            pipeline.join(", ")
        ));
    }
    let in_pipeline = |s: &str| pipeline.iter().any(|p| p == s);
    for (stage, input) in WORKS_ON {
        if wanted.contains(stage) && !wanted.contains(input) && in_pipeline(input) {
            return Err(format!(
                "the `{stage}` stage works on the `{input}` stage's result: ask for both \
                 (stages={input},{stage})"
            ));
        }
    }
    Ok(pipeline
        .iter()
        .filter(|p| wanted.contains(&p.as_str()))
        .cloned()
        .collect())
}

/// The request options as every door (HTTP query, OpenAI form, Wyoming) accepts them:
/// [`JobOptions::validated`], then a `language` refused when a stage's loaded model does not
/// know it (its `ready` said which it does) — so a request is never silently answered in English,
/// and is refused before it waits in the queue. A worker not loaded yet is not checked here; its
/// engine refuses the job itself.
pub fn accept_options(
    app: &AppState,
    options: JobOptions,
    stages: &[String],
) -> Result<JobOptions, OptionsError> {
    let options = options.validated(app.config.limits.max_field_bytes)?;
    options_for_stages_run(&options, &app.config.pipeline.stages, stages)?;
    // Already the bare lowercase code (`validated`).
    let language = options.language.as_deref();
    for stage in stages {
        let Some(loaded) = app.supervisor.get(stage).and_then(|w| w.status().loaded) else {
            continue;
        };
        // The stage that says which languages it knows is the ASR.
        let Some(known) = &loaded.languages else {
            continue;
        };
        let model = || loaded.model.clone().unwrap_or_else(|| "model".into());
        if options.translate && !loaded.translate {
            return Err(OptionsError::CannotTranslate {
                stage: stage.clone(),
                model: model(),
            });
        }
        if let Some(language) = language {
            if !known
                .iter()
                .any(|k| k == "*" || k.eq_ignore_ascii_case(language))
            {
                return Err(OptionsError::UnsupportedLanguage {
                    language: language.to_string(),
                    stage: stage.clone(),
                    model: model(),
                    known: known.clone(),
                });
            }
        }
    }
    Ok(options)
}

/// Options for a stage of the pipeline that the request leaves out are refused, not dropped
/// (`num_speakers` with `stages=asr` would otherwise be silently ignored).
pub fn options_for_stages_run(
    options: &JobOptions,
    pipeline: &[String],
    stages: &[String],
) -> Result<(), OptionsError> {
    let left_out =
        |stage: &str| pipeline.iter().any(|p| p == stage) && !stages.iter().any(|s| s == stage);
    let for_asr = [
        ("language", options.language.is_some()),
        ("prompt", options.prompt.is_some()),
        ("translate", options.translate),
    ];
    let for_diarizer = [
        ("num_speakers", options.num_speakers.is_some()),
        ("min_speakers", options.min_speakers.is_some()),
        ("max_speakers", options.max_speakers.is_some()),
    ];
    for (stage, given) in [("asr", &for_asr), ("diarizer", &for_diarizer)] {
        if let Some((option, _)) = given.iter().find(|(_, set)| *set) {
            if left_out(stage) {
                return Err(OptionsError::StageNotRun {
                    option,
                    stage: stage.to_string(),
                });
            }
        }
    }
    // Speaker counts where only the ASR and the aligner run (a pipeline without a diarizer):
    // nothing would read them. A custom stage might, so only these two make the refusal.
    let counts_unread = stages.iter().all(|s| s == "asr" || s == "aligner");
    if let Some((option, _)) = for_diarizer.iter().find(|(_, set)| *set) {
        if counts_unread {
            return Err(OptionsError::NoSuchStage {
                option,
                stage: "diarizer".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_keep_pipeline_order() {
        let p: Vec<String> = ["diarizer", "asr", "aligner"].map(String::from).to_vec();
        assert_eq!(
            select_stages(&p, Some("aligner,asr")).unwrap(),
            ["asr", "aligner"]
        );
        assert_eq!(select_stages(&p, None).unwrap(), p);
        let err = select_stages(&p, Some("asr,ocr")).unwrap_err();
        assert!(err.contains("`ocr`"));
        assert_eq!(
            select_stages(&p, Some(" ")).unwrap(),
            p,
            "blank is not given"
        );
        for none in [",", " , ", ",,"] {
            assert!(select_stages(&p, Some(none))
                .unwrap_err()
                .contains("names no stage"));
        }
        for alone in ["aligner", "diarizer,aligner"] {
            let err = select_stages(&p, Some(alone)).unwrap_err();
            assert!(err.contains("stages=asr,aligner"), "{err}");
        }
        assert!(select_stages(&[], None)
            .unwrap_err()
            .contains("no pipeline to run"));
        // A speaker count with no stage to read it.
        let asr_only: Vec<String> = vec!["asr".into()];
        let counted = JobOptions {
            num_speakers: Some(2),
            ..JobOptions::default()
        };
        let err = options_for_stages_run(&counted, &asr_only, &asr_only).unwrap_err();
        assert!(err.to_string().contains("has none"), "{err}");
        assert!(options_for_stages_run(&counted, &p, &p).is_ok());
        let custom: Vec<String> = vec!["asr".into(), "mine".into()];
        assert!(options_for_stages_run(&counted, &custom, &custom).is_ok());
        // A pipeline without an asr stage has nothing to refuse for.
        let custom: Vec<String> = ["aligner"].map(String::from).to_vec();
        assert_eq!(select_stages(&custom, Some("aligner")).unwrap(), custom);
    }
}
