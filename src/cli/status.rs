//! `gpuhost status`: the GPU snapshot of a running server as a readable terminal view (or JSON).

use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    /// Base URL of the server; default: the config's listen address.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token (default: the config's `token`).
    #[arg(long, env = "GPUHOST_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the raw JSON of GET /status.
    #[arg(long)]
    json: bool,
    /// Also list every GPU backend and path that was tried and why it is unavailable.
    #[arg(long, short)]
    verbose: bool,
}

pub(crate) async fn status(config: &gpuhost::Config, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let remote = super::Remote::new(config, args.server.as_deref(), args.token.as_deref())?;
    let url = remote.base.join("status")?;
    let body: Value = remote
        .send(remote.client.get(url).timeout(super::QUICK))
        .await?
        .json()
        .await
        .context("the server's answer is not JSON")?;
    anyhow::ensure!(
        body.get("decision").is_some(),
        "the answer has no `decision`: is {} a gpuhost?",
        remote.base
    );
    // Written as one piece: a reader that goes away (`| head`) ends the command quietly.
    let mut out = String::new();
    if args.json {
        out = serde_json::to_string_pretty(&body)? + "\n";
    } else {
        out.push_str(&super::shown(&render(&body)));
        if args.verbose {
            for u in body["backend"]["unavailable"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.push_str(&format!(
                    "backend {} unavailable: {}\n",
                    u["backend"].as_str().unwrap_or("?"),
                    super::shown(u["error"].as_str().unwrap_or(""))
                ));
            }
        }
    }
    super::print_result(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// A field that is one line on the terminal: a line break in a command line (an argument may
/// hold one) would start a line of its own that reads as gpuhost's.
fn one_line(text: &str) -> String {
    text.replace('\n', "\\n").replace('\r', "\\r")
}

/// The terminal view of a `/status` body.
pub(crate) fn render(s: &Value) -> String {
    let mut out = String::new();
    let decision = s["decision"].as_str().unwrap_or("unknown").to_uppercase();
    out.push_str(&format!(
        "{decision}  {}\n",
        one_line(s["reason"].as_str().unwrap_or(""))
    ));
    // Read as `Value`s, never indexed into a map: a field the answer lacks reads as null.
    let g = &s["gpu"];
    match g.is_object() {
        true => {
            let used = g["memory_used_mib"].as_u64().unwrap_or(0);
            let total = g["memory_total_mib"].as_u64().unwrap_or(0).max(1);
            // At most the bar's 30 cells, whatever the figures say.
            let filled = (used.min(total).saturating_mul(30) / total) as usize;
            out.push_str(&format!(
                "GPU {} {}  util {}%  {} °C  {:.0} W\nVRAM [{}{}] {used}/{total} MiB  free {} MiB  reclaimable {} MiB\n",
                g["index"], g["name"].as_str().unwrap_or(""), g["utilization"], g["temperature"],
                g["power_draw"].as_f64().unwrap_or(0.0), "#".repeat(filled), "-".repeat(30 - filled),
                s["free_mib"], s["reclaimable_mib"],
            ));
            out.push_str(&format!(
                "is_idle: {}  (backend {})\n",
                s["is_idle"],
                s["backend"]["active"].as_str().unwrap_or("?")
            ));
        }
        // Without a sample, `is_idle` is false for want of knowing (the decision line says
        // UNKNOWN): printed, it read as "something runs on the GPU".
        false => out.push_str(&format!(
            "GPU: no sample ({}; backend {}), so not known to be idle\n",
            s["error"].as_str().unwrap_or("none yet"),
            s["backend"]["active"].as_str().unwrap_or("?")
        )),
    }
    let procs = s["processes"].as_array().cloned().unwrap_or_default();
    if procs.is_empty() {
        out.push_str("no processes on the GPU\n");
    }
    for p in procs {
        let tag = p["worker"]
            .as_str()
            .or(p["watch"].as_str())
            .map(|t| format!(" [{t}]"))
            .unwrap_or_default();
        // (As text: a `Value` takes no width, and the columns did not line up.)
        let number = |v: &Value| v.as_u64().map_or_else(|| "?".into(), |n| n.to_string());
        out.push_str(&format!(
            "  {:>7}  {:>6} MiB  {}{tag}\n           {}\n",
            number(&p["pid"]),
            number(&p["used_memory_mib"]),
            one_line(p["name"].as_str().unwrap_or("")),
            one_line(p["command"].as_str().unwrap_or(""))
        ));
    }
    // A pid only while there is a process (it read `pid null`).
    let pid = |v: &Value| {
        v["pid"]
            .as_u64()
            .map(|p| format!(" pid {p}"))
            .unwrap_or_default()
    };
    for w in s["workers"].as_array().cloned().unwrap_or_default() {
        out.push_str(&format!(
            "worker  {:<10} {:<8}{}\n",
            w["name"].as_str().unwrap_or(""),
            w["state"].as_str().unwrap_or(""),
            pid(&w)
        ));
    }
    for v in s["services"].as_array().cloned().unwrap_or_default() {
        let error = match (v["state"].as_str(), v["last_error"].as_str()) {
            // Its first line: the rest is the service's own log.
            (Some("failed"), Some(e)) => format!("  {}", e.lines().next().unwrap_or("")),
            _ => String::new(),
        };
        out.push_str(&format!(
            "service {:<10} {:<8}{}{error}\n",
            v["name"].as_str().unwrap_or(""),
            v["state"].as_str().unwrap_or(""),
            pid(&v)
        ));
    }
    out.push_str(&format!(
        "queue: {} running, {} waiting\n",
        s["queue"]["running"], s["queue"]["waiting"]
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::render;
    use serde_json::json;

    #[test]
    fn any_answer_renders_and_the_bar_stays_30_cells() {
        for gpu in [
            json!({"name": "x"}),
            json!({"memory_used_mib": 600_000_000_000_000_000u64, "memory_total_mib": 0}),
            json!({"memory_used_mib": 1_000_000_000u64, "memory_total_mib": 1}),
            json!({"memory_used_mib": 20000, "memory_total_mib": 0}),
            json!({"memory_used_mib": 8000, "memory_total_mib": 32000}),
        ] {
            let text = render(&json!({ "gpu": gpu, "processes": [{}], "workers": "x" }));
            let bar = text.lines().find(|l| l.starts_with("VRAM [")).unwrap();
            let cells = &bar[6..bar.find(']').unwrap()];
            assert_eq!(cells.chars().count(), 30, "{bar}");
        }
        let unknown = render(&json!({"decision": "unknown", "is_idle": false}));
        assert!(unknown.contains("no sample"), "{unknown}");
        assert!(!unknown.contains("is_idle"), "{unknown}");
    }

    #[test]
    fn services_and_the_backend_are_shown_and_no_pid_is_null() {
        let text = render(&json!({
            "backend": {"active": "nvml"},
            "is_idle": false,
            "queue": {"running": 0, "waiting": 0},
            "workers": [{"name": "asr", "state": "unloaded", "pid": null}],
            "services": [
                {"name": "llm", "state": "healthy", "pid": 42},
                {"name": "img", "state": "failed", "pid": null, "last_error": "the service exited\nTraceback"},
            ],
        }));
        assert!(text.contains("backend nvml"), "{text}");
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains("service llm        healthy  pid 42"),
            "{text}"
        );
        assert!(
            text.contains("service img        failed    the service exited\n"),
            "{text}"
        );
    }

    #[test]
    fn a_command_line_cannot_make_a_line_of_its_own_and_columns_line_up() {
        let text = render(&json!({
            "decision": "busy",
            "reason": "x\nIDLE  forged",
            "gpu": {"memory_used_mib": 1, "memory_total_mib": 2},
            "processes": [{"pid": 42, "used_memory_mib": 700, "name": "python", "command": "train.py\nIDLE  nothing runs"}],
        }));
        assert!(!text.lines().any(|l| l.starts_with("IDLE")), "{text}");
        assert!(text.contains("train.py\\nIDLE"), "{text}");
        assert!(text.contains("       42     700 MiB  python"), "{text}");
    }
}
