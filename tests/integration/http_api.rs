//! The HTTP contract: auth, limits, bad input — each with a status code and a JSON message.

use serde_json::Value;

use super::support::*;

fn config(extra: &str) -> String {
    format!(
        "{extra}\n[pipeline]\nstages = [\"w\"]\n{}",
        fake_worker("w", "")
    )
}

async fn json_error(response: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(response.status().as_u16(), status);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], code, "{body}");
    let message = body["message"].as_str().unwrap().to_string();
    assert!(!message.is_empty());
    message
}

#[tokio::test]
async fn auth_matrix() {
    let host = TestHost::start(&config("token = \"s3cret-token\""))
        .await
        .ready()
        .await;
    let plain = reqwest::Client::new();
    let url = |p: &str| format!("{}{}", host.url, p);
    // /health is open.
    assert_eq!(
        plain.get(url("/health")).send().await.unwrap().status(),
        200
    );
    for (method, path) in [("GET", "/workers"), ("POST", "/transcribe")] {
        let m: reqwest::Method = method.parse().unwrap();
        let none = plain
            .request(m.clone(), url(path))
            .body(wav(0.2, 16000, 1))
            .send()
            .await
            .unwrap();
        assert_eq!(none.headers()["www-authenticate"], "Bearer");
        json_error(none, 401, "unauthorized").await;
        let wrong = plain
            .request(m.clone(), url(path))
            .bearer_auth("s3cret-tokem")
            .body(wav(0.2, 16000, 1));
        json_error(wrong.send().await.unwrap(), 401, "unauthorized").await;
        let basic = plain
            .request(m.clone(), url(path))
            .header("authorization", "Basic s3cret-token");
        json_error(basic.send().await.unwrap(), 401, "unauthorized").await;
        let right = plain
            .request(m, url(path))
            .bearer_auth("s3cret-token")
            .body(wav(0.2, 16000, 1));
        assert_eq!(right.send().await.unwrap().status(), 200, "{method} {path}");
    }
    // `/v1/…` refusals come in OpenAI's shape, whichever layer made them (OpenAI clients read
    // `error.message`); the status and headers stay.
    let openai = |r: reqwest::Response, status: u16, code: &'static str| async move {
        assert_eq!(r.status().as_u16(), status);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(
            !body["error"]["message"].as_str().unwrap().is_empty(),
            "{body}"
        );
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    };
    let v1 = url("/v1/audio/transcriptions");
    let none = plain
        .post(&v1)
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(none.headers()["www-authenticate"], "Bearer");
    openai(none, 401, "unauthorized").await;
    let get = plain
        .get(&v1)
        .bearer_auth("s3cret-token")
        .send()
        .await
        .unwrap();
    openai(get, 405, "method_not_allowed").await;
    let elsewhere = plain
        .post(&v1)
        .bearer_auth("s3cret-token")
        .header("origin", "http://evil.example")
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    openai(elsewhere, 403, "cross_site_request").await;
    let unknown = plain.get(url("/v1/models/x")).bearer_auth("s3cret-token");
    openai(unknown.send().await.unwrap(), 404, "model_not_found").await;
    // A model id that is not UTF-8: in OpenAI's JSON shape too, not plain text.
    let garbled = plain.get(url("/v1/models/%FF")).bearer_auth("s3cret-token");
    openai(garbled.send().await.unwrap(), 400, "bad_request").await;
    let elsewhere = plain
        .get(url("/v1/no/such/route"))
        .bearer_auth("s3cret-token");
    openai(elsewhere.send().await.unwrap(), 404, "not_found").await;
    // A base URL without its /v1 (a common slip): told so, in a shape OpenAI clients show.
    let slip = plain
        .post(url("/audio/transcriptions"))
        .bearer_auth("s3cret-token")
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    let (message, body) = openai_error(slip, 404).await;
    assert!(message.contains("base URL ends in /v1"), "{body}");
    // The model list OpenAI clients and UIs ask for first: empty without an `asr` stage.
    let models = plain.get(url("/v1/models")).bearer_auth("s3cret-token");
    let models: Value = models.send().await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list", "{models}");
    assert_eq!(models["data"], serde_json::json!([]), "{models}");
    openai(
        plain.get(url("/v1/models")).send().await.unwrap(),
        401,
        "unauthorized",
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn upload_limits() {
    let host = TestHost::start(&config(
        "[limits]\nmax_upload_bytes = 20000\nmax_audio_seconds = 1.0",
    ))
    .await;
    // Declared too large: refused before reading.
    let big = host.post_body("/transcribe", wav(2.0, 16000, 1)).await;
    let msg = json_error(big, 413, "payload_too_large").await;
    assert!(msg.contains("20000 bytes"), "{msg}");
    // Chunked, no Content-Length: refused while streaming.
    let chunks = futures_util::stream::iter(
        (0..10).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; 4096]))),
    );
    let chunked = host
        .post_body("/transcribe", reqwest::Body::wrap_stream(chunks))
        .await;
    json_error(chunked, 413, "payload_too_large").await;
    // Small file, long audio (8 kHz keeps it under the byte limit).
    let long = host.post_body("/transcribe", wav(1.1, 8000, 1)).await;
    let msg = json_error(long, 413, "audio_too_long").await;
    assert!(msg.contains("at most 1 s"), "{msg}");
    host.stop().await;
}

#[tokio::test]
async fn empty_and_undecodable_uploads() {
    let host = TestHost::start(&config("[audio]\nffmpeg = \"\"")).await;
    let empty = host.post_body("/transcribe", Vec::new()).await;
    json_error(empty, 400, "empty_upload").await;
    let text = host
        .post_body(
            "/transcribe",
            b"this is not audio at all, just text".to_vec(),
        )
        .await;
    let msg = json_error(text, 415, "undecodable_audio").await;
    assert!(msg.contains("unrecognized container format"), "{msg}");
    let mut truncated = wav(0.5, 16000, 1);
    truncated.truncate(40);
    let cut = host.post_body("/transcribe", truncated).await;
    json_error(cut, 415, "undecodable_audio").await;
    host.stop().await;
}

#[tokio::test]
async fn bad_queries_and_routes() {
    let host = TestHost::start(&config("")).await;
    let r = host
        .post_body("/transcribe?stages=w,ocr", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(
        msg.contains("`ocr`") && msg.contains("pipeline is: w"),
        "{msg}"
    );
    for bad in ["two", "-1"] {
        let r = host
            .post_body(
                &format!("/transcribe?num_speakers={bad}"),
                wav(0.2, 16000, 1),
            )
            .await;
        let msg = json_error(r, 400, "bad_request").await;
        // Said in words, not serde's "invalid digit found in string".
        assert!(msg.contains("num_speakers: not a whole number"), "{msg}");
    }
    // A compressed body is refused by name, not decoded as audio.
    let r = host
        .post("/transcribe")
        .header("content-encoding", "gzip")
        .body(wav(0.2, 16000, 1))
        .send()
        .await
        .unwrap();
    let msg = json_error(r, 415, "unsupported_audio_format").await;
    assert!(msg.contains("Content-Encoding: gzip"), "{msg}");
    // Empty: not serde's "cannot parse integer from empty string".
    let r = host
        .post_body("/transcribe?num_speakers=", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(
        msg.contains("num_speakers: empty, not a whole number"),
        "{msg}"
    );
    let r = host
        .client()
        .delete(format!("{}/gpu/lease/abc", host.url))
        .send()
        .await
        .unwrap();
    let msg = json_error(r, 400, "bad_request").await;
    assert!(msg.contains("a lease id is a whole number"), "{msg}");
    let r = host
        .post_body(
            "/transcribe?min_speakers=3&max_speakers=2",
            wav(0.2, 16000, 1),
        )
        .await;
    json_error(r, 400, "bad_request").await;
    let r = host
        .post_body("/transcribe?colour=blue", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(msg.contains("colour"), "{msg}");
    // A right-to-left override is not a language code (it would be echoed into the result).
    let r = host
        .post_body("/transcribe?language=%E2%80%AE", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(msg.contains("language code"), "{msg}");
    // A name in the path that is not UTF-8 is answered in JSON like every other error.
    for path in ["/workers/%FF/unload", "/services/%FF/start"] {
        let r = host.post(path).send().await.unwrap();
        let msg = json_error(r, 400, "bad_request").await;
        assert!(msg.contains("UTF-8"), "{path}: {msg}");
    }
    json_error(host.get("/nope").send().await.unwrap(), 404, "not_found").await;
    json_error(
        host.get("/transcribe").send().await.unwrap(),
        405,
        "method_not_allowed",
    )
    .await;
    host.stop().await;
}

#[tokio::test]
async fn multipart_upload_and_missing_field() {
    let host = TestHost::start(&config("")).await.ready().await;
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(wav(0.7, 22050, 2)).file_name("a.wav"),
    );
    let response = host
        .post("/transcribe")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let result = result_of(&read_events(response).await);
    assert!(
        (result["duration"].as_f64().unwrap() - 0.7).abs() < 0.01,
        "{result}"
    );
    assert_eq!(result["audio"]["source_channels"], 2);
    let form = reqwest::multipart::Form::new().text("audio", "nope");
    let r = host
        .post("/transcribe")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let msg = json_error(r, 400, "bad_request").await;
    assert!(msg.contains("`file`"), "{msg}");
    // An option as a form field, after the file, as `curl -F file=@a.wav -F language=de` sends
    // it: refused (it used to be skipped, and the job ran in English), pointing to the query.
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.7, 22050, 2)).file_name("a.wav"),
        )
        .text("language", "de");
    let r = host
        .post("/transcribe")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let msg = json_error(r, 400, "bad_request").await;
    assert!(
        msg.contains("`language`") && msg.contains("query string"),
        "{msg}"
    );
    host.stop().await;
}

#[tokio::test]
async fn workers_endpoint_reports_state() {
    let host = TestHost::start(&config("")).await.ready().await;
    let w = host.worker("w").await;
    assert_eq!(w["state"], "ready");
    assert_eq!(w["mode"], "resident");
    assert!(w["pid"].as_u64().unwrap() > 0);
    assert!(w["uptime_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(w["tasks_done"], 0);
    host.stop().await;
}

#[tokio::test]
async fn a_language_the_loaded_model_lacks_is_refused_before_it_queues() {
    let config = format!(
        "[pipeline]\nstages = [\"asr\"]\n{}",
        fake_worker(
            "asr",
            "env = { FAKE_TEXT = \"hello\", FAKE_READY_META = '{\"protocol\":1,\"model\":\"Systran/tiny.en\",\"languages\":[\"en\"]}' }\n"
        )
    );
    let host = TestHost::start(&config).await.ready().await;
    // OpenAI's default name and the loaded model are the models listed.
    let models = host.get_json("/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["whisper-1", "Systran/tiny.en"], "{models}");
    // Unescaped, as clients send an id.
    let one = host.get_json("/v1/models/Systran/tiny.en").await;
    assert_eq!(one["id"], "Systran/tiny.en", "{one}");
    // Speaker counts where no diarizer runs: nothing would read them.
    let r = host
        .post_body("/transcribe?num_speakers=2", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(
        msg.contains("`num_speakers`") && msg.contains("has none"),
        "{msg}"
    );
    let r = host
        .post_body("/transcribe?language=ko", wav(0.2, 16000, 1))
        .await;
    let msg = json_error(r, 400, "bad_request").await;
    assert!(
        msg.contains("`ko`") && msg.contains("tiny.en") && msg.contains("engine = \"base\""),
        "names the language, the model and what to configure: {msg}"
    );
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.2, 16000, 1)).file_name("a.wav"),
        )
        .text("model", "whisper-1")
        .text("language", "ko");
    let r = host
        .post("/v1/audio/transcriptions")
        .multipart(form)
        .send()
        .await
        .unwrap();
    let (message, body) = openai_error(r, 400).await;
    assert!(message.contains("`ko`"), "OpenAI's error shape: {body}");
    assert_eq!(
        host.worker("asr").await["tasks_done"],
        0,
        "nothing reached the worker"
    );
    // English (with a region) is fine.
    result_of(&host.transcribe("?language=en-US", wav(0.2, 16000, 1)).await);
    // timestamp_granularities: two values exist; anything else is refused, repeats are one.
    let form = |values: Vec<String>| {
        values.into_iter().fold(
            reqwest::multipart::Form::new().part(
                "file",
                reqwest::multipart::Part::bytes(wav(0.2, 16000, 1)).file_name("a.wav"),
            ),
            |form, v| form.text("timestamp_granularities[]", v),
        )
    };
    let post = |form| host.post("/v1/audio/transcriptions").multipart(form).send();
    let r = post(form(vec!["x".repeat(8000)])).await.unwrap();
    let (message, body) = openai_error(r, 400).await;
    assert!(message.contains("`word` or `segment`"), "{body}");
    let r = post(form(vec!["word".into(); 100]).text("response_format", "verbose_json"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // Without verbose_json there are no times to give: refused, as OpenAI does.
    let r = post(form(vec!["word".into()])).await.unwrap();
    let (message, body) = openai_error(r, 400).await;
    assert!(message.contains("verbose_json"), "{body}");
    // A response_format with spaces around it is read as the others are.
    let r = post(form(vec![]).text("response_format", " text "))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    host.stop().await;
}

#[tokio::test]
async fn translations_go_to_a_multilingual_asr_and_an_english_only_one_refuses_them() {
    let asr = |meta: &str| {
        format!(
            "[pipeline]\nstages = [\"asr\"]\n{}",
            fake_worker(
                "asr",
                &format!("env = {{ FAKE_TEXT = \"guten morgen\", FAKE_READY_META = '{meta}' }}\n")
            )
        )
    };
    let translate = |host: &TestHost| {
        let form = reqwest::multipart::Form::new()
            .part(
                "file",
                reqwest::multipart::Part::bytes(wav(0.5, 16000, 1)).file_name("a.wav"),
            )
            .text("model", "whisper-1")
            .text("response_format", "text");
        host.post("/v1/audio/translations").multipart(form).send()
    };
    let multilingual = r#"{"protocol":1,"model":"base","languages":["en","de"],"translate":true}"#;
    let host = TestHost::start(&asr(multilingual)).await.ready().await;
    let r = translate(&host).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "translated guten morgen\n");
    // verbose_json: a translation's `language` is its output's, as OpenAI's (always english).
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(wav(0.5, 16000, 1)).file_name("a.wav"),
        )
        .text("language", "de")
        .text("response_format", "verbose_json");
    let verbose: Value = host
        .post("/v1/audio/translations")
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&verbose["task"], &verbose["language"]),
        (
            &serde_json::json!("translate"),
            &serde_json::json!("english")
        ),
        "{verbose}"
    );
    // The same through the NDJSON endpoint; a plain transcription stays untranslated.
    let events = host.transcribe("?translate=true", wav(0.5, 16000, 1)).await;
    assert_eq!(result_of(&events)["text"], "translated guten morgen");
    let events = host.transcribe("", wav(0.5, 16000, 1)).await;
    assert_eq!(result_of(&events)["text"], "guten morgen");
    host.stop().await;

    let english = r#"{"protocol":1,"model":"tiny.en","languages":["en"]}"#;
    let host = TestHost::start(&asr(english)).await.ready().await;
    let r = translate(&host).await.unwrap();
    let (message, body) = openai_error(r, 400).await;
    assert!(
        message.contains("tiny.en") && message.contains("engine = \"base\""),
        "names the model and what to configure: {body}"
    );
    assert_eq!(
        host.worker("asr").await["tasks_done"],
        0,
        "refused up front"
    );
    host.stop().await;
}

#[tokio::test]
async fn a_workers_own_failure_at_v1_is_a_server_error_clients_do_not_retry() {
    let host = TestHost::start(&format!(
        "[pipeline]\nstages = [\"asr\"]\n{}",
        fake_worker("asr", "")
    ))
    .await
    .ready()
    .await;
    let ask = |prompt: &str| {
        let form = reqwest::multipart::Form::new()
            .text("prompt", prompt.to_string())
            .part(
                "file",
                reqwest::multipart::Part::bytes(wav(0.3, 16000, 1)).file_name("a.wav"),
            );
        host.post("/v1/audio/transcriptions").multipart(form).send()
    };
    let failed = ask("fake:error").await.unwrap();
    assert_eq!(failed.status(), 500);
    assert_eq!(failed.headers()["x-should-retry"], "false");
    let body: Value = failed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["code"], "job_failed", "{body}");
    // A crash may go otherwise on the new process: left to the client's retries.
    let crashed = ask("fake:crash").await.unwrap();
    assert_eq!(crashed.status(), 502);
    assert!(crashed.headers().get("x-should-retry").is_none());
    host.stop().await;
}
