//! `[http]`: how the server treats connections and browsers — timeouts, the connection cap, the
//! shutdown deadline, and which `Host` names it answers to.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Host names (optionally `name:port`) accepted besides the loopback names (`localhost`,
    /// `127.0.0.1`, `[::1]`). `"*"` accepts any. Without a token every other `Host` is refused,
    /// which stops DNS rebinding; with a token an empty list accepts any `Host`.
    pub allowed_hosts: Vec<String>,
    /// A client must send its request headers within this long (also: how long an idle
    /// keep-alive connection stays open).
    pub header_timeout_s: f64,
    /// Longest pause allowed while a request body streams in.
    pub body_idle_timeout_s: f64,
    /// Slowest average pace of a request body, in bytes a second, once `body_idle_timeout_s`
    /// has passed (as Apache's `mod_reqtimeout` `MinRate`): a body trickled a byte at a time
    /// cannot hold a connection slot for hours. 0 turns the check off.
    pub min_body_rate_bytes_per_s: u64,
    /// Longest a client may leave the answer unread (a write blocked on it) before its
    /// connection is dropped: a client that sends requests and never reads holds no slot.
    pub send_timeout_s: f64,
    /// Connections served at once; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// After a shutdown signal, how long open connections may finish before they are dropped.
    pub shutdown_grace_s: f64,
    /// An NDJSON stream that has sent nothing for this long says again what is going on (its
    /// place in the queue, each running stage's progress): clients and proxies with read
    /// timeouts keep it through a stage's long silent stretch.
    pub heartbeat_s: f64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_hosts: Vec::new(),
            header_timeout_s: 15.0,
            body_idle_timeout_s: 30.0,
            min_body_rate_bytes_per_s: 500,
            send_timeout_s: 60.0,
            max_connections: 512,
            shutdown_grace_s: 10.0,
            heartbeat_s: 10.0,
        }
    }
}

/// The most connections a server may hold open (each is a descriptor and a task).
const MAX_CONNECTIONS: usize = 1_000_000;

/// Longest pause between heartbeats of an event stream.
const MAX_HEARTBEAT_S: f64 = 120.0;

impl HttpConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        super::validate::positive_seconds(
            "[http]",
            &[
                ("header_timeout_s", self.header_timeout_s),
                ("body_idle_timeout_s", self.body_idle_timeout_s),
                ("send_timeout_s", self.send_timeout_s),
                ("shutdown_grace_s", self.shutdown_grace_s),
                ("heartbeat_s", self.heartbeat_s),
            ],
        )?;
        // Client commands give up a stream silent for 300 s (`cli::STREAM_SILENCE`); proxies
        // commonly after 60–120 s.
        if self.heartbeat_s > MAX_HEARTBEAT_S {
            return Err(format!(
                "[http] heartbeat_s must be at most {MAX_HEARTBEAT_S} (clients and proxies give up \
                 a silent stream), got {}",
                self.heartbeat_s
            ));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(format!(
                "[http] max_connections must be from 1 to {MAX_CONNECTIONS}, got {}",
                self.max_connections
            ));
        }
        if let Some(bad) = self.allowed_hosts.iter().find(|h| h.trim().is_empty()) {
            return Err(format!("[http] allowed_hosts has an empty entry: {bad:?}"));
        }
        // A Host header is a name and perhaps a port: an entry with a scheme or a path never
        // matches one, and (the list not empty) every other LAN name is refused with it.
        let not_a_host = |h: &String| h.contains(['/', '@', ' ', '?', '#']);
        if let Some(bad) = self.allowed_hosts.iter().find(|h| not_a_host(h)) {
            return Err(format!(
                "[http] allowed_hosts entries are host names, with a port or not (`gpu-box`, \
                 `gpu-box:9090`), not URLs: {bad:?}"
            ));
        }
        Ok(())
    }
}
