//! Unit tests of `process`.

use super::*;

#[tokio::test]
async fn group_is_killed_on_drop() {
    let argv = vec!["sh".into(), "-c".into(), "sleep 30 & echo $! ; wait".into()];
    let (group, pipes) = spawn_worker(&argv, Path::new("."), &BTreeMap::new()).unwrap();
    let mut out = tokio::io::BufReader::new(pipes.stdout);
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    let grandchild: i32 = line.trim().parse().unwrap();
    drop(group);
    for _ in 0..100 {
        // SAFETY: signal 0 only probes for existence.
        if unsafe { libc::kill(grandchild, 0) } != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("grandchild {grandchild} survived its group");
}

#[tokio::test]
async fn terminate_escalates_to_kill() {
    // The shell says when its trap is set; a TERM sent before that would end it with 15.
    let argv = vec![
        "sh".into(),
        "-c".into(),
        "trap '' TERM; echo trapped; sleep 30".into(),
    ];
    let (mut group, pipes) = spawn_worker(&argv, Path::new("."), &BTreeMap::new()).unwrap();
    let mut out = tokio::io::BufReader::new(pipes.stdout);
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    assert_eq!(line.trim(), "trapped");
    let status = group.terminate(Duration::from_millis(200)).await.unwrap();
    assert_eq!(describe_exit(&status), "killed by signal 9");
}

#[tokio::test]
async fn helper_timeout_kills() {
    let err = run_captured(
        Path::new("sleep"),
        &["5".into()],
        Duration::from_millis(100),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::Timeout { .. }));
}

#[tokio::test]
async fn a_helper_that_writes_without_end_is_cut_off() {
    // `yes` writes forever: the host keeps 16 MiB at most and kills it, long before the timeout.
    let started = std::time::Instant::now();
    let err = run_captured(Path::new("yes"), &[], Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RunError::Io { source, .. } if source.to_string().contains("more than 16 MiB")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    // Output within the bound is kept whole.
    let out = run_captured(
        Path::new("head"),
        &["-c".into(), "1000000".into(), "/dev/zero".into()],
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.len(), 1_000_000);
}

#[tokio::test]
async fn a_missing_working_folder_is_named_not_taken_for_a_missing_program() {
    let gone = std::path::Path::new("/nonexistent/gpuhost-cwd");
    let argv = ["sh".to_string(), "-c".into(), "true".into()];
    let Err(e) = spawn_service(&argv, gone, &BTreeMap::new()) else {
        panic!("no such folder");
    };
    assert!(
        e.to_string()
            .contains("working folder (`cwd`) /nonexistent/gpuhost-cwd does not exist"),
        "{e}"
    );
    // A missing program in a folder that exists keeps the OS's words.
    let argv = ["/nonexistent/program".to_string()];
    let Err(e) = spawn_service(&argv, std::path::Path::new("/"), &BTreeMap::new()) else {
        panic!("no such program");
    };
    assert!(!e.to_string().contains("cwd"), "{e}");
}

#[test]
fn a_program_is_found_where_exec_would_find_it() {
    use std::ffi::OsStr;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let tool = bin.join("tool");
    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cwd = dir.path();
    // On the PATH given (a relative entry is the cwd's), not elsewhere.
    let found = find_program_in("tool", cwd, Some(OsStr::new("/nonexistent:bin")));
    assert_eq!(found, Some(cwd.join("bin/tool")));
    assert_eq!(
        find_program_in("tool", cwd, Some(OsStr::new("/usr/bin"))),
        None
    );
    // A name with a slash is taken relative to the cwd; a folder is no program.
    assert!(find_program_in("bin/tool", cwd, None).is_some());
    assert_eq!(find_program_in("bin", cwd, Some(OsStr::new(""))), None);
    // An empty entry is the cwd; no PATH at all is /bin:/usr/bin, as for exec.
    assert!(find_program_in("tool", &bin, Some(OsStr::new(":/usr/bin"))).is_some());
    assert!(find_program_in("sh", cwd, None).is_some());
    // A PATH that is not UTF-8 is still searched.
    use std::os::unix::ffi::OsStrExt;
    let bytes = [b"/nonexist\xff:".as_slice(), bin.as_os_str().as_bytes()].concat();
    assert!(find_program_in("tool", cwd, Some(OsStr::from_bytes(&bytes))).is_some());
}
