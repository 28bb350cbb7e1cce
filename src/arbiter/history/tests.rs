//! Unit tests of `history`.

use super::*;
use crate::gpu::GpuInfo;

fn snap(at: SystemTime, used: u64) -> Snapshot {
    Snapshot {
        taken_wall: Some(at),
        gpus: vec![GpuInfo {
            index: 0,
            uuid: String::new(),
            name: "fake".into(),
            utilization: 50,
            memory_used_mib: used,
            memory_total_mib: 32_000,
            memory_free_mib: 32_000 - used,
            temperature: 0,
            power_draw: 0.0,
        }],
        ..Snapshot::empty("test")
    }
}

#[test]
fn grants_record_their_peak_and_old_samples_fall_out() {
    let h = History::new(Duration::from_secs(60));
    let now = SystemTime::now();
    h.sample(&snap(now - Duration::from_secs(120), 100), |_| 0);
    h.granted(
        1,
        0,
        HolderKind::Lease,
        "lease 1 (alice)",
        Duration::from_millis(1500),
        false,
    );
    h.granted(
        2,
        0,
        HolderKind::Job,
        "speech job on the CPU",
        Duration::ZERO,
        true,
    );
    h.sample(&snap(now - Duration::from_secs(1), 9000), |_| 2);
    h.sample(&snap(now - Duration::from_secs(1), 9999), |_| 2); // the same sample again
    h.sample(&snap(now, 4000), |_| 1);
    h.released(0, 1);
    let v = h.view(None);
    assert_eq!(v.samples.len(), 2, "the two-minute-old sample is gone");
    assert_eq!(v.samples[0].waiting, 2);
    let g = &v.grants[0];
    assert_eq!(
        (g.kind, g.peak_mib, g.waited_s),
        (GrantKind::Lease, Some(9000), 1.5)
    );
    assert!(g.end.is_some());
    let cpu = &v.grants[1];
    assert_eq!(
        (cpu.on_cpu, cpu.peak_mib, cpu.end),
        (true, None, None),
        "a job on the CPU is not credited with the GPU's memory"
    );
    h.released(0, 2);
    let e = h.begin_event(0, GrantKind::Unload, "worker asr");
    assert!(e >= EVENT_IDS);
    assert!(h.view(None).grants[2].end.is_none());
    h.end_event(e);
    assert!(h.view(Some(unix_now() + 10.0)).grants.is_empty());
}

#[test]
fn a_busy_host_keeps_the_newest_records_and_open_ones() {
    let h = History::new(Duration::from_secs(3600));
    h.granted(0, 0, HolderKind::Lease, "long lease", Duration::ZERO, false);
    let jobs = MAX_GRANT_RECORDS as u64 * 2;
    for id in 1..=jobs {
        h.granted(id, 0, HolderKind::Job, "job", Duration::ZERO, false);
        h.released(0, id);
    }
    let v = h.view(None);
    assert!(v.grants.len() <= MAX_GRANT_RECORDS + MAX_GRANT_RECORDS / 8);
    assert_eq!(v.grants[0].holder, "long lease", "open grants stay");
    assert_eq!(v.grants.last().map(|g| g.id), Some(jobs), "the newest stay");
}

#[test]
fn long_holder_labels_are_cut_in_the_record() {
    let h = History::new(Duration::from_secs(60));
    // A lease's holder and purpose may be 8 KiB each; 10 000 such records were 160 MB.
    let long = "가".repeat(8192);
    h.granted(1, 0, HolderKind::Lease, &long, Duration::ZERO, false);
    let id = h.begin_event(0, GrantKind::Reload, "short");
    let view = h.view(None);
    let kept = &view.grants[0].holder;
    assert_eq!(kept.chars().count(), LABEL_MAX + 1);
    assert!(kept.ends_with('…'));
    assert!(view
        .grants
        .iter()
        .any(|g| g.id == id && g.holder == "short"));
}

#[test]
fn the_audit_log_names_a_grant_kind_as_the_api_does() {
    for kind in [
        GrantKind::Job,
        GrantKind::Service,
        GrantKind::Lease,
        GrantKind::Unload,
        GrantKind::Reload,
    ] {
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
    }
}
