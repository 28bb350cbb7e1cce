//! `Config::validate`: the checks across sections, run once after parsing (stages name workers,
//! services are unique, timings are positive; and, for serving only, a non-loopback listener has a
//! token).

use super::{Config, ConfigError};

/// The longest time a setting may give (about 31 years): longer ones are typos, and they would
/// not fit the clocks they are added to.
pub(super) const MAX_SECONDS: f64 = 1e9;

/// The smallest `[limits] max_field_bytes`: every text field gpuhost documents fits in it.
const MIN_FIELD_BYTES: usize = 128;

/// The shortest time a setting other than 0 may give: shorter ones become a zero `Duration`
/// (which a timer refuses) or busy loops.
const MIN_SECONDS: f64 = 0.001;

/// Whether `name` may name a worker or a service: it becomes a file name (`<stage>.result.json`),
/// a URL segment and a TOML key.
pub(super) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// A `command` and `env` a process can be started with: the program not empty, no NUL byte
/// anywhere (exec refuses them: the child would fail at every start), env names non-empty and
/// without `=`. An empty `command` passes (a worker's default; a service checks its own).
pub(super) fn launchable(
    command: &[String],
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    if command.first().is_some_and(|p| p.is_empty()) {
        return Err("command starts with an empty program".into());
    }
    let texts = command.iter().chain(env.keys()).chain(env.values());
    if let Some(bad) = texts.into_iter().find(|s| s.contains('\0')) {
        return Err(format!("{bad:?} holds a NUL byte"));
    }
    if let Some(key) = env.keys().find(|k| k.is_empty() || k.contains('=')) {
        return Err(format!(
            "env has the key {key:?}: a name must be non-empty and hold no `=`"
        ));
    }
    Ok(())
}

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
    let fine = |v: f64| (zero && v == 0.0) || (MIN_SECONDS..=MAX_SECONDS).contains(&v);
    match fields.iter().find(|(_, value)| !fine(*value)) {
        Some((key, value)) => Err(format!(
            "{at} {key} must be {}a number of seconds from {MIN_SECONDS} to {MAX_SECONDS:e}, got {value}",
            if zero { "0 or " } else { "" }
        )),
        None => Ok(()),
    }
}

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        for (name, worker) in &self.workers {
            if !plain_name(name) {
                return invalid(format!(
                    "[workers.{name:?}]: a worker's name must be 1 to 64 letters, digits, - or _ \
                     (it names files and URLs)"
                ));
            }
            worker
                .validate()
                .map_err(|m| ConfigError::Invalid(format!("[workers.{name}] {m}")))?;
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(twice) = self.pipeline.stages.iter().find(|s| !seen.insert(*s)) {
            return invalid(format!(
                "[pipeline] stages names `{twice}` twice; a stage runs once a job"
            ));
        }
        // The normalized audio is a WAV file (16 kHz, 16 bits), whose sizes are 32-bit: 37 h,
        // less the second ffmpeg decodes past the limit to find it was passed.
        let wav_max = (f64::from(u32::MAX - 1024) / 32_000.0 - 1.0).floor();
        if !(self.limits.max_audio_seconds >= 1.0 && self.limits.max_audio_seconds <= wav_max) {
            return invalid(format!(
                "[limits] max_audio_seconds must be a number of seconds from 1 to {wav_max:.0} (37 h: the normalized audio is a WAV file, whose sizes are 32-bit), got {}",
                self.limits.max_audio_seconds
            ));
        }
        if self.gpu.device > u32::MAX as usize {
            return invalid(format!(
                "[gpu] device must be a GPU index (nvidia-smi's numbering), got {}",
                self.gpu.device
            ));
        }
        if self.gpu.status.interval_s < 0.05 {
            return invalid(format!(
                "[gpu.status] interval_s must be at least 0.05 (each sample runs nvidia-smi or \
                 NVML), got {}",
                self.gpu.status.interval_s
            ));
        }
        if self.gpu.status.idle_utilization_pct > 100 {
            return invalid(format!(
                "[gpu.status] idle_utilization_pct is a percentage, 0 to 100, got {}",
                self.gpu.status.idle_utilization_pct
            ));
        }
        if self.limits.max_field_bytes < MIN_FIELD_BYTES {
            return invalid(format!(
                "[limits] max_field_bytes must be at least {MIN_FIELD_BYTES} (a speaker's name \
                 may take 100 bytes, a language's name or a model's id as many), got {}",
                self.limits.max_field_bytes
            ));
        }
        if self.limits.max_upload_bytes == 0 {
            return invalid("[limits] max_upload_bytes is 0: every upload would be refused".into());
        }
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
        self.wyoming.validate().map_err(ConfigError::Invalid)?;
        if self.wyoming.listen.is_some() {
            // Wyoming answers with text: without the asr every answer would be an empty one.
            let stages = self.wyoming.stages(&self.pipeline.stages);
            crate::render::fits(crate::render::Format::Txt, &stages).map_err(|_| {
                ConfigError::Invalid(format!(
                    "[wyoming] runs the stages {stages:?}, which give no text: its stages must \
                     include `asr`"
                ))
            })?;
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
        let mut watched = std::collections::BTreeSet::new();
        for w in &self.gpu.watch {
            w.validate().map_err(ConfigError::Invalid)?;
            // Its name keys what the samples told of it and its hold on the queue: a second
            // entry of that name was never looked at.
            if !watched.insert(w.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "[[gpu.watch]] `{}` is defined twice",
                    w.name
                )));
            }
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
        let st = &self.gpu.status;
        if st.stale_after_s <= st.interval_s {
            return Err(ConfigError::Invalid(format!(
                "[gpu.status] stale_after_s ({}) must be more than interval_s ({}): every sample \
                 would be stale before the next one, and the GPU would read unknown for good",
                st.stale_after_s, st.interval_s
            )));
        }
        Ok(())
    }

    /// What only serving needs (client commands read the same file to find the server and its
    /// token, and must not be refused for it): a token beyond loopback, and two listeners on
    /// two addresses.
    pub fn check_serving(&self) -> Result<(), ConfigError> {
        if !self.listen.ip().is_loopback() {
            match self.token.as_deref() {
                None => {
                    return Err(ConfigError::Invalid(format!(
                        "refusing to listen on non-loopback address {} without a token: set \
                         `token` in the config or GPUHOST_TOKEN",
                        self.listen
                    )))
                }
                Some(token) if token.chars().count() < TOKEN_MIN || token == "change-me" => {
                    return Err(ConfigError::Invalid(format!(
                        "refusing to listen on non-loopback address {} with a token that is \
                         easy to guess (at least {TOKEN_MIN} characters, not the README's \
                         placeholder): `openssl rand -hex 16` makes one",
                        self.listen
                    )))
                }
                Some(_) => {}
            }
        }
        // (Port 0 is any free port: two of them are two.)
        if self.listen.port() != 0 && self.wyoming.listen == Some(self.listen) {
            return Err(ConfigError::Invalid(format!(
                "[wyoming] listen is the address of `listen` ({}): give each its own port",
                self.listen
            )));
        }
        Ok(())
    }
}

/// The shortest token gpuhost serves beyond loopback with.
const TOKEN_MIN: usize = 12;

/// An address to listen on, said plainly when it is not one (serde's "invalid socket address
/// syntax" did not say that `localhost:9090` needs an IP address).
pub(super) fn socket_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::net::SocketAddr, D::Error> {
    use serde::Deserialize;
    let text = String::deserialize(d)?;
    text.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "`{text}` is not an IP address and port, such as 127.0.0.1:9090, 0.0.0.0:9090 or \
             [::1]:9090 (host names such as localhost are not looked up)"
        ))
    })
}

/// [`socket_addr`] for an optional address.
pub(super) fn some_socket_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    socket_addr(d).map(Some)
}
