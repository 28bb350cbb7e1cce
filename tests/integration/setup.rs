//! `gpuhost setup` and the serve-time venv check, with a tiny SDK worker package.

use std::process::Command;
use std::time::Duration;

use super::support::*;

fn package(root: &std::path::Path) {
    let pkg = root.join("workers/tiny");
    std::fs::create_dir_all(pkg.join("src/gpuhost_tiny")).unwrap();
    std::fs::write(
        pkg.join("pyproject.toml"),
        "[build-system]\nrequires = [\"setuptools>=61\"]\nbuild-backend = \"setuptools.build_meta\"\n\
         [project]\nname = \"gpuhost-tiny\"\nversion = \"0.1.0\"\ndependencies = []\n\
         [project.optional-dependencies]\ntest = []\n[tool.setuptools.packages.find]\nwhere = [\"src\"]\n",
    )
    .unwrap();
    std::fs::write(
        pkg.join("src/gpuhost_tiny/__init__.py"),
        "import os, sys\nREQUIRES = [\"json\"]\n\
         def prepare():\n    if os.environ.get('TINY_PREPARE_FAIL'):\n        raise SystemExit('tiny.onnx does not match its pinned sha256')\n    open(os.path.join(sys.prefix, 'prepared'), 'a').write('x')\n",
    )
    .unwrap();
    std::fs::write(
        pkg.join("src/gpuhost_tiny/__main__.py"),
        "import sys\nfrom gpuhost_worker import Worker, serve\n\
         class Tiny(Worker):\n    model = 'tiny'\n    def run(self, job, progress):\n        progress(1.0, 'done')\n        return {'seconds': job['duration']}\n\
         sys.exit(serve(Tiny()))\n",
    )
    .unwrap();
    let config = format!(
        "listen = \"127.0.0.1:0\"\nworkers_dir = \"workers\"\n[setup]\nsdk_dir = {:?}\n[pipeline]\nstages = [\"tiny\"]\n[workers.tiny]\n",
        repo().join("protocol/sdk").display().to_string()
    );
    std::fs::write(root.join("gpuhost.toml"), config).unwrap();
}

fn gpuhost(root: &std::path::Path, args: &[&str]) -> std::process::Output {
    gpuhost_with(root, args, &[])
}

fn gpuhost_with(
    root: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuhost"))
        .args(args)
        .arg("--config")
        .arg(root.join("gpuhost.toml"))
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[tokio::test]
async fn setup_is_idempotent_serves_and_refuses_stale_venvs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    package(&root);
    let first = tokio::task::spawn_blocking({
        let root = root.clone();
        move || gpuhost(&root, &["setup"])
    })
    .await
    .unwrap();
    let log = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{log}");
    assert!(
        log.contains("[tiny] creating") && log.contains("[tiny] ready in"),
        "{log}"
    );
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("workers/tiny/.venv/gpuhost-setup.json")).unwrap(),
    )
    .unwrap();
    assert!(log.contains("[tiny] preparing models"), "{log}");
    let prepared = root.join("workers/tiny/.venv/prepared");
    assert_eq!(
        std::fs::read_to_string(&prepared).unwrap(),
        "x",
        "prepare() ran once"
    );
    assert_eq!(state["inputs"].as_str().unwrap().len(), 16);
    assert_eq!(state["resolved"].as_str().unwrap().len(), 16);

    let again = gpuhost(&root, &["setup"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("[tiny] up to date"));

    // While another setup holds the package (here this test, by its lock file), a forced
    // setup waits for it instead of moving its venv aside and building into the same folder.
    let held = std::fs::File::create(root.join("workers/tiny/.setup.lock")).unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let log_path = root.join("waiting.log");
    let mut waiting = Command::new(env!("CARGO_BIN_EXE_gpuhost"))
        .args(["setup", "--force", "--config"])
        .arg(root.join("gpuhost.toml"))
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    wait_for("the second setup to wait", Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        async move { log.contains("[tiny] another gpuhost setup is building this venv") }
    })
    .await;
    assert!(waiting.try_wait().unwrap().is_none(), "it did not wait");
    assert!(
        !root.join("workers/tiny/.venv.previous").exists(),
        "it touched the venv while waiting"
    );
    drop(held);
    let status = tokio::task::spawn_blocking(move || waiting.wait().unwrap())
        .await
        .unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success() && log.contains("[tiny] ready in"), "{log}");

    // A forced rebuild that fails (here its prepare step; offline, pip) puts the old venv back:
    // it was removed first, and the worker had none until the network came back.
    let failed = gpuhost_with(&root, &["setup", "--force"], &[("TINY_PREPARE_FAIL", "1")]);
    let log = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{log}");
    assert!(log.contains("the previous venv is back"), "{log}");
    assert_eq!(std::fs::read_to_string(&prepared).unwrap(), "x");
    assert!(!root.join("workers/tiny/.venv.previous").exists());
    let again = gpuhost(&root, &["setup"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("[tiny] up to date"));
    // A setup killed mid-build left the old venv aside and a half-built one in its place: the
    // next setup puts the old one back; a leftover beside a complete venv is removed.
    let (venv, aside) = (
        root.join("workers/tiny/.venv"),
        root.join("workers/tiny/.venv.previous"),
    );
    std::fs::rename(&venv, &aside).unwrap();
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let again = gpuhost(&root, &["setup"]);
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        log.contains("putting the previous venv back") && log.contains("[tiny] up to date"),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&prepared).unwrap(), "x");
    std::fs::create_dir_all(aside.join("bin")).unwrap();
    let again = gpuhost(&root, &["setup"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("[tiny] up to date"));
    assert!(!aside.exists());

    // The SDK worker in its venv serves a real job through the host.
    let config = gpuhost::Config::load(&root.join("gpuhost.toml"), true).unwrap();
    gpuhost::setup::ensure(&config, &|_| {}).await.unwrap();
    let server = gpuhost::bind(config).await.unwrap();
    let url = format!("http://{}", server.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let response = reqwest::Client::new()
        .post(format!("{url}/transcribe"))
        .body(wav(0.5, 16000, 1))
        .send()
        .await
        .unwrap();
    let events = read_events(response).await;
    assert_eq!(result_of(&events)["stages"]["tiny"]["seconds"], 0.5);
    let _ = stop.send(());
    task.await.unwrap().unwrap();

    // A changed pyproject.toml makes the venv stale: serve refuses and says how to fix it.
    let pyproject = root.join("workers/tiny/pyproject.toml");
    let text = std::fs::read_to_string(&pyproject)
        .unwrap()
        .replace("dependencies = []", "dependencies = [] # changed");
    std::fs::write(&pyproject, text).unwrap();
    let refused = gpuhost(&root, &["serve"]);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        log.contains("stale") && log.contains("run `gpuhost setup tiny`"),
        "{log}"
    );

    // A package whose `prepare()` fails (say, a model file that does not match its sha256)
    // fails the setup, naming the step and the package's own message.
    let failed = gpuhost_with(&root, &["setup"], &[("TINY_PREPARE_FAIL", "1")]);
    let log = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{log}");
    assert!(
        log.contains("prepare models") && log.contains("does not match its pinned sha256"),
        "{log}"
    );

    // A venv whose interpreter link dangles (the Python it was made from was uninstalled):
    // `gpuhost setup` builds it again from nothing (venv creation over it failed every time).
    let fixed = gpuhost(&root, &["setup"]);
    assert!(
        fixed.status.success(),
        "{}",
        String::from_utf8_lossy(&fixed.stderr)
    );
    let bin = root.join("workers/tiny/.venv/bin");
    for name in ["python", "python3"] {
        let _ = std::fs::remove_file(bin.join(name));
        std::os::unix::fs::symlink("/nonexistent/python3", bin.join(name)).unwrap();
    }
    let refused = gpuhost(&root, &["serve"]);
    let log = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && log.contains("broken"), "{log}");
    let rebuilt = gpuhost(&root, &["setup"]);
    let log = String::from_utf8_lossy(&rebuilt.stderr);
    assert!(rebuilt.status.success(), "{log}");
    assert!(
        log.contains("moving") && log.contains("aside") && log.contains("[tiny] ready in"),
        "{log}"
    );
    let again = gpuhost(&root, &["setup"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("[tiny] up to date"));

    // A packaged worker whose package is not where `workers_dir` points (gpuhost run from
    // elsewhere) is an error that says where it looked, not a worker that crash-loops.
    std::fs::write(
        root.join("elsewhere.toml"),
        "listen = \"127.0.0.1:0\"\nworkers_dir = \"nowhere\"\n[pipeline]\nstages = [\"tiny\"]\n[workers.tiny]\n",
    )
    .unwrap();
    for command in ["setup", "serve"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuhost"))
            .args([command, "--config"])
            .arg(root.join("elsewhere.toml"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {log}");
        assert!(
            log.contains("nowhere/tiny") && log.contains("no pyproject.toml"),
            "{command}: {log}"
        );
    }

    // A config kept outside the checkout (`workers_dir` absolute, no `sdk_dir`) takes the SDK
    // beside the workers folder. Where there is none, setup and serve say so and leave the
    // venv alone (they called it stale, and setup removed it as broken).
    let etc = root.join("etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::write(
        etc.join("gpuhost.toml"),
        format!(
            "listen = \"127.0.0.1:0\"\nworkers_dir = {:?}\n[pipeline]\nstages = [\"tiny\"]\n[workers.tiny]\n",
            root.join("workers").display().to_string()
        ),
    )
    .unwrap();
    let outside = |command: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpuhost"))
            .args([command, "--config"])
            .arg(etc.join("gpuhost.toml"))
            .output()
            .unwrap()
    };
    for command in ["setup", "serve"] {
        let out = outside(command);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {log}");
        let want = format!(
            "the worker SDK is not at {}",
            root.join("protocol/sdk").display()
        );
        assert!(log.contains(&want), "{command}: {log}");
    }
    assert!(root.join("workers/tiny/.venv/bin/python").exists());
    std::fs::create_dir(root.join("protocol")).unwrap();
    std::os::unix::fs::symlink(repo().join("protocol/sdk"), root.join("protocol/sdk")).unwrap();
    let out = outside("setup");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("[tiny] up to date"),
        "{log}"
    );
}
