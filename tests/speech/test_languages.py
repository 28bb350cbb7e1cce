"""Languages beyond English, end to end through a real `gpuhost serve` whose ASR worker runs the
multilingual base model (`engine = "base"`): the asked-for language is transcribed, a missing one
is detected, the aligner (English only) leaves the ASR's word times in place, a code no model
knows is refused before it queues, and `/v1/audio/translations` gives English. Synthesized speech (espeak-ng) only checks the routing;
quality is judged on real recordings (benches/quality.py)."""

import json
import subprocess
import urllib.error

import harness
import pytest

GERMAN = "Guten Morgen, heute ist das Wetter sehr schön und wir gehen zusammen in den Park."


@pytest.fixture(scope="module")
def server():
    s = harness.Server(engines={"asr": "base"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def german(tmp_path_factory):
    wav = tmp_path_factory.mktemp("de") / "de.wav"
    subprocess.run(["espeak-ng", "-v", "de", "-w", str(wav), GERMAN], check=True)
    return wav


def result_of(events):
    assert events[-1]["type"] == "result", events[-1]
    return events[-1]["result"]


def test_the_asked_for_language_is_transcribed_with_word_times(server, german):
    events, _ = server.transcribe(german, "?language=de")
    result = result_of(events)
    assert result["language"] == "de"
    assert "morgen" in result["text"].lower() and "park" in result["text"].lower(), result["text"]
    words = [w for s in result["segments"] for w in s["words"]]
    assert len(words) >= 10
    assert all(0 <= w["start"] <= w["end"] <= result["duration"] + 0.5 for w in words)
    # The aligner (English only) left the ASR's times: its confidence stands as each word's score.
    assert all(w["score"] > 0 for w in words), words


def test_the_language_is_detected_when_not_given(server, german):
    result = result_of(server.transcribe(german)[0])
    assert result["language"] == "de"
    assert "morgen" in result["text"].lower()


def test_a_language_no_model_knows_is_refused_up_front(server, german):
    with pytest.raises(urllib.error.HTTPError) as error:
        server.request("/transcribe?language=xx", german.read_bytes())
    assert error.value.code == 400
    body = json.loads(error.value.read())
    assert "`xx`" in body["message"] and "asr" in body["message"], body


def test_the_openai_client_translates_to_english(server, german):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token)
    with open(german, "rb") as f:
        text = client.audio.translations.create(model="whisper-1", file=f, response_format="text")
    text = str(text).lower()
    assert "morning" in text and "park" in text, text
    with open(german, "rb") as f:
        verbose = client.audio.translations.create(
            model="whisper-1", file=f, response_format="verbose_json"
        )
    # The output's language, as OpenAI documents it ("always `english`").
    assert verbose.language == "english" and "morning" in verbose.text.lower()
