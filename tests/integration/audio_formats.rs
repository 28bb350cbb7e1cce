//! Every accepted container/codec decodes to 16 kHz mono WAV of the right length.

use std::time::Duration;

use super::support::*;

async fn check(host: &TestHost, body: Vec<u8>, want_decoder: &str, seconds: f64) {
    let result = result_of(&host.transcribe("", body).await);
    let duration = result["duration"].as_f64().unwrap();
    assert!(
        (duration - seconds).abs() < 0.1,
        "duration {duration}, want {seconds}: {result}"
    );
    assert_eq!(result["audio"]["decoder"], want_decoder);
    if want_decoder == "ffmpeg" {
        // Unknown (ffmpeg runs quiet), not the output's 16 kHz mono given as the source's.
        assert!(result["audio"]["source_rate"].is_null(), "{result}");
        assert!(result["audio"]["source_channels"].is_null(), "{result}");
    } else {
        assert!(
            result["audio"]["source_rate"].as_u64().is_some(),
            "{result}"
        );
    }
    // The worker saw the normalized file: 16 kHz mono PCM16.
    assert!(result["stages"]["w"]["audio_path"]
        .as_str()
        .unwrap()
        .ends_with("audio.wav"));
}

#[tokio::test]
async fn every_format_decodes() {
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    check(&host, wav(1.25, 44100, 2), "symphonia", 1.25).await;
    // Already 16 kHz mono PCM16: copied, not transcoded.
    check(&host, wav(0.75, 16000, 1), "copy", 0.75).await;
    check(&host, wav(0.5, 8000, 1), "symphonia", 0.5).await;
    for name in ["tone.flac", "tone.mp3", "tone.ogg", "tone.m4a", "tone.mp4"] {
        let body = std::fs::read(fixture(&format!("audio/{name}"))).unwrap();
        let result = result_of(&host.transcribe("", body).await);
        let duration = result["duration"].as_f64().unwrap();
        assert!((duration - 1.5).abs() < 0.1, "{name}: duration {duration}");
        assert_eq!(result["audio"]["decoder"], "symphonia", "{name}");
    }
    host.stop().await;
}

#[tokio::test]
async fn opus_goes_through_ffmpeg() {
    assert!(
        gpuhost::process::find_program("ffmpeg").is_some(),
        "ffmpeg must be installed for this test (.ci/run installs it)"
    );
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    let body = std::fs::read(fixture("audio/tone.opus")).unwrap();
    check(&host, body, "ffmpeg", 1.5).await;
    host.stop().await;
}

#[tokio::test]
async fn ffmpeg_reads_no_playlists_and_counts_only_the_samples() {
    let config = format!("[pipeline]\nstages = [\"w\"]\n{}", fake_worker("w", ""));
    let host = TestHost::start(&config).await.ready().await;
    // A playlist naming an audio file on the server (or a live one, reloaded without end).
    let playlist = format!(
        "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2,\n{}\n#EXT-X-ENDLIST\n",
        fixture("audio/tone.mp3").display()
    );
    let refused = host.post_body("/transcribe", playlist.into_bytes()).await;
    assert_eq!(refused.status(), 415);
    let err: serde_json::Value = refused.json().await.unwrap();
    assert!(
        err["message"].as_str().unwrap().contains("playlists"),
        "{err}"
    );
    // A WAV with an empty data chunk: ffmpeg's output is a header and no samples (its header
    // is 78 bytes, not 44: nothing of it counts as audio).
    let mut empty = wav(0.5, 44100, 2);
    empty.truncate(44);
    empty[40..44].copy_from_slice(&0u32.to_le_bytes());
    let refused = host.post_body("/transcribe", empty).await;
    assert_eq!(refused.status(), 415);
    // The same with no data at all, as a recorder stopped at once writes it: empty, not corrupt
    // (it said "no audio could be decoded (0 corrupt packets)").
    let mut bare = wav(0.5, 44100, 2);
    bare.truncate(44);
    bare[4..8].copy_from_slice(&36u32.to_le_bytes());
    bare[40..44].copy_from_slice(&0u32.to_le_bytes());
    let refused = host.post_body("/transcribe", bare).await;
    assert_eq!(refused.status(), 415);
    let err: serde_json::Value = refused.json().await.unwrap();
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("empty") && !message.contains("corrupt"),
        "{err}"
    );
    // A Sun AU file (ffmpeg's, not symphonia's) declaring 1 Hz: 20 KB would be 3 hours.
    let mut au = b".snd".to_vec();
    for field in [24u32, 20_000, 3, 1, 1] {
        au.extend_from_slice(&field.to_be_bytes()); // offset, size, PCM16, 1 Hz, mono
    }
    au.resize(24 + 20_000, 0);
    let refused = host.post_body("/transcribe", au).await;
    assert_eq!(refused.status(), 415);
    let err: serde_json::Value = refused.json().await.unwrap();
    assert!(
        err["message"].as_str().unwrap().contains("times its size"),
        "{err}"
    );
    // A WAV streamed through a pipe: its header does not know the length (0xFFFFFFFF).
    let mut streamed = wav(1.5, 44100, 2);
    streamed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    streamed[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    let result = result_of(&host.transcribe("", streamed).await);
    let duration = result["duration"].as_f64().unwrap();
    assert!((duration - 1.5).abs() < 0.01, "{result}");
    host.stop().await;
}

/// `input` normalized to `out` as a job's upload is (60 s at most, the decode in a child, ffmpeg
/// from `PATH`).
async fn normalize(input: std::path::PathBuf, out: &std::path::Path) -> gpuhost::audio::AudioInfo {
    let decodes = tokio::sync::Semaphore::new(1);
    gpuhost::audio::normalize(
        gpuhost::audio::Source::File(input),
        out,
        60.0,
        Some(std::path::Path::new(env!("CARGO_BIN_EXE_gpuhost"))),
        "ffmpeg",
        &decodes,
        0,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn normalized_audio_is_16k_mono_pcm16() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.flac");
    std::fs::copy(fixture("audio/tone.flac"), &input).unwrap();
    let out = dir.path().join("out.wav");
    let info = normalize(input, &out).await;
    assert_eq!(
        (info.source_rate, info.source_channels),
        (Some(44100), Some(2))
    );
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(&bytes[0..4], b"RIFF");
    assert_eq!(u16::from_le_bytes([bytes[22], bytes[23]]), 1, "mono");
    assert_eq!(
        u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]),
        16000
    );
    assert_eq!(u16::from_le_bytes([bytes[34], bytes[35]]), 16, "16-bit");
    let samples = (bytes.len() - 44) / 2;
    assert!(
        (samples as i64 - 24000).abs() < 400,
        "{samples} samples for 1.5 s"
    );
}

#[tokio::test]
async fn a_decode_given_up_stops_and_frees_its_turn() {
    // In the `decode-audio` child (the child is killed) and in this process (the decoder stops
    // at its next packet).
    let child = std::path::Path::new(env!("CARGO_BIN_EXE_gpuhost"));
    for decoder in [Some(child), None] {
        decode_given_up(decoder).await;
    }
}

async fn decode_given_up(decoder: Option<&'static std::path::Path>) {
    // Half an hour of 8 kHz audio: decoded and resampled, not copied, so it takes a while.
    let input = wav(1800.0, 8000, 1);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.wav");
    let decodes = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
    let task = tokio::spawn({
        let (out, decodes) = (out.clone(), decodes.clone());
        async move {
            let source = gpuhost::audio::Source::Memory(input.into());
            gpuhost::audio::normalize(source, &out, 7200.0, decoder, "", &decodes, 0).await
        }
    });
    let size = || std::fs::metadata(&out).map_or(0, |m| m.len());
    wait_for("the decoder to write", Duration::from_secs(30), || {
        let started = size() > 0;
        async move { started }
    })
    .await;
    // The client leaves: the request's future, and so this one, is dropped.
    task.abort();
    let (mut last, mut still) = (0, 0);
    wait_for(
        "the decoder to stop writing",
        Duration::from_secs(30),
        || {
            let now = size();
            still = if now == last { still + 1 } else { 0 };
            last = now;
            let stopped = still >= 10; // 200 ms without a byte
            async move { stopped }
        },
    )
    .await;
    let full = 1800 * 16000 * 2;
    assert!(
        last < full / 2,
        "{decoder:?}: stopped at {last} of {full} bytes"
    );
    assert!(decodes.try_acquire().is_ok(), "the decode's turn is free");
}

#[tokio::test]
async fn a_phase_inverted_stereo_upload_is_not_silence() {
    // A 44.1 kHz stereo tone whose right channel is the left one inverted: the mean of the
    // channels is silence (an empty transcript), the speech is in either channel.
    let mut bytes = wav(1.0, 44100, 2);
    for frame in bytes[44..].chunks_mut(4) {
        let right = i16::from_le_bytes([frame[2], frame[3]]);
        frame[2..4].copy_from_slice(&(-right).to_le_bytes());
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.wav");
    std::fs::write(&input, bytes).unwrap();
    // The same through ffmpeg, which downmixes itself: WavPack (lossless), which symphonia
    // does not read.
    let packed = dir.path().join("in.wv");
    let made = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&input)
        .arg(&packed)
        .status()
        .expect("ffmpeg must be installed for this test (.ci/run installs it)");
    assert!(made.success());
    for (input, decoder) in [(input, "symphonia"), (packed, "ffmpeg")] {
        let out = dir.path().join("out.wav");
        let info = normalize(input, &out).await;
        assert_eq!(info.decoder, decoder);
        let samples: Vec<f64> = hound::WavReader::open(&out)
            .unwrap()
            .samples::<i16>()
            .map(|s| f64::from(s.unwrap()))
            .collect();
        let rms = (samples.iter().map(|x| x * x).sum::<f64>() / samples.len() as f64).sqrt();
        // The tone's amplitude is 12000: RMS about 8500.
        assert!(rms > 7000.0, "{decoder}: rms {rms}");
        assert!(
            samples.len().abs_diff(16000) < 200,
            "{decoder}: {}",
            samples.len()
        );
        // ffmpeg's second output is gone.
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            3,
            "{decoder}"
        );
    }
}
