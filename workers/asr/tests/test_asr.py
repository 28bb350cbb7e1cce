import json

import pytest

from conftest import start_worker
from gpuhost_asr.engine import AsrSettings, Transcriber


@pytest.fixture(scope="module")
def transcriber():
    return Transcriber(AsrSettings())


def test_bundled_model_transcribes_offline_with_word_times(transcriber, speech_wav):
    seen = []
    result = transcriber.transcribe(speech_wav, on_segment=lambda s, d: seen.append(s))
    text = " ".join(s["text"] for s in result["segments"]).lower()
    assert "hello world" in text and "test" in text, text
    assert result["language"] == "en"
    words = [w for s in result["segments"] for w in s["words"]]
    assert len(words) >= 8
    assert all(0 <= w["start"] <= w["end"] <= result["duration"] + 0.5 for w in words)
    assert seen == result["segments"], "segments are reported as they decode"


def test_english_only_model_refuses_other_languages(transcriber, speech_wav):
    with pytest.raises(ValueError, match="English-only"):
        transcriber.transcribe(speech_wav, language="de")


def test_settings_validate_engine_and_options():
    assert AsrSettings.from_options("cuda", {}).compute_type == "float16"
    with pytest.raises(ValueError, match="unknown ASR options"):
        AsrSettings.from_options("cpu", {"beam": 3})
    with pytest.raises(ValueError, match="unknown ASR engine"):
        AsrSettings.from_options("tpu", {})


def test_protocol_streams_partial_segments(tmp_path, speech_wav):
    proc = start_worker("gpuhost_asr")
    out = tmp_path / "r.json"
    job = {"audio_path": speech_wav, "_output_path": str(out)}
    stdout, stderr = proc.communicate(json.dumps(job) + "\n", timeout=300)
    lines = stdout.splitlines()
    ready = json.loads(lines[0].split(" ", 1)[1])
    assert ready["protocol"] == 1 and "tiny.en" in ready["model"] and ready["device"] == "cpu/int8"
    assert lines[1:] == ["done"], stderr
    events = [json.loads(l[len("@gpuhost "):]) for l in stderr.splitlines() if l.startswith("@gpuhost ")]
    assert any(e["event"] == "progress" and "text" in e.get("partial", {}) for e in events)
    assert "hello" in json.loads(out.read_text())["segments"][0]["text"].lower()
