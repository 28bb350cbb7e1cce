//! `[[services]]`: big on-demand services (vLLM, ComfyUI) that gpuhost starts only when it can
//! grant them the GPU, health-polls, and stops (then verifies their memory came back); and
//! `[arbiter]`: how grants make room and verify teardown.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    pub name: String,
    /// Full argv.
    pub command: Vec<String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Polled until it answers 2xx: then the service is `healthy`.
    pub health_url: String,
    #[serde(default = "default_start_timeout")]
    pub start_timeout_s: f64,
    #[serde(default = "default_poll_interval")]
    pub poll_interval_s: f64,
    /// Declared memory footprint; room is made for it before the start.
    #[serde(default)]
    pub vram_mib: Option<u64>,
    /// The GPU it runs on (nvidia-smi index; default `[gpu] device`). When set, gpuhost sets
    /// `CUDA_VISIBLE_DEVICES` for it and queues its start on that device.
    #[serde(default)]
    pub device: Option<u32>,
    /// Signal sent first when stopping: `SIGTERM` (default) or `SIGINT`.
    #[serde(default = "default_stop_signal")]
    pub stop_signal: String,
    #[serde(default = "default_stop_grace")]
    pub stop_grace_s: f64,
    /// A "free your memory" call tried before any signal (ComfyUI `POST /free`).
    #[serde(default)]
    pub release_url: Option<String>,
    #[serde(default = "default_release_method")]
    pub release_method: String,
    #[serde(default)]
    pub release_body: Option<String>,
    /// Stop after this long without use; 0 = never.
    #[serde(default)]
    pub idle_stop_after_s: f64,
    /// A service used within this long is never stopped to make room for someone else.
    #[serde(default = "default_busy_grace")]
    pub busy_grace_s: f64,
}

fn default_start_timeout() -> f64 {
    120.0
}
fn default_poll_interval() -> f64 {
    1.0
}
fn default_stop_signal() -> String {
    "SIGTERM".into()
}
fn default_stop_grace() -> f64 {
    10.0
}
fn default_release_method() -> String {
    "POST".into()
}
fn default_busy_grace() -> f64 {
    30.0
}

impl ServiceConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        let at = format!("[[services]] `{}`", self.name);
        if !super::validate::plain_name(&self.name) {
            return Err(format!(
                "{at}: name must be 1 to 64 letters, digits, - or _"
            ));
        }
        if self.command.first().is_none_or(|p| p.is_empty()) {
            return Err(format!("{at}: command is empty"));
        }
        super::validate::launchable(&self.command, &self.env).map_err(|e| format!("{at}: {e}"))?;
        http_url(&at, "health_url", &self.health_url)?;
        if let Some(url) = &self.release_url {
            // Checked here, not at the first stop, where a typo only logged a warning.
            http_url(&at, "release_url", url)?;
        }
        if reqwest::Method::from_bytes(self.release_method.as_bytes()).is_err() {
            return Err(format!(
                "{at}: release_method {:?} is not an HTTP method (POST, PUT, DELETE, …)",
                self.release_method
            ));
        }
        super::validate::positive_seconds(
            &format!("{at}:"),
            &[
                ("start_timeout_s", self.start_timeout_s),
                ("poll_interval_s", self.poll_interval_s),
                ("stop_grace_s", self.stop_grace_s),
            ],
        )?;
        super::validate::seconds_or_zero(
            &format!("{at}:"),
            &[
                ("idle_stop_after_s (0: never)", self.idle_stop_after_s),
                ("busy_grace_s", self.busy_grace_s),
            ],
        )?;
        if !matches!(
            self.stop_signal.as_str(),
            "SIGTERM" | "SIGINT" | "SIGQUIT" | "SIGHUP"
        ) {
            return Err(format!(
                "{at}: stop_signal must be SIGTERM, SIGINT, SIGQUIT or SIGHUP"
            ));
        }
        Ok(())
    }

    pub fn signal(&self) -> libc::c_int {
        match self.stop_signal.as_str() {
            "SIGINT" => libc::SIGINT,
            "SIGQUIT" => libc::SIGQUIT,
            "SIGHUP" => libc::SIGHUP,
            _ => libc::SIGTERM,
        }
    }
}

/// `url` (the value of `key` in section `at`) is an http:// or https:// URL with a host.
pub(super) fn http_url(at: &str, key: &str, url: &str) -> Result<(), String> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(_) => Err(format!(
            "{at}: {key} must be an http:// or https:// URL with a host, got {url:?}"
        )),
        Err(e) => Err(format!("{at}: {key} {url:?} is not a URL ({e})")),
    }
}

/// When residents come back after they were unloaded to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reload {
    /// As soon as the GPU is free of exclusive holders.
    Eager,
    /// At the next job that needs them.
    OnDemand,
}

/// What a speech job does with a resident worker it finds unloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Load it again (it stays resident).
    #[default]
    Reload,
    /// Run the stage in a process that exits after the job; the worker stays unloaded.
    Oneshot,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArbiterConfig {
    /// After a holder's processes are gone: how long its memory may take to come back.
    pub teardown_timeout_s: f64,
    /// Memory counts as back when used memory is within this of the level before the holder.
    pub teardown_tolerance_mib: u64,
    pub reload: Reload,
    /// What a speech job does with an unloaded resident worker once it has the GPU.
    pub fallback: Fallback,
    /// Unload a resident worker unused for this long (0 = never); it reloads at the next job.
    pub idle_unload_after_s: f64,
    /// Default and longest lease TTL.
    pub lease_ttl_s: f64,
    pub max_lease_ttl_s: f64,
    /// How far back `GET /gpu/history` (and the dashboard's chart) reaches.
    pub history_s: f64,
}

impl Default for ArbiterConfig {
    fn default() -> Self {
        ArbiterConfig {
            teardown_timeout_s: 60.0,
            teardown_tolerance_mib: 512,
            reload: Reload::Eager,
            fallback: Fallback::Reload,
            idle_unload_after_s: 0.0,
            lease_ttl_s: 60.0,
            max_lease_ttl_s: 24.0 * 3600.0,
            history_s: 3600.0,
        }
    }
}

impl ArbiterConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        super::validate::positive_seconds(
            "[arbiter]",
            &[
                ("teardown_timeout_s", self.teardown_timeout_s),
                ("lease_ttl_s", self.lease_ttl_s),
                ("history_s", self.history_s),
                ("max_lease_ttl_s", self.max_lease_ttl_s),
            ],
        )?;
        super::validate::seconds_or_zero(
            "[arbiter]",
            &[("idle_unload_after_s (0: never)", self.idle_unload_after_s)],
        )?;
        // A lease's TTL is at least 0.1 s (`POST /gpu/lease`): a default below it refused every
        // lease that left `ttl_s` out.
        for (key, value) in [
            ("lease_ttl_s", self.lease_ttl_s),
            ("max_lease_ttl_s", self.max_lease_ttl_s),
        ] {
            if value < 0.1 {
                return Err(format!(
                    "[arbiter] {key} ({value}) is below 0.1 s, the shortest lease TTL"
                ));
            }
        }
        if self.lease_ttl_s > self.max_lease_ttl_s {
            return Err(format!(
                "[arbiter] lease_ttl_s ({}) is above max_lease_ttl_s ({}): every lease without \
                 its own ttl_s would be refused",
                self.lease_ttl_s, self.max_lease_ttl_s
            ));
        }
        Ok(())
    }
}
