//! `ProcFs` against fake `/proc` trees: ancestry, command lines, environments, watch patterns.

use super::*;

fn fake(root: &std::path::Path, pid: u32, ppid: u32, cmdline: &[&str]) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cmdline"),
        cmdline.iter().map(|a| format!("{a}\0")).collect::<String>(),
    )
    .unwrap();
    std::fs::write(dir.join("status"), format!("Name:\tx\nPPid:\t{ppid}\n")).unwrap();
}

#[test]
fn descendants_are_found_at_any_depth_and_only_below() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), 1, 0, &["init"]);
    fake(dir.path(), 10, 1, &["sh", "-c", "train"]);
    fake(dir.path(), 11, 10, &["python", "train.py"]);
    fake(dir.path(), 12, 11, &["loader"]);
    fake(dir.path(), 20, 1, &["other"]);
    let mut below = ProcFs::new(dir.path()).descendants(10);
    below.sort_unstable();
    assert_eq!(below, [10, 11, 12]);
}

#[test]
fn an_environment_variable_is_read_whole_and_by_its_exact_name() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), 7, 1, &["worker"]);
    std::fs::write(
        dir.path().join("7/environ"),
        b"GPUHOST_GUARDX=1\0PATH=/bin\0GPUHOST_GUARD=12-34 56-78\0EMPTY=\0",
    )
    .unwrap();
    let procfs = ProcFs::new(dir.path());
    assert_eq!(
        procfs.environ_value(7, "GPUHOST_GUARD").as_deref(),
        Some(&b"12-34 56-78"[..])
    );
    assert_eq!(procfs.environ_value(7, "EMPTY").as_deref(), Some(&b""[..]));
    assert_eq!(procfs.environ_value(7, "GPUHOST"), None);
    assert_eq!(procfs.environ_value(8, "PATH"), None);
}

#[test]
fn empty_cmdline_walks_up_to_a_real_one() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), 1, 0, &["/sbin/init"]);
    fake(
        dir.path(),
        500,
        1,
        &[
            "python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "gemma",
        ],
    );
    fake(dir.path(), 501, 500, &[]);
    fake(dir.path(), 502, 501, &[]);
    let p = ProcFs::new(dir.path());
    let c = p.command(502);
    assert_eq!(
        c.command,
        "python -m vllm.entrypoints.openai.api_server --model gemma"
    );
    assert_eq!(c.from_pid, Some(500));
    assert_eq!(p.command(500).from_pid, None);
    assert!(p.command(9999).note.unwrap().contains("not visible"));
    assert_eq!(p.lineage(502), [502, 501, 500, 1]);
    assert_eq!(
        p.find(&["vllm", "init", "nothing"], 0),
        [vec![500], vec![1], vec![]]
    );
    // An ancestor that exited: said so, not "empty command lines".
    fake(dir.path(), 601, 600, &[]);
    let c = p.command(601);
    assert_eq!((c.command.as_str(), c.from_pid), ("", None));
    assert!(
        c.note.as_deref().unwrap().contains("ancestor 600 is gone"),
        "{c:?}"
    );
    // An orphan (its parent init) is not explained by init's command line.
    fake(dir.path(), 701, 1, &[]);
    let c = p.command(701);
    assert_eq!((c.command.as_str(), c.from_pid), ("", None));
    assert!(c.note.unwrap().contains("below init"));
    // Nor is a zombie by its parent's.
    fake(dir.path(), 502, 501, &[]);
    std::fs::write(
        dir.path().join("502/status"),
        "Name:\tx\nState:\tZ (zombie)\nPPid:\t501\n",
    )
    .unwrap();
    let c = p.command(502);
    assert_eq!((c.command.as_str(), c.from_pid), ("", None));
    assert!(c.note.unwrap().contains("zombie"));
}

#[test]
fn zombies_and_process_groups_are_read_from_this_machine() {
    let me = std::process::id();
    let p = ProcFs::new("/proc");
    // SAFETY: getpgrp has no preconditions.
    let group = unsafe { libc::getpgrp() } as u32;
    assert_eq!(p.pgid(me), Some(group));
    assert!(!p.zombie(me));
    // SAFETY: the child only calls _exit, which is async-signal-safe.
    let pid = match unsafe { libc::fork() } {
        0 => unsafe { libc::_exit(0) },
        pid => pid as u32,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !p.zombie(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} never became a zombie"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The children lists, where the kernel has them, hold it too (a zombie until reaped).
    if let Some(children) = p.children(me) {
        assert!(children.contains(&pid), "{children:?}");
        assert!(p.descendants_of(&[me]).contains(&pid));
    }
    // SAFETY: reaps our own child.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
    assert!(!p.zombie(pid));
    assert_eq!(p.pgid(pid), None);
}

#[test]
fn gpuhost_and_its_own_children_are_no_watched_program() {
    let dir = tempfile::tempdir().unwrap();
    fake(dir.path(), 1, 0, &["init"]);
    fake(
        dir.path(),
        100,
        1,
        &["/usr/bin/gpuhost", "--config", "ollama.toml", "serve"],
    );
    // The orphan guard: a fork, with the server's command line.
    fake(
        dir.path(),
        101,
        100,
        &["/usr/bin/gpuhost", "--config", "ollama.toml", "serve"],
    );
    // A service it started, and ollama itself.
    fake(dir.path(), 102, 100, &["ollama", "serve"]);
    fake(dir.path(), 200, 1, &["/usr/local/bin/ollama", "serve"]);
    let found = ProcFs::new(dir.path()).find(&["ollama"], 100);
    assert_eq!(found, [vec![102, 200]]);
}
