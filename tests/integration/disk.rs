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

#[tokio::test]
async fn a_job_folder_that_cannot_be_made_is_a_500_that_names_no_path() {
    let dir = tempfile::tempdir().unwrap();
    let temp = dir.path().join("jobs");
    let host = TestHost::start(&format!(
        "[limits]\ntemp_dir = {:?}\nsmall_temp_dir = \"\"\n[pipeline]\nstages = [\"asr\"]\n{}",
        temp.display().to_string(),
        fake_worker("asr", "")
    ))
    .await
    .ready()
    .await;
    // The temp dir turned into a file under the running server.
    let _ = std::fs::remove_dir_all(&temp);
    std::fs::write(&temp, b"").unwrap();
    let path = dir.path().display().to_string();
    let response = host
        .post("/transcribe?format=txt")
        .body(wav(0.5, 16000, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body: serde_json::Value = response.json().await.unwrap();
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("cannot create a job folder"), "{message}");
    assert!(!message.contains(&path), "{message}");
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.5, 16000, 1)).file_name("a.wav"),
        )
        .text("model", "whisper-1");
    let response = host
        .post("/v1/audio/transcriptions")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (message, _) = openai_error(response, 500).await;
    assert!(!message.contains(&path), "{message}");
    host.stop().await;
}

#[tokio::test]
async fn a_form_declared_larger_than_allowed_is_refused_before_it_is_read() {
    let host = TestHost::start(&format!(
        "[limits]\nmax_upload_bytes = 100000\n[pipeline]\nstages = [\"asr\"]\n{}",
        fake_worker("asr", "")
    ))
    .await
    .ready()
    .await;
    // Declared, not sent: the answer comes before any of the body.
    let addr = host.url.trim_start_matches("http://").to_string();
    let head = "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n\
                Content-Type: multipart/form-data; boundary=x\r\n\
                Content-Length: 600000000\r\n\r\n";
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        tcp.write_all(head.as_bytes()).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tcp.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("max_upload_bytes"), "{reply}");
    host.stop().await;
}
