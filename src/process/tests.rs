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
