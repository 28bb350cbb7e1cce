//! The temp dir's disk: uploads and decodes that would leave less than `limits.min_free_bytes`
//! free are refused with 507 while they stream or decode, instead of filling the disk under
//! running jobs.

use futures_util::stream;

use super::support::*;

/// More than any disk has: every check of free space fails.
const KEEP_ALL: &str = "1152921504606846976";

#[tokio::test]
async fn uploads_that_would_fill_the_disk_are_refused_with_507() {
    let dir = tempfile::tempdir().unwrap();
    let host = TestHost::start(&format!(
        "[limits]\ntemp_dir = {:?}\nmin_free_bytes = {KEEP_ALL}\n[pipeline]\nstages = [\"w\"]\n{}",
        dir.path().display().to_string(),
        fake_worker("w", "")
    ))
    .await
    .ready()
    .await;
    let post = |body: reqwest::Body| {
        reqwest::Client::new()
            .post(format!("{}/transcribe", host.url))
            .body(body)
            .send()
    };
    let temp = dir.path().display().to_string();
    let refused = |response: reqwest::Response| {
        let temp = temp.clone();
        async move {
            assert_eq!(response.status().as_u16(), 507);
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(body["error"], "insufficient_storage", "{body}");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("limits.min_free_bytes"), "{message}");
            assert!(!message.contains(&temp), "{message}");
        }
    };
    // Short uploads are taken (a copy, a decode done within the first second: the decode's
    // watch looks at the disk every second, see `audio::within_room`'s test).
    result_of(&host.transcribe("", wav(2.0, 16000, 1)).await);
    result_of(&host.transcribe("", wav(2.0, 44100, 1)).await);
    // A file that is not audio stays a 415 on a disk below the floor (only a disk that is
    // full makes a failed decode a 507).
    let r = post(b"not audio at all".to_vec().into()).await.unwrap();
    assert_eq!(r.status().as_u16(), 415);
    // A body declared too big for the space left: refused before it is read.
    refused(post(wav(320.0, 16000, 1).into()).await.unwrap()).await;
    // The same body without a declared length (chunked): refused once it spills to disk.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = wav(320.0, 16000, 1)
        .chunks(64 << 10)
        .map(|c| Ok(c.to_vec()))
        .collect();
    refused(
        post(reqwest::Body::wrap_stream(stream::iter(chunks)))
            .await
            .unwrap(),
    )
    .await;
    // Liveness and readiness are not the floor's business (a restart frees nothing).
    let r = reqwest::get(format!("{}/health", host.url)).await.unwrap();
    assert_eq!(r.status(), 200);
    // Nothing of them is left in the temp dir.
    wait_for(
        "job folders removed",
        std::time::Duration::from_secs(5),
        || async { std::fs::read_dir(dir.path()).unwrap().next().is_none() },
    )
    .await;
    host.stop().await;
}
