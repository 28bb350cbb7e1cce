//! What a service's actor checks around a start: before it, that the program and working folder
//! are there and that nothing serves its URL yet; after it, the health polls until healthy.

use std::time::{Duration, Instant};

use super::{Actor, Running};
use crate::arbiter::services::Control;
use crate::process::{describe_exit, find_program_in};
use crate::worker::lines::next_line_opt as next_line;

impl Actor {
    /// Whether the command's program and working folder are there; what is missing if not.
    pub(super) fn runnable(&self) -> Result<(), String> {
        let cwd = &self.cwd;
        if !cwd.is_dir() {
            let what = if cwd.exists() {
                "is not a folder"
            } else {
                "does not exist"
            };
            return Err(format!(
                "its working folder (`cwd`) {} {what}",
                cwd.display()
            ));
        }
        let program = &self.spec.command[0];
        // The service's own PATH when its `env` sets one (it is looked up there), else gpuhost's.
        let path = match self.spec.env.get("PATH") {
            Some(path) => Some(std::ffi::OsString::from(path)),
            None => std::env::var_os("PATH"),
        };
        if find_program_in(program, cwd, path.as_deref()).is_none() {
            return Err(if program.starts_with('/') {
                format!("cannot run `{program}`: no executable file there")
            } else if program.contains('/') {
                format!(
                    "cannot run `{program}`: no executable file there (relative to {})",
                    cwd.display()
                )
            } else {
                format!(
                    "cannot run `{program}`: no executable of that name on {} PATH; give its absolute path in `command`",
                    if self.spec.env.contains_key("PATH") { "the service's `env`" } else { "gpuhost's" }
                )
            });
        }
        Ok(())
    }

    /// One GET of the health URL: whether it answers 2xx within `timeout`.
    fn probe(&self, timeout: Duration) -> futures_util::future::BoxFuture<'static, bool> {
        let request = self.core.http.get(&self.spec.health_url).timeout(timeout);
        Box::pin(async move { request.send().await.is_ok_and(|r| r.status().is_success()) })
    }

    /// Whether the health URL answers 2xx before the service is started (one try, 2 s at most).
    pub(super) async fn already_served(&self) -> bool {
        self.probe(Duration::from_secs(2)).await
    }

    /// Polls the health URL until it answers 2xx; `Err` on exit, timeout or a stop.
    pub(super) async fn until_healthy(
        &mut self,
        running: &mut Running,
        started: Instant,
    ) -> Result<(), (&'static str, String)> {
        let deadline = tokio::time::Instant::from_std(started)
            + Duration::from_secs_f64(self.spec.start_timeout_s);
        let interval = Duration::from_secs_f64(self.spec.poll_interval_s);
        let mut next_poll = tokio::time::Instant::now();
        // The probe in flight runs beside the other arms: a health URL that never answers
        // neither postpones the deadline nor keeps a stop or the service's log waiting.
        let mut probe: Option<futures_util::future::BoxFuture<'static, bool>> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next_poll), if probe.is_none() => {
                    next_poll += interval;
                    probe = Some(self.probe(interval.max(Duration::from_secs(2))));
                }
                healthy = async { probe.as_mut().expect("guarded by the condition").await }, if probe.is_some() => {
                    probe = None;
                    if healthy {
                        return Ok(());
                    }
                }
                status = running.group.wait() => {
                    // Exit 0 before healthy is most often a command that detaches (a daemon):
                    // what it left is stopped as an orphan, and the message said only "exit 0".
                    let detached = matches!(&status, Ok(s) if s.success());
                    let exit = status.map(|s| describe_exit(&s)).unwrap_or_else(|e| e.to_string());
                    self.drain(running, true).await;
                    let hint = if detached {
                        " (a command that daemonizes or detaches ends this way: gpuhost runs a \
                         service in the foreground and stops what it leaves behind; give it its \
                         foreground option, such as `--no-daemon`)"
                    } else {
                        ""
                    };
                    return Err(("service_failed", format!("exited before it was healthy ({exit}){hint}; last lines:\n{}", self.tail_text())));
                }
                Some(line) = next_line(&mut running.stdout) => self.log(line, true),
                Some(line) = next_line(&mut running.stderr) => self.log(line, true),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(("service_timeout", format!(
                        "not healthy at {} within start_timeout_s = {:.0} s; stopped. Last lines:\n{}",
                        self.spec.health_url, self.spec.start_timeout_s, self.tail_text())));
                }
                control = self.rx.recv() => match control {
                    Some(Control::Stop { reason }) => return Err((self.stop_code(), format!("stopped while starting: {reason}"))),
                    None => return Err(("shutting_down", "gpuhost is shutting down".into())),
                    Some(_) => {}
                },
            }
        }
    }
}
