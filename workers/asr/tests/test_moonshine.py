import json

import numpy as np
import pytest
from conftest import start_worker
from gpuhost_asr import moonshine_model
from gpuhost_asr.engine import AsrSettings
from gpuhost_asr.moonshine import MoonshineTranscriber, spread, unrepeated, words_of


@pytest.fixture(scope="module")
def moon():
    return MoonshineTranscriber(AsrSettings.from_options("moonshine", {}))


def test_moonshine_transcribes_with_words_spread_over_their_segment(moon, speech_wav):
    seen = []
    result = moon.transcribe(speech_wav, on_segment=lambda s, d: seen.append(s))
    text = " ".join(s["text"] for s in result["segments"]).lower()
    # espeak's "hello" comes out as "the low" (the model is made for real voices); the rest holds.
    assert "world" in text and "test" in text and "speech worker" in text, text
    assert result["language"] == "en" and "moonshine" in result["model"]
    for seg in result["segments"]:
        words = seg["words"]
        assert words and words[0]["start"] == seg["start"]
        assert all(a["end"] <= b["start"] for a, b in zip(words, words[1:]))
        assert words[-1]["end"] <= seg["end"] <= result["duration"]
        assert all(0 < w["probability"] <= 1 for w in words)
    assert seen == result["segments"]


def test_silence_gives_no_segments_and_other_languages_are_refused(moon, tmp_path, speech_wav):
    import wave

    quiet = tmp_path / "quiet.wav"
    with wave.open(str(quiet), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(np.zeros(16000 * 3, np.int16).tobytes())
    assert moon.transcribe(str(quiet))["segments"] == []
    with pytest.raises(ValueError, match="English-only"):
        moon.transcribe(speech_wav, language="ko")
    with pytest.raises(ValueError, match="cannot translate"):
        moon.transcribe(speech_wav, translate=True)


def test_decoding_stops_at_the_token_limit(moon):
    # Noise has no end of speech the model is sure of; the limit bounds it either way.
    noise = np.random.default_rng(0).normal(0, 0.3, 16000 * 2).astype(np.float32)
    ids, probs, ended = moon.decode(noise, limit=3)
    assert len(probs) == len(ids) and (ended or len(ids) == 3) and len(ids) <= 3
    assert all(2 < i < len(moon.pieces) for i in ids), "only text pieces"


def test_pieces_make_words_and_words_share_their_time():
    pieces = [b"<unk>", b"<s>", b"</s>", "\u2581hel".encode(), b"lo", b",", "\u2581w".encode()]
    assert words_of(pieces, [3, 4, 5, 6], [0.5, 1.0, 1.0, 0.25]) == [
        ("hello,", pytest.approx(2.5 / 3)),
        ("w", 0.25),
    ]
    words = spread([("aaa", 1.0), ("b", 1.0)], 1.0, 2.0)
    assert [(w["start"], w["end"]) for w in words] == [(1.0, 1.5), (1.667, 1.833)]


def test_the_wheel_files_are_checked_and_a_changed_one_is_refused(tmp_path):
    source = tmp_path / "base-en"
    source.mkdir()
    real = moonshine_model.wheel_dir()
    for name in moonshine_model.FILES:
        (source / name).write_bytes((real / name).read_bytes())
    assert moonshine_model.checked(source) == source
    (source / "tokenizer.bin").write_bytes(b"not the tokenizer")
    with pytest.raises(moonshine_model.ModelError, match=r"pinned sha256.*--force asr"):
        moonshine_model.prepare(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_conversion_folds_the_int8_weights_into_floats(tmp_path):
    import onnx

    folder = moonshine_model.prepare(folder=tmp_path / "converted")
    encoder = onnx.load(str(folder / "encoder.onnx"))
    kinds = {i.data_type for i in encoder.graph.initializer}
    assert onnx.TensorProto.INT8 not in kinds and onnx.TensorProto.FLOAT in kinds
    assert not any(
        n.op_type == "Cast" and n.input[0] in {i.name for i in encoder.graph.initializer}
        for n in encoder.graph.node
    )
    assert (folder / "tokenizer.bin").read_bytes() == (
        moonshine_model.wheel_dir() / "tokenizer.bin"
    ).read_bytes()
    assert (folder / "SOURCE").read_text() == moonshine_model.stamp()
    assert sorted(p.name for p in folder.iterdir()) == [
        "SOURCE",
        "decoder.onnx",
        "encoder.onnx",
        "tokenizer.bin",
    ], "no temp files left"


def test_a_conversion_cut_short_or_for_another_wheel_is_done_again(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHOST_ASR_MODELS", str(tmp_path))
    folder = moonshine_model.model_dir()
    folder.mkdir(parents=True)
    for name in ("encoder.onnx", "decoder.onnx", "tokenizer.bin"):
        (folder / name).write_bytes(b"cut short")
    (folder / "SOURCE").write_text("moonshine-cpp==0.1.3 models/base-en\n")
    assert moonshine_model.model_files() == folder
    assert (folder / "SOURCE").read_text() == moonshine_model.stamp()
    assert (folder / "tokenizer.bin").read_bytes() != b"cut short"


def test_repeats_are_kept_unless_the_decoding_ran_on(moon, speech_wav, monkeypatch):
    ids = [moon.pieces.index(w.encode()) for w in ("\u2581one", "\u2581two", "\u2581three")]
    said = ids * 2

    def text(ended):
        monkeypatch.setattr(moon, "decode", lambda audio: (said, [0.9] * len(said), ended))
        return " ".join(s["text"] for s in moon.transcribe(speech_wav)["segments"])

    assert text(True) == "one two three one two three"  # the model ended it: said twice
    assert text(False) == "one two three"  # ran into the token limit: a run-on


def test_worker_serves_the_moonshine_engine(tmp_path, speech_wav):
    proc = start_worker("gpuhost_asr", env={"GPUHOST_ENGINE": "moonshine"})
    out = tmp_path / "r.json"
    task = {"audio_path": speech_wav, "_output_path": str(out)}
    stdout, stderr = proc.communicate(json.dumps(task) + "\n", timeout=300)
    lines = stdout.splitlines()
    ready = json.loads(lines[0].split(" ", 1)[1])
    assert "moonshine" in ready["model"] and ready["languages"] == ["en"], stderr
    assert ready["translate"] is False
    assert lines[1:] == ["done"], stderr
    assert "speech worker" in json.loads(out.read_text())["segments"][-1]["text"].lower()


def test_a_phrase_said_again_at_the_end_is_dropped_and_short_repeats_kept():
    def said(text):
        return [(w, 0.9) for w in text.split()]

    def text(words):
        return " ".join(w for w, _ in words)

    doubled = said("The north wind and the sun, the north wind and the sun")
    assert text(unrepeated(doubled)) == "The north wind and the sun,"
    assert text(unrepeated(said("a b c a b c a b c"))) == "a b c"
    for kept in ("word word word word word", "thank you thank you", "the sun and the sun rose"):
        assert text(unrepeated(said(kept))) == kept
