//! What a lease request asks for, and what it is given: the request, its TTL (bounded by the
//! config) and its device (the one it names, or `"any"`: the one with the most free memory).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Leases;
use crate::arbiter::Core;

/// `POST /gpu/lease`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who holds it (a user, a host, a program).
    pub holder: String,
    #[serde(default)]
    pub purpose: String,
    /// Memory the holder needs; room is made for it. Unknown: every idle worker on the GPU is
    /// unloaded.
    #[serde(default)]
    pub vram_mib: Option<u64>,
    /// Seconds without a renewal after which the lease is reclaimed.
    #[serde(default)]
    pub ttl_s: Option<f64>,
    /// Wait in the queue (NDJSON progress) instead of failing when the GPU is taken.
    #[serde(default)]
    pub wait: bool,
    /// Higher goes first among waiters; nothing running is interrupted.
    #[serde(default)]
    pub priority: i32,
    /// A GPU index, or `"any"` (the one with the most free memory that fits); default: the
    /// server's `[gpu] device`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub device: Option<DeviceChoice>,
}

/// `device` in a lease request: an index or the word `any`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum DeviceChoice {
    Index(u32),
    Any(String),
}

/// Read by hand: serde's untagged enum answered a `-1` or a `1.5` with "data did not match any
/// variant of untagged enum DeviceChoice", which says nothing a person can act on.
impl<'de> Deserialize<'de> for DeviceChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Choice;
        const WANTED: &str = "a GPU index (0, 1, …) or \"any\"";
        impl serde::de::Visitor<'_> for Choice {
            type Value = DeviceChoice;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(WANTED)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DeviceChoice, E> {
                u32::try_from(v)
                    .map(DeviceChoice::Index)
                    .map_err(|_| E::custom(format!("device {v} is not a GPU index")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DeviceChoice, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "device {v} is not a GPU index: give {WANTED}"
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DeviceChoice, E> {
                Ok(DeviceChoice::Any(v.to_string()))
            }
        }
        deserializer.deserialize_any(Choice)
    }
}

impl Leases {
    /// The TTL a request gets: its own (bounded), else the default.
    pub fn ttl(&self, request: &LeaseRequest) -> Result<Duration, String> {
        let config = &self.cores[self.main].config;
        let ttl = request.ttl_s.unwrap_or(config.lease_ttl_s);
        // Under a tenth of a second a lease would expire before its holder could renew it.
        if !(ttl.is_finite() && ttl >= 0.1 && ttl <= config.max_lease_ttl_s) {
            return Err(format!(
                "ttl_s must be at least 0.1 and at most {} (arbiter.max_lease_ttl_s)",
                config.max_lease_ttl_s
            ));
        }
        Ok(Duration::from_secs_f64(ttl))
    }

    /// `device`'s arbiter (`[gpu] device`'s when it has none).
    pub(super) fn core(&self, device: u32) -> &Arc<Core> {
        self.cores
            .iter()
            .find(|c| c.device == device)
            .unwrap_or(&self.cores[self.main])
    }

    /// The device a request gets: the one it names, else `[gpu] device`; with `"any"`, the
    /// device with the most free memory among those nobody holds or waits for (else among all;
    /// speech jobs on the CPU hold and wait for no GPU).
    pub fn device_for(&self, request: &LeaseRequest) -> Result<u32, String> {
        let known = || {
            self.cores
                .iter()
                .map(|c| c.device.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &request.device {
            None => Ok(self.cores[self.main].device),
            Some(DeviceChoice::Index(d)) => self
                .cores
                .iter()
                .find(|c| c.device == *d)
                .map(|c| c.device)
                .ok_or_else(|| {
                    format!(
                        "GPU {d} is not arbitrated here; devices: {} ([gpu] devices)",
                        known()
                    )
                }),
            Some(DeviceChoice::Any(word)) if word == "any" => {
                let free = |c: &Arc<Core>| c.free_mib().unwrap_or(0);
                let quiet: Vec<&Arc<Core>> = self
                    .cores
                    .iter()
                    // Jobs on the CPU take none of a GPU: one that only they hold is quiet.
                    .filter(|c| c.queue.gpu_holders() == 0 && c.queue.head().is_none())
                    .collect();
                let pool: Vec<&Arc<Core>> = if quiet.is_empty() {
                    self.cores.iter().collect()
                } else {
                    quiet
                };
                let fits: Vec<&&Arc<Core>> = pool
                    .iter()
                    .filter(|c| request.vram_mib.is_none_or(|need| free(c) >= need))
                    .collect();
                let best = if fits.is_empty() {
                    pool.iter().max_by_key(|c| free(c))
                } else {
                    fits.into_iter().max_by_key(|c| free(c))
                };
                Ok(best.map_or(self.cores[self.main].device, |c| c.device))
            }
            Some(DeviceChoice::Any(other)) => Err(format!(
                "device must be a GPU index or \"any\", not {other:?}; devices: {}",
                known()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_is_no_index_is_refused_in_words() {
        let read = |json: &str| {
            serde_json::from_str::<LeaseRequest>(&format!(r#"{{"holder": "h", "device": {json}}}"#))
                .map(|r| r.device)
                .map_err(|e| e.to_string())
        };
        assert!(matches!(read("1"), Ok(Some(DeviceChoice::Index(1)))));
        assert!(matches!(read(r#""any""#), Ok(Some(DeviceChoice::Any(w))) if w == "any"));
        for (odd, says) in [
            ("-1", "device -1 is not a GPU index"),
            ("1.5", "expected a GPU index (0, 1, …) or \"any\""),
            ("true", "expected a GPU index"),
            ("4294967296", "device 4294967296 is not a GPU index"),
        ] {
            let err = read(odd).unwrap_err();
            assert!(err.contains(says), "{odd}: {err}");
            assert!(!err.contains("untagged"), "{odd}: {err}");
        }
    }
}
