//! The real `gpuhost serve` process: SIGTERM stops every worker; SIGKILL takes them along within 2 s.

use std::time::{Duration, Instant};

use super::support::*;

struct Served {
    binary: Binary,
    url: String,
    pid_dir: tempfile::TempDir,
}

/// Starts the binary with two resident fake workers; waits until both are ready.
async fn serve() -> Served {
    let pid_dir = tempfile::tempdir().unwrap();
    let env = format!(
        "env = {{ FAKE_PID_DIR = {:?} }}",
        pid_dir.path().display().to_string()
    );
    let toml = format!(
        "[pipeline]\nstages = [\"a\", \"b\"]\n{}{}",
        fake_worker("a", &env),
        fake_worker("b", &env),
    );
    let binary = Binary::start(&toml, &[]);
    binary.ready_workers(2).await;
    Served {
        url: binary.url.clone(),
        binary,
        pid_dir,
    }
}

/// A 0.2 s WAV posted to `url`: the response.
async fn post_wav(url: String) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap()
}

/// Waits until one worker of the served binary is busy with a job.
async fn wait_busy(url: &str) {
    let workers = format!("{url}/workers");
    wait_for("a worker to be busy", Duration::from_secs(60), || {
        let workers = workers.clone();
        async move {
            let Ok(r) = reqwest::get(&workers).await else {
                return false;
            };
            let w: serde_json::Value = r.json().await.unwrap_or_default();
            w["workers"]
                .as_array()
                .is_some_and(|ws| ws.iter().any(|w| w["state"] == "busy"))
        }
    })
    .await;
}

#[tokio::test]
async fn sigterm_stops_every_worker_and_ends_running_jobs() {
    let mut served = serve().await;
    let pids = read_pids(served.pid_dir.path());
    assert_eq!(pids.len(), 2, "{pids:?}");
    // A job in flight when SIGTERM arrives ends with an error event, not a hang.
    let url = format!("{}/transcribe?prompt=fake:sleep=30000", served.url);
    let job = tokio::spawn(async move { read_events(post_wav(url).await).await });
    wait_busy(&served.url).await;
    // A job still waiting for the GPU is never granted it once the shutdown began: it is told
    // so, as its last event.
    let mut queued = EventReader::new(post_wav(format!("{}/transcribe", served.url)).await);
    queued
        .until(|e| matches!(e, gpuhost::protocol::ClientEvent::Queued { .. }))
        .await;
    let queued = tokio::spawn(async move {
        let mut events = Vec::new();
        while let Some(event) = queued.next().await {
            events.push(event);
        }
        events
    });
    served.binary.signal(libc::SIGTERM);
    let started = Instant::now();
    let status =
        tokio::task::spawn_blocking(move || served.binary.child.wait().map(|s| (s, served)))
            .await
            .unwrap()
            .unwrap();
    let (status, served) = status;
    assert!(status.success(), "clean exit: {status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        started.elapsed()
    );
    for pid in read_pids(served.pid_dir.path()) {
        assert!(!pid_alive(pid), "worker {pid} survived SIGTERM of the host");
    }
    let events = job.await.unwrap();
    let (code, _) = error_of(&events);
    assert_eq!(code, "shutting_down");
    let events = queued.await.unwrap();
    assert!(!events.iter().any(super::support::started), "{events:?}");
    let (code, message) = error_of(&events);
    assert_eq!(code, "shutting_down");
    assert!(message.contains("never started"), "{message}");
}

#[tokio::test]
async fn sighup_stops_the_host_as_sigterm_does() {
    // The terminal `gpuhost serve` ran in closed: a job in flight hears why it ended.
    let mut served = serve().await;
    let url = format!("{}/transcribe?prompt=fake:sleep=30000", served.url);
    let job = tokio::spawn(async move { read_events(post_wav(url).await).await });
    wait_busy(&served.url).await;
    served.binary.signal(libc::SIGHUP);
    let (status, served) =
        tokio::task::spawn_blocking(move || served.binary.child.wait().map(|s| (s, served)))
            .await
            .unwrap()
            .unwrap();
    assert!(status.success(), "clean exit: {status:?}");
    for pid in read_pids(served.pid_dir.path()) {
        assert!(!pid_alive(pid), "worker {pid} survived SIGHUP of the host");
    }
    let (code, _) = error_of(&job.await.unwrap());
    assert_eq!(code, "shutting_down");
}

#[tokio::test]
async fn under_nohup_a_sighup_passes_the_host_by() {
    let binary = Binary::start_nohup(&format!(
        "[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "")
    ));
    binary.ready_workers(1).await;
    binary.signal(libc::SIGHUP);
    // Still serving: a job after the hangup runs.
    let events = read_events(post_wav(format!("{}/transcribe", binary.url)).await).await;
    let _ = result_of(&events);
    assert!(pid_alive(binary.child.id()));
}

#[tokio::test]
async fn sigkill_of_the_host_takes_workers_within_two_seconds() {
    let mut served = serve().await;
    let pids = read_pids(served.pid_dir.path());
    assert_eq!(pids.len(), 2);
    // One worker is busy when the host dies.
    let url = format!("{}/transcribe?prompt=fake:sleep=30000", served.url);
    let job = tokio::spawn(async move {
        let response = reqwest::Client::new()
            .post(url)
            .body(wav(0.2, 16000, 1))
            .send()
            .await;
        match response {
            Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => format!("the request failed: {e}"),
        }
    });
    tokio::select! {
        () = wait_busy(&served.url) => {}
        // A job that ends before any worker was seen busy says why (it never ends otherwise).
        answer = job => panic!("the job ended before a worker was busy: {answer:?}"),
    }
    served.binary.signal(libc::SIGKILL);
    served.binary.child.wait().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(2);
    while pids.iter().any(|&p| pid_alive(p)) {
        assert!(
            Instant::now() < deadline,
            "workers {pids:?} outlived the SIGKILLed host by 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `.child` pids a fake worker wrote (its own child, `FAKE_GRANDCHILD`).
fn child_pids(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name();
            name.to_str()?.strip_suffix(".child")?.parse().ok()
        })
        .collect()
}

/// The binary with one worker whose child runs in a session of its own (`setsid`, outside the
/// worker's process group); the child's pid is in `DIR/<pid>.child`. `extra`: more config.
fn with_a_session_child(extra: &str) -> Binary {
    Binary::start(
        &format!(
            "{extra}\n[pipeline]\nstages = [\"w\"]\n{}",
            fake_worker(
                "w",
                "env = { FAKE_GRANDCHILD = \"session\", FAKE_PID_DIR = \"{DIR}\" }"
            )
        ),
        &[],
    )
}

#[tokio::test]
async fn a_child_that_left_the_workers_group_goes_with_the_worker_and_with_the_host() {
    // The worker's child calls setsid: no group kill reaches it, and the orphan guard's groups
    // do not hold it. The host adopts it as subreaper when its worker dies and kills it.
    let mut binary = with_a_session_child("");
    binary.ready_workers(1).await;
    let client = reqwest::Client::new();
    let first = child_pids(binary.dir.path());
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(pid_alive(first[0]));
    // The worker is unloaded: its group goes, and the child it left outside goes with it.
    let unload = client
        .post(format!("{}/workers/w/unload", binary.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200, "{:?}", unload.text().await);
    until_dead(first[0], "the unloaded worker's session child to be killed").await;
    // Loaded again, with a new such child: SIGTERM to the host takes it too.
    let load = client
        .post(format!("{}/workers/w/load", binary.url))
        .send()
        .await
        .unwrap();
    assert_eq!(load.status(), 200);
    // It says what the load did, not the state before it (it said `unloaded`).
    let said: serde_json::Value = load.json().await.unwrap();
    assert!(
        ["starting", "ready"].contains(&said["state"].as_str().unwrap()),
        "{said}"
    );
    binary.ready_workers(1).await;
    let second: Vec<u32> = child_pids(binary.dir.path())
        .into_iter()
        .filter(|p| !first.contains(p))
        .collect();
    assert_eq!(second.len(), 1, "{second:?}");
    assert!(pid_alive(second[0]));
    binary.signal(libc::SIGTERM);
    let status = tokio::task::spawn_blocking(move || binary.child.wait().map(|s| (s, binary)))
        .await
        .unwrap()
        .unwrap()
        .0;
    assert!(status.success(), "{status:?}");
    assert!(!pid_alive(second[0]), "the session child outlived the host");
}

#[tokio::test]
async fn a_live_workers_helper_whose_parent_exited_is_left_alone() {
    // Worker `b` starts a helper through a shell that exits at once (`sh -c 'x &'`): the helper
    // is orphaned to the host but stays in b's process group while b runs. Worker `a` leaves a
    // child in a session of its own, killed once `a` is unloaded: a sweep that ran after the
    // helper was orphaned.
    let b = format!(
        "[workers.b]\ncommand = [\"sh\", \"-c\", \"sh -c 'sleep 6023 & echo $! > {{DIR}}/helper'; exec {} {} b\"]\nstop_grace_s = 1\n",
        python(),
        fixture("fake_worker.py").display()
    );
    let binary = Binary::start(
        &format!(
            "[pipeline]\nstages = [\"a\", \"b\"]\n{}{b}",
            fake_worker(
                "a",
                "env = { FAKE_GRANDCHILD = \"session\", FAKE_PID_DIR = \"{DIR}\" }"
            )
        ),
        &[],
    );
    binary.ready_workers(2).await;
    let helper: u32 = std::fs::read_to_string(binary.dir.path().join("helper"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let session = child_pids(binary.dir.path());
    assert_eq!(session.len(), 1, "{session:?}");
    let unload = reqwest::Client::new()
        .post(format!("{}/workers/a/unload", binary.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200);
    until_dead(
        session[0],
        "the unloaded worker's session child to be killed",
    )
    .await;
    assert!(pid_alive(helper), "the live worker's helper was killed");
    drop(binary);
    until_dead(helper, "the helper to go with its worker's group").await;
}

#[tokio::test]
async fn a_child_that_left_the_workers_group_goes_with_a_sigkilled_host() {
    // A GPU sampled every 0.1 s through nvidia-smi: a helper registered with the orphan guard
    // ten times a second, which must not keep it from looking.
    let gpu = super::gpu_status::FakeGpu::new(super::gpu_status::IDLE);
    let binary = with_a_session_child(&gpu.config(""));
    binary.ready_workers(1).await;
    let children = child_pids(binary.dir.path());
    assert_eq!(children.len(), 1, "{children:?}");
    // The orphan guard notes what is below the host once a second.
    std::thread::sleep(Duration::from_millis(1500));
    binary.signal(libc::SIGKILL);
    until_dead(
        children[0],
        "the session child to go with the SIGKILLed host",
    )
    .await;
}

#[tokio::test]
async fn a_child_that_left_the_workers_group_just_before_the_host_was_sigkilled_goes_too() {
    // The host is SIGKILLed as soon as the worker's session child exists: the orphan guard's
    // look below the host (once a second) has most likely not seen it yet. The guard's mark in
    // the child's environment (inherited from the worker) names it.
    let binary = with_a_session_child("");
    let dir = binary.dir.path().to_path_buf();
    wait_for(
        "the worker's session child",
        Duration::from_secs(60),
        || {
            let found = !child_pids(&dir).is_empty();
            async move { found }
        },
    )
    .await;
    let children = child_pids(&dir);
    binary.signal(libc::SIGKILL);
    assert_eq!(children.len(), 1, "{children:?}");
    until_dead(
        children[0],
        "the fresh session child to go with the SIGKILLed host",
    )
    .await;
}

#[tokio::test]
async fn what_a_child_ignoring_sigterm_keeps_detaching_goes_with_a_sigkilled_host() {
    // A child that ignores SIGTERM and detaches a daemon every 10 ms: those it started between
    // the orphan guard's last look and its SIGKILL outlived the host (helper 79: 1–2 a run).
    let binary = Binary::start(
        &format!(
            "[pipeline]\nstages = [\"w\"]\n{}",
            fake_worker(
                "w",
                "env = { FAKE_GRANDCHILD = \"spawner\", FAKE_PID_DIR = \"{DIR}\" }"
            )
        ),
        &[],
    );
    binary.ready_workers(1).await;
    let dir = binary.dir.path().to_path_buf();
    wait_for("daemons detached", Duration::from_secs(30), || {
        let many = child_pids(&dir).len() >= 20;
        async move { many }
    })
    .await;
    let spawner: u32 = std::fs::read_dir(&dir)
        .unwrap()
        .find_map(|e| {
            let name = e.ok()?.file_name();
            name.to_str()?.strip_suffix(".spawner")?.parse().ok()
        })
        .expect("the spawner's pid");
    binary.signal(libc::SIGKILL);
    until_dead(spawner, "the spawner to go with the SIGKILLed host").await;
    // Every process of this test's (its last child may not have written its pid file yet).
    let mark = format!("FAKE_PID_DIR={}", dir.display());
    wait_for(
        "every daemon it detached to go too",
        Duration::from_secs(10),
        || {
            let left = carrying(&mark);
            async move { left.is_empty() }
        },
    )
    .await;
}

/// The live processes whose environment holds `entry` (`NAME=value`).
fn carrying(entry: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()))
        })
        .filter(|&pid| pid_alive(pid))
        .collect()
}

#[tokio::test]
async fn a_state_folder_that_cannot_be_one_is_refused_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state");
    std::fs::write(&file, "not a folder").unwrap();
    for state_dir in [file.clone(), file.join("under")] {
        let mut config = gpuhost::config::Config::from_toml(
            &format!("state_dir = {:?}\n", state_dir.display().to_string()),
            dir.path().to_path_buf(),
        )
        .unwrap();
        config.listen = "127.0.0.1:0".parse().unwrap();
        let err = gpuhost::bind(config).await.err().expect("refused");
        let message = err.to_string();
        assert!(
            message.contains("state folder") && message.contains(&file.display().to_string()),
            "{message}"
        );
    }
    // Its voices' folder too (a file there read as "no voices enrolled").
    let state = dir.path().join("kept");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("speakers"), "not a folder").unwrap();
    let mut config = gpuhost::config::Config::from_toml(
        &format!("state_dir = {:?}\n", state.display().to_string()),
        dir.path().to_path_buf(),
    )
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let message = gpuhost::bind(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("kept/speakers"), "{message}");
    // One that does not exist yet is made, for its owner only (voiceprints are kept there).
    let fresh = dir.path().join("a/b/state");
    let mut config = gpuhost::config::Config::from_toml(
        &format!(
            "state_dir = {:?}\n[pipeline]\nstages = []\n",
            fresh.display().to_string()
        ),
        dir.path().to_path_buf(),
    )
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let server = gpuhost::bind(config).await.unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    server.run(async {}).await.unwrap();
}

#[tokio::test]
async fn the_guard_outlives_a_kill_aimed_at_the_hosts_command_line() {
    // `pkill -9 -f "gpuhost serve …"`: every process whose command line matches the host's is
    // SIGKILLed at once. The orphan guard, a fork of the host, had the same command line and
    // died with it; the worker's session child then outlived both.
    let binary = with_a_session_child("");
    binary.ready_workers(1).await;
    let children = child_pids(binary.dir.path());
    assert_eq!(children.len(), 1, "{children:?}");
    let procfs = gpuhost::gpu::procfs::ProcFs::new("/proc");
    let host = binary.child.id();
    let matching = procfs.cmdline(host).unwrap();
    assert!(matching.contains("serve"), "{matching}");
    let guard = guard_of(host);
    let same: Vec<u32> = procfs
        .pids()
        .into_iter()
        .filter(|&p| procfs.cmdline(p).as_deref() == Some(matching.as_str()))
        .collect();
    assert!(
        !same.contains(&guard),
        "the guard's command line is the host's: {same:?}"
    );
    for pid in same {
        // SAFETY: kill(2) of the host this test started (the only process with its command line).
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    until_dead(children[0], "the session child to go with the host").await;
}

#[tokio::test]
async fn a_killed_orphan_guard_is_reaped_and_replaced_by_one_that_does_its_work() {
    // A killed guard was only said on /health ("restart gpuhost"): until then a SIGKILLed host
    // left its workers' children behind.
    let binary = with_a_session_child("");
    binary.ready_workers(1).await;
    let children = child_pids(binary.dir.path());
    assert_eq!(children.len(), 1, "{children:?}");
    let health = |url: String| async move {
        reqwest::get(format!("{url}/health"))
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    assert_eq!(health(binary.url.clone()).await["orphan_guard"], "ok");
    let procfs = gpuhost::gpu::procfs::ProcFs::new("/proc");
    let host = binary.child.id();
    let guard = guard_of(host);
    // SAFETY: kill(2) of the guard of the host this test started.
    unsafe { libc::kill(guard as i32, libc::SIGKILL) };
    let another = || {
        procfs.pids().into_iter().find(|&p| {
            p != guard
                && procfs.ppid(p) == Some(host)
                && procfs.comm(p).as_deref() == Some("gpuhost-guard")
        })
    };
    wait_for("a new guard", Duration::from_secs(10), || {
        let found = another().is_some();
        async move { found }
    })
    .await;
    let second = another().unwrap();
    // Reaped: no zombie of it is left under the host.
    assert!(
        procfs.ppid(guard) != Some(host),
        "the dead guard was not reaped"
    );
    assert_eq!(health(binary.url.clone()).await["orphan_guard"], "ok");
    let cmdline = procfs.cmdline(second).unwrap();
    assert!(
        cmdline.starts_with("gpuhost-guard") && !cmdline.contains("orphan-guard"),
        "its command line (with the mark's token) is overwritten: {cmdline}"
    );
    // It looks below the host once a second, as the first did.
    std::thread::sleep(Duration::from_millis(1500));
    binary.signal(libc::SIGKILL);
    until_dead(
        children[0],
        "the session child to go with the SIGKILLed host",
    )
    .await;
    until_dead(second, "the new guard to exit after its work").await;
}

/// The orphan guard of the host `host` (its child named `gpuhost-guard`).
fn guard_of(host: u32) -> u32 {
    let procfs = gpuhost::gpu::procfs::ProcFs::new("/proc");
    procfs
        .pids()
        .into_iter()
        .find(|&p| {
            procfs.ppid(p) == Some(host) && procfs.comm(p).as_deref() == Some("gpuhost-guard")
        })
        .expect("the orphan guard runs")
}
