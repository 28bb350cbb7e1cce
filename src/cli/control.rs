//! `gpuhost unload|load WORKER` and `gpuhost start|stop SERVICE`: the dashboard's buttons on the
//! command line, as thin clients of the server's `/workers/{name}/…` and `/services/{name}/…`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use gpuhost::protocol::GrantEvent;
use serde_json::Value;

#[derive(clap::Args)]
pub(crate) struct ControlArgs {
    /// Worker (unload/load) or service (start/stop) name from the server's config.
    name: String,
    /// Base URL of the server; default: the config's listen address.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token (default: the config's `token`).
    #[arg(long, env = "GPUHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Which button.
#[derive(Clone, Copy)]
pub(crate) enum Action {
    Unload,
    Load,
    Start,
    Stop,
}

impl Action {
    /// `base` + `{workers|services}/{name}/{verb}`, the name escaped as one path segment (a
    /// name with `/`, `?` or `..` in it reached another route).
    fn url(self, base: &reqwest::Url, name: &str) -> anyhow::Result<reqwest::Url> {
        // As the config allows them (`.` and `..` would be steps in the path, not a name).
        let plain = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain {
            bail!(
                "no worker or service can be named `{}`: names are 1 to 64 letters, digits, - or _",
                super::shown(name)
            );
        }
        let (kind, verb) = match self {
            Action::Unload => ("workers", "unload"),
            Action::Load => ("workers", "load"),
            Action::Start => ("services", "start"),
            Action::Stop => ("services", "stop"),
        };
        let mut url = base.clone();
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("{base} cannot be a base URL"))?
            .pop_if_empty()
            .extend([kind, name, verb]);
        Ok(url)
    }
}

pub(crate) async fn control(
    config: &gpuhost::Config,
    action: Action,
    args: ControlArgs,
) -> anyhow::Result<ExitCode> {
    let remote = super::Remote::new(config, args.server.as_deref(), args.token.as_deref())?;
    let url = action.url(&remote.base, &args.name)?;
    let request = remote.client.post(url);
    if matches!(action, Action::Start) {
        // Its events stream until the service is healthy.
        return follow_start(&args.name, remote.send(request).await?).await;
    }
    // An unload waits for the task in progress, a stop for the service's grace: untimed.
    let response = remote.send(request).await?;
    let body: Value = response
        .json()
        .await
        .context("the server's answer is not JSON: is --server a gpuhost?")?;
    super::print_result(&(serde_json::to_string(&body)? + "\n"))?;
    // A stop whose teardown failed (the memory never came back) is no success: scripts look at
    // the exit status.
    if matches!(action, Action::Stop) && body["state"] == "failed" {
        bail!(
            "{}: the stop failed: {}",
            args.name,
            super::shown(body["last_error"].as_str().unwrap_or("no reason given"))
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the start's events on stderr until `healthy` (exit 0) or `error` (exit 1).
async fn follow_start(name: &str, response: reqwest::Response) -> anyhow::Result<ExitCode> {
    // A caller that joins a start under way hears where it is at once, then every heartbeat.
    let mut events = super::grant::GrantEvents::new(response, name);
    while let Some(event) = events.next().await? {
        match event {
            GrantEvent::Starting { pid } => gpuhost::say!("{name}: starting (pid {pid})"),
            GrantEvent::Log { line } => gpuhost::say!("{name}| {}", super::shown(&line)),
            GrantEvent::Healthy { pid, seconds } => {
                gpuhost::say!(
                    "{name}: healthy{} after {seconds} s",
                    pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
                );
                return Ok(ExitCode::SUCCESS);
            }
            GrantEvent::Error { code, message } => {
                gpuhost::say!("{name}: failed ({code}): {}", super::shown(&message));
                return Ok(ExitCode::FAILURE);
            }
            _ => {}
        }
    }
    bail!("the server ended the stream before {name} was healthy")
}

#[cfg(test)]
mod tests {
    use super::Action;

    #[test]
    fn a_name_is_one_path_segment() {
        let base = reqwest::Url::parse("http://h:1/gpu/").unwrap();
        let url = |action: Action, name: &str| action.url(&base, name).unwrap().to_string();
        assert_eq!(url(Action::Load, "asr"), "http://h:1/gpu/workers/asr/load");
        assert_eq!(
            url(Action::Stop, "comfy-ui_2"),
            "http://h:1/gpu/services/comfy-ui_2/stop"
        );
        // Another route was reached through such a name (`load ../services/svc/start?`).
        for odd in ["../services/svc/start?", "x?y#z", "..", ".", ""] {
            let refused = Action::Load.url(&base, odd).unwrap_err().to_string();
            assert!(refused.contains("names are 1 to 64"), "{odd}: {refused}");
        }
    }
}
