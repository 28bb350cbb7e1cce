//! Unit tests of `protocol`.

use super::*;

#[test]
fn bare_signals_of_the_original_protocol() {
    assert_eq!(Signal::parse("ready"), Signal::Ready(ReadyInfo::default()));
    assert_eq!(Signal::parse("done\r"), Signal::Done);
    assert!(matches!(Signal::parse("100%|####|"), Signal::Other { .. }));
    assert!(matches!(
        Signal::parse("done and dusted"),
        Signal::Other { .. }
    ));
}

#[test]
fn ready_metadata_and_error() {
    let Signal::Ready(info) =
        Signal::parse(r#"ready {"protocol":1,"model":"tiny.en","device":"cpu","x":2}"#)
    else {
        panic!()
    };
    assert_eq!(info.protocol, Some(1));
    assert_eq!(info.model.as_deref(), Some("tiny.en"));
    assert_eq!(info.extra["x"], 2);
    let Signal::Error(e) = Signal::parse(r#"error {"message":"bad audio","kind":"ValueError"}"#)
    else {
        panic!()
    };
    assert_eq!(e.message, "bad audio");
    let Signal::Error(e) = Signal::parse("error out of memory") else {
        panic!()
    };
    assert_eq!(e.message, "out of memory");
    // A refusal without words is still a refusal; a failure without words says so.
    for bare in [
        r#"error {"kind":"refused"}"#,
        r#"error {"message":"","kind":"refused"}"#,
    ] {
        let Signal::Error(e) = Signal::parse(bare) else {
            panic!("{bare}")
        };
        assert_eq!(e.kind.as_deref(), Some("refused"), "{bare}");
        assert_eq!(e.message, "the worker gave no reason", "{bare}");
    }
    // Another shape keeps what it said.
    let other = r#"error {"error":"CUDA out of memory"}"#;
    let Signal::Error(e) = Signal::parse(other) else {
        panic!()
    };
    assert!(e.message.contains("CUDA out of memory"), "{e:?}");
    let Signal::Error(e) = Signal::parse(&format!("error {}", "x".repeat(60_000))) else {
        panic!()
    };
    assert!(e.message.len() < 4100 && e.message.ends_with("characters left out)"));
}

#[test]
fn ready_languages_any_and_unreadable_metadata() {
    for any in [r#"ready {"languages":"*"}"#, r#"ready {"languages":["*"]}"#] {
        let Signal::Ready(info) = Signal::parse(any) else {
            panic!("{any}")
        };
        assert_eq!(info.languages, Some(vec!["*".to_string()]), "{any}");
    }
    // The worker's own `ready` with a key of the wrong type fails its load at once (it was
    // ignored, and the worker killed at load_timeout_s as never ready).
    for bad in [
        r#"ready {"languages":"en"}"#,
        r#"ready {"protocol":"1"}"#,
        r#"ready {"cancel":"yes"}"#,
        r#"ready {"voiceprints":5}"#,
        r#"ready {"warmup_s":"slow"}"#,
    ] {
        let Signal::BadReady { error, .. } = Signal::parse(bad) else {
            panic!("{bad}")
        };
        assert!(!error.is_empty(), "{bad}");
    }
    // A library's line that starts with the word stays a line to ignore.
    assert!(matches!(
        Signal::parse("ready to rock and roll"),
        Signal::Other { .. }
    ));
    assert!(matches!(
        Signal::parse("ready [1, 2]"),
        Signal::Other { .. }
    ));
}

#[test]
fn stderr_events() {
    let e = WorkerEvent::parse(r#"@gpuhost {"event":"progress","fraction":1.7,"message":"x"}"#);
    assert_eq!(
        e,
        WorkerEvent::Progress {
            fraction: Some(1.0),
            message: Some("x".into()),
            partial: None
        }
    );
    let e = WorkerEvent::parse("@gpuhost {broken");
    assert!(matches!(e, WorkerEvent::Log { level: None, .. }));
}

#[test]
fn client_event_lines() {
    let line = ClientEvent::Queued {
        position: 3,
        waiting_for: None,
    }
    .to_line();
    assert_eq!(line, "{\"type\":\"queued\",\"position\":3}\n");
    let line = GrantEvent::Granted {
        lease_id: 7,
        ttl_s: 60.0,
    }
    .to_line();
    assert_eq!(
        line,
        "{\"type\":\"granted\",\"lease_id\":7,\"ttl_s\":60.0}\n"
    );
}

#[test]
fn a_worker_runs_on_the_cpu_only_when_it_says_so() {
    let said = |device: Option<&str>| ReadyInfo {
        device: device.map(str::to_string),
        ..ReadyInfo::default()
    };
    for device in ["cpu", "CPU", "cpu/int8", "cpu:0", " cpu /float32"] {
        assert!(said(Some(device)).runs_on_cpu(), "{device}");
    }
    // Unsaid or anything else may hold GPU memory.
    for device in [
        None,
        Some("cuda"),
        Some("cuda/float16"),
        Some("cuda:1"),
        Some("cpus"),
        Some(""),
    ] {
        assert!(!said(device).runs_on_cpu(), "{device:?}");
    }
}
