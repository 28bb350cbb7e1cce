//! What a request may ask of the speech pipeline (`diarizer`, `asr`, `aligner`), through every
//! door: language codes as people write them, stages that depend on each other, formats a
//! subset of stages cannot give, options for stages a request leaves out, and the OpenAI form's
//! fields. Every refusal comes before the job queues (no worker sees it).

use serde_json::Value;

use super::support::*;

fn speech_pipeline() -> String {
    let meta = r#"{"protocol":1,"model":"tiny.en","languages":["en"]}"#;
    format!(
        "[pipeline]\nstages = [\"diarizer\", \"asr\", \"aligner\"]\n{}{}{}",
        fake_worker("diarizer", "env = { FAKE_TURNS = \"1\" }\n"),
        fake_worker(
            "asr",
            &format!("env = {{ FAKE_TEXT = \"hello there\", FAKE_READY_META = '{meta}' }}\n")
        ),
        fake_worker("aligner", ""),
    )
}

async fn refused(host: &TestHost, query: &str) -> String {
    let r = host
        .post_body(&format!("/transcribe{query}"), wav(0.4, 16000, 1))
        .await;
    assert_eq!(r.status(), 400, "{query}");
    let body: Value = r.json().await.unwrap();
    body["message"].as_str().unwrap().to_string()
}

async fn tasks_done(host: &TestHost) -> u64 {
    let mut done = 0;
    for stage in ["diarizer", "asr", "aligner"] {
        done += host.worker(stage).await["tasks_done"].as_u64().unwrap();
    }
    done
}

#[tokio::test]
async fn what_the_pipeline_cannot_give_is_refused_before_the_queue() {
    let host = TestHost::start(&speech_pipeline()).await.ready().await;
    for (query, says) in [
        ("?stages=,", "names no stage"),
        ("?stages=%20,%20", "names no stage"),
        ("?stages=aligner", "stages=asr,aligner"),
        ("?stages=diarizer,aligner", "stages=asr,aligner"),
        ("?stages=diarizer&format=srt", "needs the `asr` stage"),
        ("?stages=diarizer&format=txt", "needs the `asr` stage"),
        (
            "?stages=asr&num_speakers=2",
            "`num_speakers` is for the `diarizer` stage",
        ),
        (
            "?stages=diarizer&language=en",
            "`language` is for the `asr` stage",
        ),
        (
            "?stages=diarizer&prompt=Kim",
            "`prompt` is for the `asr` stage",
        ),
        ("?num_speakers=2147483648", "at most 1000"),
        ("?max_speakers=1001", "at most 1000"),
        ("?language=-US", "language code"),
    ] {
        let message = refused(&host, query).await;
        assert!(message.contains(says), "{query}: {message}");
    }
    assert_eq!(tasks_done(&host).await, 0, "nothing reached a worker");
    host.stop().await;
}

#[tokio::test]
async fn languages_are_taken_as_people_write_them() {
    let host = TestHost::start(&speech_pipeline()).await.ready().await;
    for given in ["EN", "en-US", "en_gb", "English"] {
        let events = host
            .transcribe(&format!("?stages=asr&language={given}"), wav(0.4, 16000, 1))
            .await;
        // The worker got the bare code (the fake echoes it as the result's language).
        assert_eq!(result_of(&events)["language"], "en", "{given}");
    }
    // A format nobody offers is named, with the ones there are.
    let message = refused(&host, "?format=docx").await;
    assert!(
        message.contains("docx") && message.contains("srt"),
        "{message}"
    );
    // Korean is refused by the English-only model, whatever its spelling.
    for given in ["ko", "KO", "ko-KR", "Korean"] {
        let message = refused(&host, &format!("?stages=asr&language={given}")).await;
        assert!(message.contains("tiny.en"), "{given}: {message}");
    }
    host.stop().await;
}

#[tokio::test]
async fn a_diarizer_alone_gives_rttm() {
    let host = TestHost::start(&speech_pipeline()).await.ready().await;
    let r = host
        .post_body(
            "/transcribe?stages=diarizer&format=RTTM", // in any case, as people type it
            wav(2.0, 16000, 1),
        )
        .await;
    assert_eq!(r.status(), 200);
    let rttm = r.text().await.unwrap();
    assert_eq!(
        rttm,
        "SPEAKER audio 1 0.000 1.000 <NA> <NA> SPEAKER_00 <NA> <NA>\n\
         SPEAKER audio 1 1.000 1.000 <NA> <NA> SPEAKER_01 <NA> <NA>\n"
    );
    host.stop().await;
}

fn form_with_file() -> reqwest::multipart::Form {
    reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(wav(0.4, 16000, 1)).file_name("a.wav"),
    )
}

#[tokio::test]
async fn the_openai_form_refuses_what_it_would_otherwise_drop() {
    let host = TestHost::start(&speech_pipeline()).await.ready().await;
    let post = |form| host.post("/v1/audio/transcriptions").multipart(form).send();
    let second_file = form_with_file().part(
        "file",
        reqwest::multipart::Part::bytes(wav(0.4, 16000, 1)).file_name("b.wav"),
    );
    for (form, says) in [
        (second_file, "`file` is given twice"),
        (
            form_with_file()
                .text("language", "en")
                .text("language", "de"),
            "`language` is given twice",
        ),
        (form_with_file().text("temperature", "abc"), "temperature"),
        (form_with_file().text("temperature", "1.5"), "temperature"),
        (form_with_file().text("stream", "true"), "NDJSON"),
        (
            form_with_file().text("colour", "blue"),
            "unknown form field `colour`",
        ),
        // Named as unknown whatever its size (it read as over limits.max_field_bytes).
        (
            form_with_file().text("keywords", "k".repeat(9000)),
            "unknown form field `keywords`",
        ),
        (form_with_file().text("num_speakers", "0"), "at least 1"),
        (form_with_file().text("num_speakers", "two"), "whole number"),
        (form_with_file().text("", "x"), "a form part has no name"),
    ] {
        let (message, body) = openai_error(post(form).await.unwrap(), 400).await;
        assert!(message.contains(says), "{says}: {body}");
        // OpenAI's `param` names the field at fault where one is.
        let param = [
            "temperature",
            "colour",
            "keywords",
            "num_speakers",
            "file",
            "language",
        ]
        .into_iter()
        .find(|p| says.contains(p) || message.contains(&format!("`{p}`")));
        if let Some(param) = param {
            assert_eq!(body["error"]["param"], param, "{body}");
        }
    }
    // A form field in the query was ignored (`?language=ko`: English came back).
    for query in [
        "language=ko",
        "x=1&response_format=srt",
        "timestamp_granularities%5B%5D=word",
    ] {
        let r = host
            .post(&format!("/v1/audio/transcriptions?{query}"))
            .multipart(form_with_file())
            .send()
            .await
            .unwrap();
        let (message, body) = openai_error(r, 400).await;
        assert!(message.contains("query parameter"), "{query}: {body}");
        let name = body["error"]["param"].as_str().unwrap().to_string();
        assert!(
            query.contains(&name.replace("[]", "%5B%5D")),
            "{query}: {body}"
        );
    }
    assert_eq!(tasks_done(&host).await, 0, "nothing reached a worker");
    // Azure OpenAI clients add `api-version`: not a field, let through.
    let r = host
        .post("/v1/audio/transcriptions?api-version=2024-06-01")
        .multipart(form_with_file())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // What clients send and gpuhost has no use for is accepted, and so are its speaker counts.
    let form = form_with_file()
        .text("model", "whisper-1")
        .text("temperature", "0")
        .text("stream", "False") // as Python's `requests` writes a bool
        .text("chunking_strategy[type]", "server_vad")
        .text("num_speakers", "2")
        .text("language", "English")
        .text("response_format", "verbose_json");
    let r = post(form).await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["task"], "transcribe", "{body}");
    assert_eq!(body["language"], "english", "{body}");
    assert_eq!(body["text"], "hello there", "{body}");
    host.stop().await;
}

#[tokio::test]
async fn the_openai_endpoints_need_an_asr_stage() {
    let config = format!(
        "[pipeline]\nstages = [\"diarizer\"]\n{}",
        fake_worker("diarizer", "")
    );
    let host = TestHost::start(&config).await.ready().await;
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        let r = host
            .post(path)
            .multipart(form_with_file().text("response_format", "srt"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let body: Value = r.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("no `asr` stage"), "{path}: {body}");
    }
    assert_eq!(host.worker("diarizer").await["tasks_done"], 0);
    host.stop().await;
}
