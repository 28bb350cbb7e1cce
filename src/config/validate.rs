//! `Config::validate`: the checks across sections, run once after parsing (stages name workers,
//! services are unique, timings are positive, a non-loopback listener has a token).

use super::{Config, ConfigError};

/// The longest time a setting may give (about 31 years): longer ones are typos, and they would
/// not fit the clocks they are added to.
pub(super) const MAX_SECONDS: f64 = 1e9;

/// Every `(key, value)` of section `at` is a positive, finite number of seconds, at most
/// `MAX_SECONDS`.
pub(super) fn positive_seconds(at: &str, fields: &[(&str, f64)]) -> Result<(), String> {
    seconds(at, fields, false)
}

/// Every `(key, value)` of section `at` is 0 (what 0 means is the key's) or a positive number of
/// seconds, at most `MAX_SECONDS`.
pub(super) fn seconds_or_zero(at: &str, fields: &[(&str, f64)]) -> Result<(), String> {
    seconds(at, fields, true)
}

fn seconds(at: &str, fields: &[(&str, f64)], zero: bool) -> Result<(), String> {
    let low = |v: f64| if zero { v >= 0.0 } else { v > 0.0 };
    match fields
        .iter()
        .find(|(_, value)| !(low(*value) && *value <= MAX_SECONDS))
    {
        Some((key, value)) => Err(format!(
            "{at} {key} must be {}a positive number of seconds (at most {MAX_SECONDS:e}), got {value}",
            if zero { "0 or " } else { "" }
        )),
        None => Ok(()),
    }
}

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for stage in &self.pipeline.stages {
            if !self.workers.contains_key(stage) {
                return Err(ConfigError::Invalid(format!(
                    "pipeline stage `{stage}` names no worker; define [workers.{stage}] or remove it from [pipeline] stages"
                )));
            }
        }
        self.pipeline.validate().map_err(ConfigError::Invalid)?;
        for stage in self.wyoming.stages.iter().flatten() {
            if !self.pipeline.stages.contains(stage) {
                return Err(ConfigError::Invalid(format!(
                    "[wyoming] stages names `{stage}`, which is not a [pipeline] stage"
                )));
            }
        }
        self.http.validate().map_err(ConfigError::Invalid)?;
        self.arbiter.validate().map_err(ConfigError::Invalid)?;
        self.speakers.validate().map_err(ConfigError::Invalid)?;
        let mut names = std::collections::BTreeSet::new();
        for service in &self.services {
            service.validate().map_err(ConfigError::Invalid)?;
            if !names.insert(service.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "[[services]] `{}` is defined twice",
                    service.name
                )));
            }
        }
        if self.limits.max_queue == 0 {
            return Err(ConfigError::Invalid(
                "[limits] max_queue must be at least 1".into(),
            ));
        }
        if self.gpu.max_concurrent_jobs == 0 {
            return Err(ConfigError::Invalid(
                "[gpu] max_concurrent_jobs must be at least 1".into(),
            ));
        }
        let st = &self.gpu.status;
        positive_seconds(
            "[gpu.status]",
            &[
                ("interval_s", st.interval_s),
                ("stale_after_s", st.stale_after_s),
                ("timeout_s", st.timeout_s),
            ],
        )
        .map_err(ConfigError::Invalid)?;
        seconds_or_zero("[gpu.status]", &[("quiet_period_s", st.quiet_period_s)])
            .map_err(ConfigError::Invalid)?;
        positive_seconds("[setup]", &[("timeout_s", self.setup.timeout_s)])
            .map_err(ConfigError::Invalid)?;
        if let Some(w) = self.gpu.watch.iter().find(|w| w.pattern.is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "[[gpu.watch]] `{}` has an empty pattern",
                w.name
            )));
        }
        for (name, w) in &self.workers {
            positive_seconds(
                &format!("[workers.{name}]"),
                &[
                    ("load_timeout_s", w.load_timeout_s),
                    ("task_timeout_s", w.task_timeout_s),
                    ("stop_grace_s", w.stop_grace_s),
                    ("cancel_grace_s", w.cancel_grace_s),
                ],
            )
            .map_err(ConfigError::Invalid)?;
        }
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on non-loopback address {} without a token: set `token` in the config or GPUHOST_TOKEN",
                self.listen
            )));
        }
        Ok(())
    }
}
