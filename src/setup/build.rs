//! Building one worker's venv: `uv` or `python3 -m venv` + pip, the SDK and the package with its
//! dependencies, the package's own setup step, then the fingerprint that marks it done.

use std::time::Duration;

use super::{fingerprint, Package, SetupError, State, STATE_FILE};
use crate::config::Config;
use crate::process::find_program;

pub(super) async fn build(
    config: &Config,
    pkg: &Package,
    say: &dyn Fn(&str),
) -> Result<(), SetupError> {
    let timeout = Duration::from_secs_f64(config.setup.timeout_s);
    let venv = pkg.venv().display().to_string();
    let _ = std::fs::remove_file(pkg.venv().join(STATE_FILE));
    let (sdk, home) = (
        pkg.sdk.display().to_string(),
        format!("{}[test]", pkg.home.display()),
    );
    let installer = match find_program("uv") {
        Some(uv) => {
            say(&format!("[{}] creating {venv} (uv)", pkg.name));
            pkg.run(
                "uv venv",
                &uv,
                &["venv".into(), "--allow-existing".into(), venv.clone()],
                timeout,
            )
            .await?;
            say(&format!(
                "[{}] installing {} and the worker SDK (uv pip)…",
                pkg.name,
                pkg.home.display()
            ));
            let python = pkg.python().display().to_string();
            let args = [
                "pip", "install", "--python", &python, "-e", &sdk, "-e", &home,
            ]
            .map(String::from);
            let what = format!("[{}] still installing (uv pip)", pkg.name);
            heartbeat(say, &what, pkg.run("uv pip install", &uv, &args, timeout)).await?;
            "uv"
        }
        None => {
            let python = find_program(&config.setup.python).ok_or_else(|| {
                pkg.step_error("venv", format!("{} not found", config.setup.python))
            })?;
            say(&format!(
                "[{}] creating {venv} ({})",
                pkg.name,
                python.display()
            ));
            pkg.run(
                "python -m venv",
                &python,
                &["-m".into(), "venv".into(), venv.clone()],
                timeout,
            )
            .await?;
            say(&format!(
                "[{}] installing {} and the worker SDK (pip; first time takes minutes)…",
                pkg.name,
                pkg.home.display()
            ));
            let args = [
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "-e",
                &sdk,
                "-e",
                &home,
            ]
            .map(String::from);
            let what = format!("[{}] still installing (pip)", pkg.name);
            heartbeat(
                say,
                &what,
                pkg.run("pip install", &pkg.python(), &args, timeout),
            )
            .await?;
            "pip"
        }
    };
    say(&format!("[{}] checking imports…", pkg.name));
    pkg.self_test().await?;
    say(&format!("[{}] preparing models…", pkg.name));
    pkg.prepare().await?;
    let freeze = pkg
        .run(
            "pip freeze",
            &pkg.python(),
            &["-m".into(), "pip".into(), "freeze".into()],
            timeout,
        )
        .await
        .unwrap_or_default();
    let state = State {
        inputs: pkg.inputs(),
        resolved: fingerprint(&[&freeze]),
        installer: installer.into(),
    };
    let json = serde_json::to_vec_pretty(&state).expect("state serializes");
    std::fs::write(pkg.venv().join(STATE_FILE), json)
        .map_err(|e| pkg.step_error("write state", e.to_string()))
}

/// Awaits `step`, saying every 15 s that it still runs (pip is silent for minutes on a first
/// setup, and a silent terminal looks hung).
pub(super) async fn heartbeat<T>(
    say: &dyn Fn(&str),
    what: &str,
    step: impl std::future::Future<Output = T>,
) -> T {
    const EVERY: Duration = Duration::from_secs(15);
    tokio::pin!(step);
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval_at(started + EVERY, EVERY);
    loop {
        tokio::select! {
            out = &mut step => return out,
            _ = tick.tick() => say(&format!("{what}… {} s", started.elapsed().as_secs())),
        }
    }
}
