//! The voice store: persistence, limits, names.

use super::*;

fn sample(x: f32) -> Sample {
    let mut vector = vec![0.0; DIM];
    vector[0] = x;
    vector[1] = 1.0;
    Sample {
        vector,
        seconds: 3.0,
        added: 1,
    }
}

#[test]
fn voices_survive_a_restart_and_deletion_removes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = Speakers::load(dir.path().join("speakers"), Leftovers::All);
    store
        .add("민수", "m", sample(1.0), &store.enrolment(), (10, 2))
        .unwrap();
    store
        .add("민수", "m", sample(0.0), &store.enrolment(), (10, 2))
        .unwrap();
    let summary = store
        .add("민수", "m", sample(-1.0), &store.enrolment(), (10, 2))
        .unwrap();
    assert_eq!(summary["samples"], 2, "the oldest sample is dropped");
    let again = Speakers::load(dir.path().join("speakers"), Leftovers::All);
    assert_eq!(again.list()[0]["name"], "민수");
    let print = &again.prints(Some("m"))[0]["vector"];
    // The mean of (0, 1) and (-1, 1), made a unit vector.
    assert!((print[1].as_f64().unwrap() - 2.0 / 5f64.sqrt()).abs() < 1e-4);
    assert!(again.prints(Some("other")).is_empty());
    let mode = std::fs::metadata(again.file("민수")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    again.delete("민수").unwrap();
    assert_eq!(std::fs::read_dir(again.dir()).unwrap().count(), 0);
    assert_eq!(
        again.delete("민수"),
        Err(SpeakerError::NotFound("민수".into()))
    );
}

#[test]
fn a_voice_file_that_cannot_be_read_is_still_deleted_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    store
        .add("Eve", "m", sample(1.0), &store.enrolment(), (10, 2))
        .unwrap();
    store
        .add("Hal", "m", sample(1.0), &store.enrolment(), (10, 2))
        .unwrap();
    // Eve's file cut in half; Hal's rewritten with a name as the API no longer keeps it.
    let eve = store.file("Eve");
    let bytes = std::fs::read(&eve).unwrap();
    std::fs::write(&eve, &bytes[..bytes.len() / 2]).unwrap();
    let hal = std::fs::read_to_string(store.file("Hal")).unwrap();
    std::fs::write(store.file(" Hal"), hal.replace("\"Hal\"", "\" Hal\"")).unwrap();
    std::fs::remove_file(store.file("Hal")).unwrap();
    let again = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    // Hal's is kept under its name as written now (see below); Eve's is not listed.
    let listed = again.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "Hal");
    assert!(!store.file(" Hal").exists());
    // Not listed, yet DELETE removes the voiceprint left on disk; then it is gone.
    again.delete("Eve").unwrap();
    assert!(!eve.exists());
    assert_eq!(
        again.delete("Eve"),
        Err(SpeakerError::NotFound("Eve".into()))
    );
    // A name no voice can have (its file name would be too long to ask about) is not found.
    let long = "a".repeat(130);
    assert_eq!(
        again.delete(&long),
        Err(SpeakerError::NotFound(long.clone()))
    );
}

#[test]
fn limits_and_models_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    store
        .add("a", "m", sample(1.0), &store.enrolment(), (1, 5))
        .unwrap();
    assert_eq!(
        store.add("b", "m", sample(1.0), &store.enrolment(), (1, 5)),
        Err(SpeakerError::Full { max: 1 })
    );
    assert!(matches!(
        store.add("a", "n", sample(1.0), &store.enrolment(), (1, 5)),
        Err(SpeakerError::OtherModel { .. })
    ));
}

#[test]
fn names_are_checked() {
    assert_eq!(check_name("  Alice ").unwrap(), "Alice");
    // Names that look alike are one name: no-break, double and ideographic spaces.
    for alike in [
        "Bob\u{A0}Smith",
        "Bob  Smith",
        "Bob\u{3000}Smith",
        "\u{2007}Bob \u{2009}Smith\n",
    ] {
        assert_eq!(check_name(alike).unwrap(), "Bob Smith", "{alike:?}");
    }
    assert!(check_name("").is_err());
    assert!(check_name("SPEAKER_00").is_err());
    assert!(check_name("a\nb").is_err());
    assert!(check_name(&"가".repeat(40)).is_err()); // 120 bytes
    let bad = sample_of("diarizer", &json!({"vector": [1.0]}), 0, 10.0).unwrap_err();
    assert!(bad.to_string().contains("1 numbers instead of 256"));
    let vector = vec![0.0625; DIM];
    for seconds in [1e308, -1.0, 12.0] {
        let bad = sample_of("d", &json!({"vector": vector, "seconds": seconds}), 0, 10.0);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("not a length of speech"));
    }
    let fine = sample_of("d", &json!({"vector": vector, "seconds": 9.5}), 0, 10.0);
    assert_eq!(fine.unwrap().1.seconds, 9.5);
}

#[test]
fn a_deletion_during_an_enrolment_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    store
        .add("a", "m", sample(1.0), &store.enrolment(), (5, 5))
        .unwrap();
    let taken = store.enrolment(); // an enrolment request comes in …
    store.delete("a").unwrap(); // … `a` is deleted while it runs …
    assert_eq!(
        store.add("a", "m", sample(1.0), &taken, (5, 5)),
        Err(SpeakerError::DeletedMeanwhile("a".into()))
    );
    drop(taken);
    assert!(store.is_empty());
    let fresh = store.enrolment();
    store.add("a", "m", sample(1.0), &fresh, (5, 5)).unwrap();
    // A deletion of another name does not stop it.
    store.add("b", "m", sample(1.0), &fresh, (5, 5)).unwrap();
    drop(fresh);
    let taken = store.enrolment();
    store.delete("b").unwrap();
    store.add("a", "m", sample(2.0), &taken, (5, 5)).unwrap();
    drop(taken);
    // A name's first enrolment: its deletion meanwhile is not found, and still wins.
    let first = store.enrolment();
    assert_eq!(store.delete("new"), Err(SpeakerError::NotYet("new".into())));
    assert_eq!(
        store.add("new", "m", sample(1.0), &first, (5, 5)),
        Err(SpeakerError::DeletedMeanwhile("new".into()))
    );
    drop(first);
    // With no enrolment under way, nothing is kept of it.
    assert_eq!(
        store.delete("new"),
        Err(SpeakerError::NotFound("new".into()))
    );
    assert!(store.lock().deletions.is_empty());
    // Deletions of names nobody has, while an enrolment runs, are bounded: past the bound
    // every enrolment under way is refused instead.
    let running = store.enrolment();
    for n in 0..=DELETIONS_MAX {
        let _ = store.delete(&format!("nobody {n}"));
    }
    assert_eq!(store.lock().deletions.len(), DELETIONS_MAX);
    assert_eq!(
        store.add("other", "m", sample(1.0), &running, (5, 5)),
        Err(SpeakerError::DeletedMeanwhile("other".into()))
    );
    drop(running);
    assert!(store.lock().deletions.is_empty());
    store
        .add("new", "m", sample(1.0), &store.enrolment(), (5, 5))
        .unwrap();
}

#[test]
fn broken_files_and_leftovers_are_not_voices() {
    let dir = tempfile::tempdir().unwrap();
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    store
        .add("a", "m", sample(1.0), &store.enrolment(), (5, 5))
        .unwrap();
    std::fs::write(dir.path().join(".voice-half"), b"{").unwrap();
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(dir.path().join(".voice-half"))
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    // Maybe a server's write in progress: a command beside it leaves it alone.
    std::fs::write(dir.path().join(".voice-fresh"), b"{").unwrap();
    let nan = r#"{"name":"b","model":"m","samples":[{"vector":[null],"seconds":1,"added":1}]}"#;
    std::fs::write(dir.path().join(file_name("b")), nan).unwrap();
    std::fs::write(
        dir.path().join(file_name("c")),
        store.lock().voices["a"].summary().to_string(),
    )
    .unwrap();
    // A FIFO and a link to /dev/zero (the load hung on the one and filled memory from the
    // other): not voices.
    let fifo = std::ffi::CString::new(
        dir.path()
            .join(file_name("d"))
            .to_str()
            .unwrap()
            .to_string(),
    )
    .unwrap();
    // SAFETY: mkfifo with a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("/dev/zero", dir.path().join(file_name("e"))).unwrap();
    let again = Speakers::load(dir.path().to_path_buf(), Leftovers::Stale);
    let names: Vec<Value> = again.list().iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, [json!("a")]);
    assert!(
        !dir.path().join(".voice-half").exists(),
        "a crash's leftover is removed"
    );
    assert!(dir.path().join(".voice-fresh").exists());
    // The server, the folder's only writer, removes every one (a crash and a quick restart
    // left one holding a voiceprint through its voice's deletion).
    let _server = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    assert!(!dir.path().join(".voice-fresh").exists());
    // And a deletion sweeps any that appear while it runs.
    std::fs::write(dir.path().join(".voice-later"), b"{").unwrap();
    again.delete("a").unwrap();
    assert!(!dir.path().join(".voice-later").exists());
    assert!(check_name("a\u{200B}b").is_err());
    assert!(check_name("..").is_err() && check_name(".").is_err());
    assert!(check_name("...").is_ok());
    assert!(
        check_name("a\u{200D}b").is_err(),
        "joiners make look-alike voice names"
    );
    // Decomposed Hangul (NFD, as some systems type it) is the same name.
    assert_eq!(check_name("\u{1106}\u{1175}\u{11AB}").unwrap(), "민");
}

/// Writes `voice` into the voices folder `dir` as a build that kept its name as written would;
/// its file.
fn put(dir: &std::path::Path, voice: &Voice) -> std::path::PathBuf {
    let path = dir.join(file_name(&voice.name));
    std::fs::write(&path, serde_json::to_vec(voice).unwrap()).unwrap();
    path
}

#[test]
fn a_voice_kept_under_an_older_spelling_of_its_name_is_renamed_not_lost() {
    // An older build kept "Bob\u{A0}Smith" as written; now names are kept with plain spaces,
    // and such a file was ignored: not listed, and DELETE left it on disk.
    let dir = tempfile::tempdir().unwrap();
    let old = Voice {
        name: "Bob\u{A0}Smith".into(),
        model: "m".into(),
        samples: vec![sample(1.0)],
    };
    let old_file = put(dir.path(), &old);
    // Another sample under the name as written now joins it.
    let now = Voice {
        name: "Bob Smith".into(),
        samples: vec![sample(2.0)],
        ..old.clone()
    };
    put(dir.path(), &now);
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    let listed = store.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "Bob Smith");
    assert_eq!(listed[0]["samples"], 2);
    assert!(!old_file.exists(), "the old file stays");
    store.delete("Bob Smith").unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_migration_cut_short_is_not_counted_twice_and_one_shot_commands_leave_it_to_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let old = Voice {
        name: "Bob\u{A0}Smith".into(),
        model: "m".into(),
        samples: vec![sample(1.0)],
    };
    let old_file = put(dir.path(), &old);
    // A crash after the migrated file was written and before the old one went.
    let migrated = Voice {
        name: "Bob Smith".into(),
        samples: vec![sample(1.0), sample(2.0)],
        ..old.clone()
    };
    put(dir.path(), &migrated);
    // A one-shot command beside the server reads it under its name, and writes nothing.
    let beside = Speakers::load(dir.path().to_path_buf(), Leftovers::Stale);
    assert_eq!(beside.list()[0]["samples"], 2);
    assert!(old_file.exists(), "a command beside the server migrated");
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    let listed = store.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["samples"], 2, "a sample migrated twice");
    assert!(!old_file.exists());
}

#[test]
fn deleting_a_name_removes_its_older_spelling_kept_for_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let old = Voice {
        name: "Bob\u{A0}Smith".into(),
        model: "old-model".into(),
        samples: vec![sample(1.0)],
    };
    put(dir.path(), &old);
    let now = Voice {
        name: "Bob Smith".into(),
        model: "m".into(),
        samples: vec![sample(2.0)],
    };
    put(dir.path(), &now);
    let store = Speakers::load(dir.path().to_path_buf(), Leftovers::All);
    assert_eq!(store.list().len(), 1);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        2,
        "left as it is"
    );
    store.delete("Bob Smith").unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "personal data left on disk"
    );
}
