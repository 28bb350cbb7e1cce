"""`[workers.asr] engine = "moonshine"` end to end through a real `gpuhost serve`: Moonshine base-en
(converted from the `moonshine-cpp` wheel at setup) transcribes, the aligner times its words (the
model has none of its own), and another language is refused up front, naming the model. Its
quality is judged on real recordings (benches/quality.py --asr=moonshine); espeak-ng voices,
which it hears worse than real ones, only check that the path works."""

import json
import urllib.error

import harness
import metrics
import pytest


@pytest.fixture(scope="module")
def server():
    s = harness.Server(engines={"asr": "moonshine"})
    yield s
    s.stop()


def test_moonshine_transcribes_and_the_aligner_times_its_words(server):
    with server.request("/workers") as r:
        asr = next(w for w in json.load(r)["workers"] if w["name"] == "asr")
    assert "moonshine" in json.dumps(asr["loaded"]), asr
    folder, _ = harness.eval_set()
    truth = json.loads((folder / "interview.json").read_text())
    events, _ = server.transcribe(folder / "interview.wav")
    assert events[-1]["type"] == "result", events[-1]
    result = events[-1]["result"]
    assert metrics.wer(truth, result) <= 0.25, result["text"]
    words = [w for s in result["segments"] for w in s["words"]]
    assert all(a["start"] <= b["start"] for a, b in zip(words, words[1:]))
    # The aligner placed the words: their boundaries are near the true ones, which the model's
    # own (spread over each stretch) are not.
    errors = metrics.boundary_errors(truth["words"], result)
    assert errors and sorted(errors)[len(errors) // 2] <= 0.08, sorted(errors)[len(errors) // 2]


def test_another_language_is_refused_naming_the_model(server):
    folder, _ = harness.eval_set()
    with pytest.raises(urllib.error.HTTPError) as error:
        server.request("/transcribe?language=ko", (folder / "interview.wav").read_bytes())
    assert error.value.code == 400
    body = json.loads(error.value.read())
    assert "moonshine" in body["message"], body
