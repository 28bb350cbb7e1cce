//! The one `Config` struct: parsed from TOML once at startup, then passed down by reference.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod gpu;
mod http;
mod pipeline;
mod service;
mod speakers;
mod spec;
mod validate;
mod worker;
mod wyoming;

pub use gpu::{GpuBackendChoice, GpuConfig, GpuStatusConfig, WatchConfig, WatchRelease};
pub use http::HttpConfig;
pub use pipeline::{AudioConfig, LimitsConfig, PipelineConfig, WORKS_ON};
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
    #[serde(deserialize_with = "validate::socket_addr")]
    pub listen: SocketAddr,
    /// Bearer token required on every endpoint except `/health`, `/ready`, `/openapi.json` and the
    /// dashboard page `/`. `GPUHOST_TOKEN` overrides it.
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
    // Said in the message: a bad GPUHOST_TOKEN was blamed on the config file.
    let (token, source) = match (from_env, from_config) {
        (Some(token), _) => (token, "GPUHOST_TOKEN"),
        (None, Some(token)) => (token, "`token`"),
        (None, None) => return Ok(None),
    };
    let token = token.trim();
    if token.is_empty() {
        return Err(ConfigError::Invalid(format!(
            "{source} is empty or only whitespace: set a real token or remove the key"
        )));
    }
    // It travels in an HTTP header: anything else could never be sent back to match.
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::Invalid(format!(
            "{source} must be printable ASCII without spaces (it is sent as `Authorization: \
             Bearer <token>`); e.g. `openssl rand -hex 32` makes one"
        )));
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
    /// As `Invalid`, found in a file (named, as a parse error is).
    #[error("invalid config file {path}: {message}")]
    InvalidFile { path: PathBuf, message: String },
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
            ConfigError::Invalid(message) => ConfigError::InvalidFile {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text; relative paths resolve against `base_dir`.
    pub fn from_toml(text: &str, base_dir: PathBuf) -> Result<Config, ConfigError> {
        // Where and what, without the line itself (toml's own message quotes it, and the line
        // may be `token = "…`, which would then reach the log or the journal).
        let parse_error = |e: toml::de::Error| {
            let at = e
                .span()
                .and_then(|span| text.get(..span.start))
                .map(|before| {
                    let line = before.matches('\n').count() + 1;
                    let start = before.rfind('\n').map_or(0, |i| i + 1);
                    let column = before[start..].chars().count() + 1;
                    // The key (never its value) where the error is on a `key = value` line: a
                    // bare or dotted key, outside a multi-line string (whose lines are a value's,
                    // `hf_SECRET=…` among them).
                    let in_string = |quotes: &str| before.matches(quotes).count() % 2 == 1;
                    let key = before[start..]
                        .split_once('=')
                        .map(|(key, _)| key.trim())
                        .filter(|key| {
                            !key.is_empty()
                                && key.chars().all(|c| {
                                    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ')
                                })
                        })
                        .filter(|_| !in_string("\"\"\"") && !in_string("'''"))
                        .map(|key| format!(" (`{key}`)"))
                        .unwrap_or_default();
                    format!("line {line}, column {column}{key}: ")
                });
            // "invalid type: integer `123456`, expected a string": the value is left out too.
            let mut message = e.message().trim_end().to_string();
            if message.starts_with("invalid type") || message.starts_with("invalid value") {
                if let Some(open) = message.find('`') {
                    if let Some(len) = message[open + 1..].find('`') {
                        message.replace_range(open..open + len + 2, "(value not shown)");
                    }
                }
            }
            ConfigError::Parse {
                path: PathBuf::from("<text>"),
                message: format!("{}{message}", at.unwrap_or_default()),
            }
        };
        let mut config: Config = toml::from_str(text).map_err(parse_error)?;
        // The workers are those the file writes, and the packaged ones (diarizer, asr, aligner)
        // its pipeline names: `[workers.asr] engine = "base"` alone changes the ASR and keeps the
        // other two, and a services-only host (`stages = []`) starts none.
        let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        let written: Vec<String> = table
            .get("workers")
            .and_then(toml::Value::as_table)
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default();
        let stages = &config.pipeline.stages;
        config
            .workers
            .retain(|name, _| written.contains(name) || stages.contains(name));
        for (name, packaged) in Config::default().workers {
            if stages.contains(&name) && !config.workers.contains_key(&name) {
                config.workers.insert(name, packaged);
            }
        }
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
mod tests;
