//! The one `Config` struct: parsed from TOML once at startup, then passed down by reference.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod gpu;
mod http;
mod pipeline;
mod service;
mod speakers;
mod worker;
mod wyoming;

pub use gpu::{GpuBackendChoice, GpuConfig, GpuStatusConfig, WatchConfig, WatchRelease};
pub use http::HttpConfig;
pub use pipeline::{AudioConfig, LimitsConfig, PipelineConfig};
pub use service::{ArbiterConfig, Fallback, Reload, ServiceConfig};
pub use speakers::SpeakersConfig;
pub use worker::{Mode, SetupConfig, WorkerConfig, WorkerSpec};
pub use wyoming::WyomingConfig;

/// Everything gpuhost can be told. Unknown keys are rejected so a typo never silently
/// falls back to a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP server binds to.
    pub listen: SocketAddr,
    /// Bearer token required on every endpoint except `/health`. `GPUHOST_TOKEN` overrides it.
    pub token: Option<String>,
    /// Folder holding one package per worker (`workers/<name>/`), relative to the config file.
    pub workers_dir: PathBuf,
    pub workers: BTreeMap<String, WorkerConfig>,
    pub pipeline: PipelineConfig,
    pub gpu: GpuConfig,
    pub limits: LimitsConfig,
    pub http: HttpConfig,
    pub audio: AudioConfig,
    pub setup: SetupConfig,
    /// On-demand services started through the GPU queue.
    pub services: Vec<ServiceConfig>,
    pub arbiter: ArbiterConfig,
    /// Wyoming speech-to-text for Home Assistant; off unless `listen` is set.
    pub wyoming: WyomingConfig,
    /// Enrolled voices (`/speakers`) and how speakers are matched to them.
    pub speakers: SpeakersConfig,
    /// Folder for what gpuhost keeps between runs (measured VRAM footprints, enrolled
    /// voiceprints under `speakers/`), relative to the config file; created on first use.
    pub state_dir: PathBuf,
    /// Folder the config file was read from; relative paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        let workers = ["diarizer", "asr", "aligner"]
            .into_iter()
            .map(|name| (name.to_string(), WorkerConfig::default()))
            .collect();
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            workers_dir: PathBuf::from("workers"),
            workers,
            pipeline: PipelineConfig::default(),
            gpu: GpuConfig::default(),
            limits: LimitsConfig::default(),
            http: HttpConfig::default(),
            audio: AudioConfig::default(),
            wyoming: WyomingConfig::default(),
            speakers: SpeakersConfig::default(),
            setup: SetupConfig::default(),
            services: Vec::new(),
            arbiter: ArbiterConfig::default(),
            state_dir: PathBuf::from("state"),
            base_dir: PathBuf::from("."),
        }
    }
}

/// The token in force: `GPUHOST_TOKEN` wins over the config's, but an empty one counts as not
/// set (it must never turn auth off); surrounding whitespace (a newline from a secrets file) is
/// never part of a token; a token of only whitespace is an error, not "no token".
fn effective_token(
    from_config: Option<String>,
    from_env: Option<String>,
) -> Result<Option<String>, ConfigError> {
    let from_env = from_env.filter(|t| !t.trim().is_empty());
    let Some(token) = from_env.or(from_config) else {
        return Ok(None);
    };
    let token = token.trim();
    if token.is_empty() {
        return Err(ConfigError::Invalid(
            "`token` is empty or only whitespace: set a real token or remove the key".into(),
        ));
    }
    Ok(Some(token.to_string()))
}

/// Points a child at one GPU (nvidia-smi's numbering), unless its env already chose.
pub fn pin_device(env: &mut BTreeMap<String, String>, device: u32) {
    env.entry("CUDA_VISIBLE_DEVICES".into())
        .or_insert_with(|| device.to_string());
    env.entry("CUDA_DEVICE_ORDER".into())
        .or_insert_with(|| "PCI_BUS_ID".into());
}

fn base_dir_join(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl Config {
    /// Reads `path`; when `required` is false a missing file yields the defaults.
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Config::default().finish(PathBuf::from("."));
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Config::from_toml(&text, base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text; relative paths resolve against `base_dir`.
    pub fn from_toml(text: &str, base_dir: PathBuf) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            message: e.to_string(),
        })?;
        config.finish(base_dir)
    }

    fn finish(mut self, base_dir: PathBuf) -> Result<Config, ConfigError> {
        // Absolute, so that paths stay right for workers started in their own folders.
        self.base_dir = std::path::absolute(&base_dir).unwrap_or(base_dir);
        self.token = effective_token(self.token.take(), std::env::var("GPUHOST_TOKEN").ok())?;
        if let Some(dir) = self.limits.temp_dir.take() {
            self.limits.temp_dir =
                Some(std::path::absolute(base_dir_join(&self.base_dir, &dir)).unwrap_or(dir));
        }
        if let Some(dir) = self.limits.small_temp_dir.take() {
            self.limits.small_temp_dir = Some(if dir.as_os_str().is_empty() {
                dir // off
            } else {
                std::path::absolute(base_dir_join(&self.base_dir, &dir)).unwrap_or(dir)
            });
        }
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<(), ConfigError> {
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
        for (key, value) in [
            ("interval_s", st.interval_s),
            ("stale_after_s", st.stale_after_s),
            ("timeout_s", st.timeout_s),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ConfigError::Invalid(format!(
                    "[gpu.status] {key} must be a positive number of seconds, got {value}"
                )));
            }
        }
        if !(st.quiet_period_s.is_finite() && st.quiet_period_s >= 0.0) {
            return Err(ConfigError::Invalid(
                "[gpu.status] quiet_period_s must be 0 or more".into(),
            ));
        }
        if let Some(w) = self.gpu.watch.iter().find(|w| w.pattern.is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "[[gpu.watch]] `{}` has an empty pattern",
                w.name
            )));
        }
        for (name, w) in &self.workers {
            for (key, value) in [
                ("load_timeout_s", w.load_timeout_s),
                ("task_timeout_s", w.task_timeout_s),
                ("stop_grace_s", w.stop_grace_s),
                ("cancel_grace_s", w.cancel_grace_s),
            ] {
                if !(value.is_finite() && value > 0.0) {
                    return Err(ConfigError::Invalid(format!(
                        "[workers.{name}] {key} must be a positive number of seconds, got {value}"
                    )));
                }
            }
        }
        if !self.listen.ip().is_loopback() && self.token.is_none() {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on non-loopback address {} without a token: set `token` in the config or GPUHOST_TOKEN",
                self.listen
            )));
        }
        Ok(())
    }

    /// `state_dir`, resolved.
    pub fn state_dir(&self) -> PathBuf {
        self.resolve(&self.state_dir)
    }

    /// Where folders of small jobs are created, if anywhere (see `limits.small_temp_dir`).
    pub fn small_temp_dir(&self) -> Option<PathBuf> {
        match &self.limits.small_temp_dir {
            Some(dir) if dir.as_os_str().is_empty() => None,
            Some(dir) => Some(dir.clone()),
            None => Some(PathBuf::from("/dev/shm")).filter(|d| d.is_dir()),
        }
    }

    /// Where job folders are created.
    pub fn temp_dir(&self) -> PathBuf {
        self.limits
            .temp_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir)
    }

    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// `workers/<name>`, resolved.
    pub fn worker_home(&self, name: &str) -> PathBuf {
        self.resolve(&self.workers_dir).join(name)
    }

    /// The launch description for worker `name`, with defaults filled in.
    pub fn worker_spec(&self, name: &str) -> Option<WorkerSpec> {
        let w = self.workers.get(name)?;
        let home = self.resolve(&self.workers_dir).join(name);
        let argv = if w.command.is_empty() {
            let module = w
                .module
                .clone()
                .unwrap_or_else(|| format!("gpuhost_{name}"));
            vec![
                home.join(".venv/bin/python").display().to_string(),
                "-m".into(),
                module,
            ]
        } else {
            w.command.clone()
        };
        let cwd = match &w.cwd {
            Some(cwd) => self.resolve(cwd),
            None if home.is_dir() => home,
            None => self.base_dir.clone(),
        };
        let mut env = w.env.clone();
        if let Some(device) = w.device {
            pin_device(&mut env, device);
        }
        if let Some(engine) = &w.engine {
            env.insert("GPUHOST_ENGINE".into(), engine.clone());
        }
        if !w.options.is_empty() {
            env.insert(
                "GPUHOST_OPTIONS".into(),
                serde_json::Value::Object(w.options.clone()).to_string(),
            );
        }
        Some(WorkerSpec {
            name: name.to_string(),
            argv,
            cwd,
            env,
            mode: w.mode,
            vram_mib: w.vram_mib,
            load_timeout: Duration::from_secs_f64(w.load_timeout_s),
            task_timeout: Duration::from_secs_f64(w.task_timeout_s),
            stop_grace: Duration::from_secs_f64(w.stop_grace_s),
            cancel_grace: Duration::from_secs_f64(w.cancel_grace_s),
            options: w.options.clone(),
            unloaded_fallback: self.arbiter.fallback,
            device: w.device.unwrap_or(self.gpu.device as u32),
        })
    }

    /// Every GPU the arbiter keeps a queue for: `[gpu] device`, `[gpu] devices`, and any a
    /// worker or service names; sorted, each once.
    pub fn arbitrated_devices(&self) -> Vec<u32> {
        let mut devices: Vec<u32> = std::iter::once(self.gpu.device as u32)
            .chain(self.gpu.devices.iter().copied())
            .chain(self.workers.values().filter_map(|w| w.device))
            .chain(self.services.iter().filter_map(|s| s.device))
            .collect();
        devices.sort_unstable();
        devices.dedup();
        devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("listen = \"127.0.0.1:1\"\nlisen = 3\n", ".".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("lisen"), "{err}");
        let err = Config::from_toml(
            "[workers.a]\ncommand=[\"x\"]\nmdoe = \"oneshot\"\n",
            ".".into(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("mdoe"), "{err}");
    }

    #[test]
    fn defaults_serve_the_speech_pipeline() {
        let c = Config::default().finish(".".into()).unwrap();
        assert_eq!(c.listen.port(), 9090);
        assert_eq!(c.pipeline.stages, ["diarizer", "asr", "aligner"]);
        let spec = c.worker_spec("asr").unwrap();
        assert!(
            spec.argv[0].ends_with("workers/asr/.venv/bin/python"),
            "{:?}",
            spec.argv
        );
        assert_eq!(
            spec.argv[1..],
            ["-m".to_string(), "gpuhost_asr".to_string()]
        );
    }

    #[test]
    fn example_config_is_valid_and_matches_defaults() {
        let text = include_str!("../gpuhost.example.toml");
        let c = Config::from_toml(text, ".".into()).unwrap();
        let d = Config::default();
        assert_eq!(c.listen, d.listen);
        assert_eq!(c.pipeline.stages, d.pipeline.stages);
        assert_eq!(c.gpu.status.quiet_period_s, d.gpu.status.quiet_period_s);
        assert_eq!(c.limits.max_upload_bytes, d.limits.max_upload_bytes);
        assert_eq!(
            c.workers["asr"].load_timeout_s,
            d.workers["asr"].load_timeout_s
        );
    }

    #[test]
    fn non_loopback_needs_token() {
        let err = Config::from_toml("listen = \"0.0.0.0:9090\"\n", ".".into()).unwrap_err();
        assert!(err.to_string().contains("without a token"));
        let ok = Config::from_toml(
            "listen = \"0.0.0.0:9090\"\ntoken = \"s3cret\"\n",
            ".".into(),
        );
        assert!(ok.is_ok());
    }

    #[test]
    fn stage_must_name_a_worker() {
        let err = Config::from_toml("[pipeline]\nstages = [\"nope\"]\n", ".".into()).unwrap_err();
        assert!(err.to_string().contains("`nope`"), "{err}");
    }

    #[test]
    fn parallel_groups_default_and_checks() {
        let d = Config::default();
        assert_eq!(d.pipeline.parallel_groups(), [["diarizer", "asr"]]);
        let only_asr = Config::from_toml("[pipeline]\nstages = [\"asr\"]\n", ".".into()).unwrap();
        assert!(only_asr.pipeline.parallel_groups().is_empty());
        let off = Config::from_toml("[pipeline]\nparallel = []\n", ".".into()).unwrap();
        assert!(off.pipeline.parallel_groups().is_empty());
        for (toml, says) in [
            ("parallel = [[\"asr\", \"ocr\"]]", "`ocr`"),
            ("parallel = [[\"diarizer\", \"aligner\"]]", "consecutive"),
            (
                "parallel = [[\"diarizer\", \"asr\"], [\"asr\", \"aligner\"]]",
                "more than once",
            ),
        ] {
            let err = Config::from_toml(&format!("[pipeline]\n{toml}\n"), ".".into()).unwrap_err();
            assert!(err.to_string().contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn needs_default_and_checks() {
        assert!(Config::default().pipeline.needs_map().is_empty());
        let on = Config::from_toml("[pipeline]\nneeds = { aligner = [\"asr\"] }\n", ".".into());
        assert_eq!(on.unwrap().pipeline.needs_map()["aligner"], ["asr"]);
        for (toml, says) in [
            ("needs = { ocr = [\"asr\"] }", "`ocr`"),
            ("needs = { asr = [\"aligner\"] }", "not `aligner`"),
            ("needs = { asr = [\"asr\"] }", "not `asr`"),
        ] {
            let err = Config::from_toml(&format!("[pipeline]\n{toml}\n"), ".".into()).unwrap_err();
            assert!(err.to_string().contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn token_edge_cases() {
        let t = |c: Option<&str>, e: Option<&str>| {
            effective_token(c.map(String::from), e.map(String::from))
        };
        assert_eq!(t(Some("abc"), Some("")).unwrap().as_deref(), Some("abc"));
        assert_eq!(
            t(Some("abc"), Some("  \n")).unwrap().as_deref(),
            Some("abc")
        );
        assert_eq!(
            t(Some("abc"), Some(" xyz\n")).unwrap().as_deref(),
            Some("xyz")
        );
        assert_eq!(t(Some(" abc \n"), None).unwrap().as_deref(), Some("abc"));
        assert_eq!(t(None, None).unwrap(), None);
        assert!(t(Some("   "), None).is_err());
    }
}
