//! How a service's actor stops it: the release call, signal → grace → kill of its group, the
//! verified teardown, and only then the GPU handed on (or the queue blocked until it is free).

use std::time::{Duration, Instant};

use super::{Actor, Running};
use crate::arbiter::services::ServiceState;
use crate::arbiter::teardown::Gone;
use crate::protocol::GrantEvent;

impl Actor {
    /// Release call, signal → grace → kill, verified teardown, then the GPU goes on.
    pub(super) async fn stop(&mut self, mut running: Running, reason: &str, failure: Option<&str>) {
        let pid = running.group.pid();
        tracing::info!(service = %self.spec.name, pid, %reason, "stopping service");
        self.set(ServiceState::Stopping, |_| {});
        if failure.is_some() {
            // Its callers hear the failure once the process is gone; a caller joining meanwhile
            // is told nothing of the dying process and waits for the next start.
            self.events.ending();
        }
        if let Some(url) = &self.spec.release_url {
            let method = reqwest::Method::from_bytes(self.spec.release_method.as_bytes())
                .unwrap_or(reqwest::Method::POST);
            let body = self.spec.release_body.clone().unwrap_or_default();
            match self.core.http.request(method, url).body(body).send().await {
                Ok(r) => {
                    tracing::info!(service = %self.spec.name, status = r.status().as_u16(), "release call made")
                }
                Err(e) => {
                    tracing::warn!(service = %self.spec.name, error = %e, "release call failed")
                }
            }
        }
        let stopped_at = Instant::now();
        running.group.signal(self.spec.signal());
        if running
            .group
            .wait_timeout(Duration::from_secs_f64(self.spec.stop_grace_s))
            .await
            .is_none()
        {
            tracing::warn!(service = %self.spec.name, pid, "service ignored its stop signal; killing its group");
            running.group.kill().await;
        }
        let gone = Gone {
            what: format!("service {}", self.spec.name),
            pids: vec![pid],
            pgid: Some(pid),
            baseline_used_mib: running.baseline_used_mib,
            listed_before: running.listed_before.take(),
            watch: None,
            after: stopped_at,
        };
        running.permit.ended();
        // (Not waited for once the queue is closed: see `verify_teardown`.)
        let verified = self.core.verify_teardown(&gone).await;
        // Gone, or given up on: a process that outlives its group's kill is the block's to name.
        self.core.service_pids.ended(pid);
        let Running { permit, .. } = running;
        match verified {
            Ok(()) => {
                drop(permit);
                match failure {
                    // Stopped while starting: its callers hear why; the service is stopped,
                    // not failed.
                    Some(code @ ("stopped" | "shutting_down")) => {
                        self.emit(GrantEvent::Error {
                            code: code.into(),
                            message: reason.to_string(),
                        });
                        self.set(ServiceState::Stopped, |s| s.pid = None);
                    }
                    Some(code) => self.fail(code, reason.to_string()),
                    None => self.set(ServiceState::Stopped, |s| s.pid = None),
                }
            }
            Err(why) => {
                let freed = self.core.block_until_freed(gone, why.clone());
                // A stop asked for, healthy or while it started (not a crash's, nor a failed
                // start's): once the memory is back, the service is just stopped.
                if matches!(failure, None | Some("stopped")) {
                    self.blocked = Some((freed, Instant::now()));
                }
                drop(permit);
                self.fail("teardown_failed", why);
            }
        }
    }

    /// The memory a failed teardown left came back: a service still `failed` for it is
    /// stopped now (its GPU is free again); `last_error` keeps what happened.
    pub(super) fn memory_back(&mut self, failed: Instant, back: Instant) {
        if self.status.borrow().state != ServiceState::Failed {
            return;
        }
        let later = back.saturating_duration_since(failed).as_secs_f64();
        tracing::info!(service = %self.spec.name, "its memory came back; stopped");
        self.set(ServiceState::Stopped, |s| {
            if let Some(error) = &mut s.last_error {
                error.push_str(&format!(" (its memory came back {later:.0} s later)"));
            }
        });
    }
}
