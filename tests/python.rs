//! Runs every Python test suite from `cargo test`: the worker SDK, each worker package (in the venv
//! `gpuhost setup` builds for it), and the end-to-end speech tests through HTTP (tests/speech).
#![allow(clippy::unwrap_used, unreachable_pub)] // test and bench code: a panic is the failure report
#![allow(clippy::disallowed_methods, clippy::disallowed_macros)] // the test runs Python and the gpuhost binary directly

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a step that later steps need: stops the test when it fails.
fn run(what: &str, cmd: &mut Command) {
    if let Err(failure) = try_run(what, cmd) {
        panic!("{failure}");
    }
}

/// Runs one suite; a failure is returned, so the other suites still run.
fn try_run(what: &str, cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The summary line of each pytest run shows up in `cargo test`'s output.
    if let Some(summary) = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed") || l.contains(" failed"))
    {
        eprintln!("{what}: {summary}");
    }
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            out.status
        ))
    }
}

/// A venv with `packages` at `dir/.venv`, made once.
fn venv(dir: &Path, packages: &[&str]) -> PathBuf {
    let python = dir.join(".venv/bin/python");
    let marker = dir.join(".venv/.gpuhost-test-ready");
    let wanted = packages.join(" ");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        run(
            "python3 -m venv",
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(dir.join(".venv")),
        );
        run(
            "pip install",
            Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .args(packages)
                .current_dir(dir),
        );
        std::fs::write(&marker, wanted).unwrap();
    }
    python
}

#[test]
fn python_suites() {
    // 1. The worker SDK in its own venv.
    let sdk = repo().join("protocol/sdk");
    let python = venv(&sdk, &["-e", ".[test]"]);
    // Every suite runs even when one before it failed; the test fails at the end with all of them.
    let mut failures = Vec::new();
    failures.extend(
        try_run(
            "SDK pytest",
            Command::new(&python)
                .args(["-m", "pytest", "-q", "tests"])
                .current_dir(&sdk),
        )
        .err(),
    );

    // 2. Every worker package, in the venv `gpuhost setup` builds (idempotent).
    let gpuhost = env!("CARGO_BIN_EXE_gpuhost");
    run(
        "gpuhost setup",
        Command::new(gpuhost).arg("setup").current_dir(repo()),
    );
    let mut workers: Vec<PathBuf> = std::fs::read_dir(repo().join("workers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pyproject.toml").exists())
        .collect();
    workers.sort();
    assert_eq!(workers.len(), 3, "{workers:?}");
    for dir in &workers {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        failures.extend(
            try_run(
                &format!("{name} pytest"),
                Command::new(dir.join(".venv/bin/python"))
                    .args(["-m", "pytest", "-q", "tests"])
                    .current_dir(dir),
            )
            .err(),
        );
    }

    // 3. End to end through HTTP on synthesized speech with ground truth, incl. the openai client
    //    and Home Assistant's `wyoming` client.
    let speech = repo().join("tests/speech");
    let python = venv(&speech, &["pytest>=7", "openai>=1.40", "wyoming==1.10.2"]);
    failures.extend(
        try_run(
            "speech end-to-end pytest",
            Command::new(&python)
                .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "."])
                .env("GPUHOST_BIN", gpuhost)
                .current_dir(&speech),
        )
        .err(),
    );
    assert!(
        failures.is_empty(),
        "{} Python suite(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
