//! `/speakers` on the real server with the stdlib fake diarizer: enrolment through the GPU queue,
//! voiceprints kept in the state folder (owner-only, gone on DELETE, back after a restart), handed
//! to the diarizer stage only, and every mistake answered with a status and what to do.

use std::time::Duration;

use reqwest::multipart::{Form, Part};
use serde_json::{json, Value};

use super::support::*;

fn config(ready_meta: &str) -> String {
    format!(
        "token = \"secret\"\n[pipeline]\nstages = [\"diarizer\", \"other\"]\nparallel = []\n{}{}",
        fake_worker(
            "diarizer",
            &format!("env = {{ FAKE_READY_META = '{ready_meta}' }}")
        ),
        // No `asr`: the result keeps each stage's own answer.
        fake_worker("other", ""),
    )
}

fn form(name: &str, seconds: f64) -> Form {
    Form::new().text("name", name.to_string()).part(
        "file",
        Part::bytes(wav(seconds, 16000, 1)).file_name("voice.wav"),
    )
}

async fn enroll(host: &TestHost, form: Form) -> (u16, Value) {
    let response = host.post("/speakers").multipart(form).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// A ready host whose fake diarizer makes voiceprints.
async fn embedding_host() -> TestHost {
    TestHost::start(&config(r#"{"voiceprints":"fake-embed"}"#))
        .await
        .ready()
        .await
}

async fn listed(host: &TestHost) -> Vec<Value> {
    host.get_json("/speakers").await["speakers"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn a_voice_is_enrolled_kept_used_and_deleted_for_good() {
    let host = embedding_host().await;
    // The token guards voiceprints like every other personal thing.
    let anonymous = host.client().get(format!("{}/speakers", host.url));
    assert_eq!(anonymous.send().await.unwrap().status(), 401);

    let (status, voice) = enroll(&host, form("김민수", 3.0)).await;
    assert_eq!(status, 201, "{voice}");
    assert_eq!(voice["name"], "김민수");
    assert_eq!(voice["model"], "fake-embed");
    assert_eq!(voice["samples"], 1);
    // A second sample joins the same voice.
    let (status, voice) = enroll(&host, form("김민수", 4.0)).await;
    assert_eq!((status, voice["samples"].clone()), (201, json!(2)));
    let voices = listed(&host).await;
    assert_eq!(voices.len(), 1);
    assert!(
        voices[0].get("vector").is_none(),
        "voiceprints never leave the server"
    );

    let files: Vec<_> = std::fs::read_dir(host.state.config.state_dir().join("speakers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "only the owner may read a voiceprint");

    // Transcription hands the voiceprints to the diarizer stage, and to no other.
    let events = host.transcribe("", wav(1.0, 16000, 1)).await;
    let result = result_of(&events);
    assert_eq!(
        result["stages"]["diarizer"]["voiceprints"],
        json!(["김민수"])
    );
    assert_eq!(result["stages"]["diarizer"]["voiceprint_threshold"], 0.4);
    assert!(result["stages"]["other"].get("voiceprints").is_none());

    let gone = host
        .client()
        .delete(format!("{}/speakers/%EA%B9%80%EB%AF%BC%EC%88%98", host.url))
        .bearer_auth("secret")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 200);
    assert!(listed(&host).await.is_empty());
    assert!(!files[0].exists(), "DELETE removes the file");
    let events = host.transcribe("", wav(1.0, 16000, 1)).await;
    assert!(result_of(&events)["stages"]["diarizer"]
        .get("voiceprints")
        .is_none());
    let again = host
        .client()
        .delete(format!("{}/speakers/nobody", host.url))
        .bearer_auth("secret")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
    let body: Value = again.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("nobody"));
    host.stop().await;
}

#[tokio::test]
async fn voices_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A top-level key: before the tables.
    let toml = format!(
        "state_dir = {:?}\n{}",
        dir.path().display().to_string(),
        config(r#"{"voiceprints":"fake-embed"}"#)
    );
    let host = TestHost::start(&toml).await.ready().await;
    assert_eq!(enroll(&host, form("Alice", 3.0)).await.0, 201);
    host.stop().await;
    let host = TestHost::start(&toml).await.ready().await;
    let voices = listed(&host).await;
    assert_eq!(voices.len(), 1);
    assert_eq!(voices[0]["name"], "Alice");
    host.stop().await;
}

#[tokio::test]
async fn a_speaker_of_a_finished_transcript_is_enrolled_from_its_turns() {
    let host = embedding_host().await;
    let transcript = json!({
        "segments": [],
        "turns": [
            {"start": 0.5, "end": 2.0, "speaker": "SPEAKER_00"},
            {"start": 2.0, "end": 3.0, "speaker": "SPEAKER_01"},
            {"start": 3.0, "end": 4.5, "speaker": "SPEAKER_00"},
        ],
        "speakers": ["SPEAKER_00", "SPEAKER_01"],
    });
    let with = |speaker: &str| {
        form("Bob", 5.0)
            .text("transcript", transcript.to_string())
            .text("speaker", speaker.to_string())
    };
    let (status, voice) = enroll(&host, with("SPEAKER_00")).await;
    assert_eq!(status, 201, "{voice}");
    assert_eq!(
        voice["seconds"], 3.0,
        "the two turns of SPEAKER_00: 1.5 s + 1.5 s"
    );
    let (status, error) = enroll(&host, with("SPEAKER_07")).await;
    assert_eq!(status, 400);
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("SPEAKER_00, SPEAKER_01"), "{message}");
    // Another recording's transcript (it says its length) is refused, not learnt from.
    let mut longer = transcript.clone();
    longer["duration"] = json!(9.0);
    let (status, error) = enroll(
        &host,
        form("Dan", 5.0)
            .text("transcript", longer.to_string())
            .text("speaker", "SPEAKER_00"),
    )
    .await;
    assert_eq!(status, 400, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("send the audio that was transcribed"),
        "{message}"
    );
    assert!(!listed(&host).await.iter().any(|v| v["name"] == "Dan"));
    // Explicit segments work the same way.
    let segments = form("Carol", 5.0).text("segments", "[[0, 1.25], [2, 3]]");
    let (status, voice) = enroll(&host, segments).await;
    assert_eq!((status, voice["seconds"].clone()), (201, json!(2.25)));
    // One that runs past the end is taken to the end (1e308 reached the worker).
    let segments = form("Erin", 5.0).text("segments", "[[0, 1.25], [2, 1e308]]");
    let (status, voice) = enroll(&host, segments).await;
    assert_eq!((status, voice["seconds"].clone()), (201, json!(4.25)));
    host.stop().await;
}

#[tokio::test]
async fn every_mistake_gets_a_status_and_what_to_do() {
    let host = embedding_host().await;
    let cases: Vec<(Form, u16, &str)> = vec![
        (form("SPEAKER_00", 3.0), 400, "SPEAKER_"),
        (form("  ", 3.0), 400, "`name`"),
        (Form::new().text("name", "Ann"), 400, "`file`"),
        (
            form("Ann", 3.0).text("segments", "[[2, 1]]"),
            400,
            "0 <= start < end",
        ),
        (
            form("Ann", 3.0).text("segments", "soon"),
            400,
            "[[0.5, 4.2]",
        ),
        (
            form("Ann", 3.0).text("transcript", "{}"),
            400,
            "needs `speaker`",
        ),
        (
            form("Ann", 3.0).text("colour", "red"),
            400,
            "unknown form field",
        ),
        (
            form("Ann", 3.0).text("name", "Bea"),
            400,
            "`name` is given twice",
        ),
        (form("Bob\u{fe0f}", 3.0), 400, "invisible"),
        (form("Ann", 1.0), 400, "speech to learn the voice"),
    ];
    for (form, status, says) in cases {
        let (got, body) = enroll(&host, form).await;
        assert_eq!(got, status, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{message:?} should say {says:?}");
    }
    let raw = host.post_body("/speakers", wav(3.0, 16000, 1)).await;
    assert_eq!(raw.status(), 400, "a raw body has no name");
    assert!(listed(&host).await.is_empty(), "nothing half-enrolled");
    // The too-short sample was refused by the worker: the client's to change, so `/metrics`
    // counts it as refused, not as a failed job.
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("gpuhost_jobs_total{outcome=\"refused\"} 1")
            && metrics.contains("gpuhost_jobs_total{outcome=\"error\"} 0"),
        "{metrics}"
    );
    // Nor is it the worker's failure: its own counters and `last_error` say so too.
    assert!(
        metrics.contains("gpuhost_worker_tasks_total{worker=\"diarizer\",outcome=\"refused\"} 1")
            && metrics
                .contains("gpuhost_worker_tasks_total{worker=\"diarizer\",outcome=\"error\"} 0"),
        "{metrics}"
    );
    let worker = host.worker("diarizer").await;
    assert!(
        worker["last_error"].is_null() && worker["tasks_refused"] == 1,
        "{worker}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_diarizer_that_makes_no_voiceprints_is_refused_before_the_upload() {
    let host = TestHost::start(&config(r#"{"model":"other"}"#))
        .await
        .ready()
        .await;
    let (status, body) = enroll(&host, form("Ann", 3.0)).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("does not make voiceprints"));
    host.stop().await;
}

#[tokio::test]
async fn the_command_line_enrols_lists_and_deletes() {
    let host = embedding_host().await;
    let dir = tempfile::tempdir().unwrap();
    let audio = dir.path().join("voice.wav");
    std::fs::write(&audio, wav(3.0, 16000, 1)).unwrap();
    let gpuhost = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
        command
            .arg("speakers")
            .args(args)
            .args(["--server", &host.url, "--token", "secret"])
            .current_dir(dir.path()); // no gpuhost.toml there: the defaults
        command.output()
    };
    let added = gpuhost(&["add", "Dana Kim", audio.to_str().unwrap()])
        .await
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let voice: Value = serde_json::from_slice(&added.stdout).unwrap();
    assert_eq!(voice["name"], "Dana Kim");
    let listed = gpuhost(&["list"]).await.unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("Dana Kim"));
    let deleted = gpuhost(&["delete", "Dana Kim"]).await.unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    let again = gpuhost(&["delete", "Dana Kim"]).await.unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("404"));
    // `-` is stdin, as for `gpuhost transcribe`; a folder is said to be one.
    let mut piped = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpuhost"));
    piped
        .args([
            "speakers", "add", "Eve", "-", "--server", &host.url, "--token", "secret",
        ])
        .current_dir(dir.path())
        .stdin(std::fs::File::open(&audio).unwrap());
    let added = piped.output().await.unwrap();
    assert!(added.status.success(), "{added:?}");
    let listed = gpuhost(&["list"]).await.unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("Eve"));
    let folder = gpuhost(&["add", "Fay", "."]).await.unwrap();
    assert!(!folder.status.success());
    assert!(
        String::from_utf8_lossy(&folder.stderr).contains("is a folder"),
        "{folder:?}"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_deletion_while_an_enrolment_still_uploads_wins() {
    // The deletion was checked against the name's state once the whole form was read: a DELETE
    // that came while the sample still uploaded answered 200, then the enrolment brought the
    // voice back.
    let temp = tempfile::tempdir().unwrap();
    let toml = format!(
        "{}\n[limits]\ntemp_dir = {:?}\n",
        config(r#"{"voiceprints":"fake-embed"}"#),
        temp.path().display().to_string()
    );
    let host = TestHost::start(&toml).await.ready().await;
    assert_eq!(enroll(&host, form("Ann", 3.0)).await.0, 201);
    let (deleted, _, status, body) = delete_while_uploading(&host, temp.path(), "Ann").await;
    assert_eq!(deleted, 200);
    assert_eq!(status, 409, "{body}");
    assert!(
        listed(&host).await.is_empty(),
        "the deleted voice came back"
    );
    // A name's first enrolment: not there to delete yet (404, saying so), and still refused.
    // It was stored after the 404.
    let (deleted, said, status, body) = delete_while_uploading(&host, temp.path(), "Bo").await;
    assert_eq!(deleted, 404, "{said}");
    assert!(said.contains("under way"), "{said}");
    assert_eq!(status, 409, "{body}");
    assert!(
        listed(&host).await.is_empty(),
        "the withdrawn voice was stored"
    );
    host.stop().await;
}

/// Enrols `name` with an upload held back halfway while `DELETE /speakers/{name}` is sent: the
/// deletion's status and body, then the enrolment's.
async fn delete_while_uploading(
    host: &TestHost,
    temp: &std::path::Path,
    name: &str,
) -> (u16, String, u16, String) {
    let audio = wav(3.0, 16000, 1);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let upload = Form::new()
        .text("name", name.to_string())
        .part("file", Part::stream(body).file_name("v.wav"));
    let request = host.post("/speakers").multipart(upload);
    let enrolment = tokio::spawn(async move {
        let r = request.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    tx.send(Ok(audio[..1000].to_vec())).await.unwrap();
    // The request is in: its job folder exists.
    wait_for("the upload to begin", Duration::from_secs(10), || {
        let dir = temp.to_path_buf();
        async move {
            std::fs::read_dir(&dir)
                .map(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with("gpuhost-job-"))
                })
                .unwrap_or(false)
        }
    })
    .await;
    let deleted = host
        .client()
        .delete(format!("{}/speakers/{name}", host.url))
        .bearer_auth("secret")
        .send()
        .await
        .unwrap();
    let deleted = (deleted.status().as_u16(), deleted.text().await.unwrap());
    tx.send(Ok(audio[1000..].to_vec())).await.unwrap();
    drop(tx);
    let (status, body) = enrolment.await.unwrap();
    (deleted.0, deleted.1, status, body)
}
