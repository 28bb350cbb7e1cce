import json
import random
import signal
import string
import subprocess
import time

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
    # espeak's "hello" is sometimes heard as "the low" (tiny.en on this synthetic voice, once in
    # a CI run on a loaded machine, 2026-12-05; not reproduced alone, cause not pinned down);
    # the rest of the sentence holds either way.
    assert "world" in text and "test" in text and "worker" in text, text
    assert result["language"] == "en"
    assert "warnings" not in result, "English speech taken for another language"
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
    # A switch given as a string would read as true: refused, as are other wrong kinds.
    with pytest.raises(ValueError, match="temperature_fallback must be bool"):
        AsrSettings.from_options("cpu", {"temperature_fallback": "false"})
    with pytest.raises(ValueError, match="beam_size must be int"):
        AsrSettings.from_options("cpu", {"beam_size": 2.5})
    with pytest.raises(ValueError, match="log_prob_threshold must be float"):
        AsrSettings.from_options("cpu", {"log_prob_threshold": True})
    assert AsrSettings.from_options("cpu", {"log_prob_threshold": -2}).log_prob_threshold == -2
    assert AsrSettings.from_options("cpu", {"model": "/models/x"}).model == "/models/x"


def test_without_the_temperature_fallback_the_same_audio_reads_the_same(
    transcriber, speech_wav, tmp_path, monkeypatch
):
    # Said five times in one window, the text compresses too well: with the fallback, Whisper
    # decodes it again sampled, from generators that run on across requests.
    repeated = tmp_path / "repeated.wav"
    subprocess.run(["sox", speech_wav, str(repeated), "repeat", "4"], check=True)
    asked = []
    decode = transcriber.model.transcribe

    def recording(*args, **kwargs):
        asked.append(kwargs.get("temperature"))
        return decode(*args, **kwargs)

    monkeypatch.setattr(transcriber.model, "transcribe", recording)
    transcriber.transcribe(str(repeated))
    assert asked[0] == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0), "the fallback is on by default"
    monkeypatch.setattr(transcriber.settings, "temperature_fallback", False)
    texts = {
        " ".join(s["text"] for s in transcriber.transcribe(str(repeated))["segments"])
        for _ in range(3)
    }
    assert set(asked[1:]) == {0.0}, asked
    assert len(texts) == 1, texts


def test_protocol_streams_partial_segments(tmp_path, speech_wav):
    proc = start_worker("gpuhost_asr")
    out = tmp_path / "r.json"
    task = {"audio_path": speech_wav, "_output_path": str(out)}
    stdout, stderr = proc.communicate(json.dumps(task) + "\n", timeout=300)
    lines = stdout.splitlines()
    ready = json.loads(lines[0].split(" ", 1)[1])
    assert ready["protocol"] == 1 and "tiny.en" in ready["model"] and ready["device"] == "cpu/int8"
    assert lines[1:] == ["done"], stderr
    events = [
        json.loads(x[len("@gpuhost ") :]) for x in stderr.splitlines() if x.startswith("@gpuhost ")
    ]
    assert any(e["event"] == "progress" and "text" in e.get("partial", {}) for e in events)
    assert "world" in json.loads(out.read_text())["segments"][0]["text"].lower()


def test_sigint_abandons_a_long_transcription_and_the_model_stays(tmp_path, speech_wav):
    # A minute of speech: several segments, so the decoder returns to Python between them.
    long_wav = tmp_path / "long.wav"
    subprocess.run(["sox", speech_wav, str(long_wav), "repeat", "20"], check=True)
    proc = start_worker("gpuhost_asr")
    assert json.loads(proc.stdout.readline().split(" ", 1)[1])["cancel"] is True
    out = tmp_path / "r.json"
    proc.stdin.write(json.dumps({"audio_path": str(long_wav), "_output_path": str(out)}) + "\n")
    proc.stdin.flush()
    while True:  # until the first segment is out
        line = proc.stderr.readline()
        assert line, "worker exited"
        if (
            line.startswith("@gpuhost ")
            and json.loads(line[len("@gpuhost ") :])["event"] == "progress"
        ):
            break
    started = time.time()
    proc.send_signal(signal.SIGINT)
    line = proc.stdout.readline()
    assert line.startswith("error ") and json.loads(line[6:])["kind"] == "cancelled", line
    assert time.time() - started < 5
    assert not out.exists()
    proc.stdin.write(json.dumps({"audio_path": speech_wav, "_output_path": str(out)}) + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    assert "world" in json.loads(out.read_text())["segments"][0]["text"].lower()
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def test_words_written_without_a_space_are_marked_joined():
    from types import SimpleNamespace

    from gpuhost_asr.engine import words_of

    raw = [(" ill", 0.0, 0.2), ("-disposed", 0.2, 0.5), (" ", 0.5, 0.5), (" n", 0.6, 0.7)]
    raw += [("'êtes", 0.7, 0.9), ("我", 1.0, 1.1)]
    words = words_of([SimpleNamespace(word=w, start=s, end=e, probability=0.9) for w, s, e in raw])
    assert [(w["word"], w.get("joined", False)) for w in words] == [
        ("ill", False),
        ("-disposed", True),
        ("n", False),
        ("'êtes", True),
        ("我", True),
    ]
    # The first word of a segment is never joined, whatever Whisper wrote before it.
    assert "joined" not in words_of([SimpleNamespace(word="我", start=0, end=1, probability=1)])[0]


def test_a_long_prompt_keeps_only_the_end_whisper_can_use():
    from gpuhost_asr.engine import PROMPT_CHARS, prompt_tail

    assert prompt_tail(None) is None and prompt_tail("Kim, Park") == "Kim, Park"
    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 9)))  # noqa: E731
    names = " ".join(f"N{word()}" for i in range(2000))
    tail = prompt_tail(names)
    assert len(tail) <= PROMPT_CHARS and names.endswith(tail) and tail.startswith("N")
    # No word start to cut at: the last characters (the tokenizer took 10 s on all 8 KB).
    letters = "".join(word() for _ in range(2000))
    assert prompt_tail(letters) == letters[-PROMPT_CHARS:]


def test_a_prompt_that_repeats_itself_is_left_out(capsys):
    from gpuhost_asr.engine import prompt_tail

    # Whisper repeats such a prompt instead of transcribing (223 x "word" for 6 s of speech).
    assert prompt_tail("word " * 50) is None
    assert prompt_tail("The quick brown fox. " * 380) is None
    assert "repeats itself" in capsys.readouterr().err
    glossary = "Kim Ji-won, Park Min-su, gpuhost, pyannote, Whisper, ComfyUI, 김민수, 회의록"
    assert prompt_tail(glossary) == glossary


def test_a_prompt_left_out_is_said_in_the_results_warnings(transcriber, speech_wav):
    # Only a log line said so: clients of `?format=`, `/v1` and the CLI never saw it.
    result = transcriber.transcribe(str(speech_wav), prompt="Alice " * 30)
    assert any("the prompt repeats itself" in w for w in result.get("warnings", [])), result
    kept = transcriber.transcribe(str(speech_wav), prompt="Alice, Bob")
    assert not any("repeats itself" in w for w in kept.get("warnings", [])), kept


def test_a_few_milliseconds_of_speech_are_no_error(transcriber):
    # 10 ms of espeak-ng speech (cut at 0.2 s from "Hello, this is a test", 16 kHz) made
    # faster-whisper's word alignment fail on its one mel frame (IndexError).
    from pathlib import Path

    clip = Path(__file__).with_name("ten_ms_of_speech.wav")
    result = transcriber.transcribe(str(clip))
    assert result["duration"] == 0.01 and result["segments"] == [], result
