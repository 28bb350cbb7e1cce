import shutil
import subprocess

import numpy as np
import pytest
from gpuhost_diarizer import models, overlap
from gpuhost_diarizer.engine import load, read_wav
from gpuhost_diarizer.overlap import OverlapDiarizer


def test_the_carved_models_match_their_pinned_sha256():
    for name, (_, length, _) in models.BLOBS.items():
        blob = models.carve(name)
        assert len(blob) == length and blob[4:8] == b"ORTM"


def test_a_different_wheel_is_refused_with_what_to_do(tmp_path):
    changed = tmp_path / "libmoonshine.so"
    shutil.copy(models.library(), changed)
    offset = models.BLOBS["embedding"][0]
    with open(changed, "r+b") as f:
        f.seek(offset + 4096)
        f.write(b"\xff" * 16)
    with pytest.raises(models.ModelError) as error:
        models.carve("embedding", changed)
    message = str(error.value)
    assert "does not match the pinned sha256" in message
    assert "gpuhost setup --force diarizer" in message
    models.carve("segmentation", changed)  # the untouched model still carves


def test_prepare_caches_the_models_where_loading_finds_them(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHOST_DIARIZER_MODELS", str(tmp_path))
    models.prepare()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embedding.ort", "segmentation.ort"]
    assert models.model_bytes("segmentation") == (tmp_path / "segmentation.ort").read_bytes()
    # A damaged cache is not trusted: the model is carved again from the wheel.
    (tmp_path / "embedding.ort").write_bytes(b"junk")
    assert models.model_bytes("embedding") == models.carve("embedding")


def _say(d, i, voice, pitch, text):
    raw, out = d / f"{i}.wav", d / f"{i}t.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-p", pitch, "-w", str(raw), text], check=True)
    subprocess.run(
        ["sox", str(raw), "-r", "16000", "-b", "16", "-c", "1", str(out)]
        + ["silence", "1", "0.01", "1%", "reverse", "silence", "1", "0.01", "1%", "reverse"],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def crosstalk(tmp_path_factory):
    """A high and a low voice, each speaking twice; the low voice's first line starts a second
    before the high one ends. Returns (wav, start and end of the overlap in seconds)."""
    d = tmp_path_factory.mktemp("crosstalk")
    lines = [
        ("en-us+f3", "70", "the weather is lovely today and the sun is out over the hills"),
        ("en-gb+m1", "20", "i would rather stay inside and read a long book by the fire"),
        ("en-us+f3", "70", "then i will walk to the park on my own this afternoon"),
        ("en-gb+m1", "20", "enjoy the walk and bring back some coffee for both of us"),
    ]
    parts = [_say(d, i, *line) for i, line in enumerate(lines)]
    audio = [read_wav(str(p)) for p in parts]
    starts, t = [], 0.5
    for i, a in enumerate(audio):
        starts.append(t)
        t += len(a) / 16000 + (-1.0 if i == 0 else 0.4)
    total = np.zeros(int((t + 0.5) * 16000), dtype=np.float32)
    for s, a in zip(starts, audio):
        i = int(s * 16000)
        total[i : i + len(a)] += a
    path = d / "crosstalk.wav"
    pcm = (np.clip(total, -1, 1) * 32767).astype("<i2").tobytes()
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm)
    return str(path), (starts[1], starts[0] + len(audio[0]) / 16000)


@pytest.fixture(scope="module")
def engine():
    return OverlapDiarizer()


def test_two_voices_with_crosstalk_give_two_speakers_and_the_overlap(engine, crosstalk):
    path, (a, b) = crosstalk
    result = engine.diarize(read_wav(path), num_speakers=2)
    assert result["speakers"] == ["SPEAKER_00", "SPEAKER_01"], result
    first = [t for t in result["turns"] if t["start"] < a - 0.5]
    assert first and {t["speaker"] for t in first} == {"SPEAKER_00"}, result["turns"]
    # The overlapped second is labelled as such, and nowhere far from it.
    assert result["overlaps"], result
    covered = sum(min(e, b) - max(s, a) for s, e in result["overlaps"] if e > a and s < b)
    assert covered >= 0.4 * (b - a), (result["overlaps"], a, b)
    assert all(s > a - 1.5 and e < b + 1.5 for s, e in result["overlaps"]), result["overlaps"]


def test_the_speaker_count_is_honoured(engine, crosstalk):
    audio = read_wav(crosstalk[0])
    assert engine.diarize(audio, num_speakers=1)["speakers"] == ["SPEAKER_00"]
    assert len(engine.diarize(audio, max_speakers=1)["speakers"]) == 1
    assert len(engine.diarize(audio, min_speakers=2)["speakers"]) >= 2


def test_silence_gives_no_turns(engine):
    result = engine.diarize(np.zeros(16000 * 12, dtype=np.float32))
    assert result["turns"] == [] and result["speakers"] == [] and result["overlaps"] == []


def test_the_engine_is_chosen_by_name():
    engine = load("overlap", {"step_s": "5", "threshold": "1.0"})
    assert engine.device == "cpu" and engine.threshold == 1.0
    with pytest.raises(ValueError, match="overlap"):
        load("nonsense", {})
    with pytest.raises(ValueError, match="change_threshold"):
        load("vad-dvector", {"thresold": 0.4})
    # The default engine's options, not the old default's: a config written for `vad-dvector`
    # without an `engine` line is refused with what to do, not run with a meaningless threshold.
    for old in ({"threshold": 0.42, "change_threshold": 1.1}, {"threshold": 0.42}):
        with pytest.raises(ValueError, match='engine = "vad-dvector"'):
            load("overlap", old)


def test_cuda_without_a_cuda_runtime_is_refused_not_silently_cpu():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this venv has CUDA")
    with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
        load("overlap", {"device": "cuda"})


def test_cuda_sessions_choose_convolutions_by_heuristic():
    # Measured on an H200: cuDNN's exhaustive search per new input length made the diarizer
    # 3-4x slower than the CPU it was meant to beat, on the meeting clips.
    from gpuhost_diarizer.resnet import with_options

    assert with_options(["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        ("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}),
        "CPUExecutionProvider",
    ]
    assert with_options(None) == ["CPUExecutionProvider"]


def test_the_embedding_in_onnx_format_is_the_same_model():
    from gpuhost_diarizer.resnet import as_onnx, session

    blob = models.model_bytes("embedding")
    converted = as_onnx(blob)
    assert converted[4:8] != b"ORTM" and as_onnx(converted) is converted
    fbank = np.random.default_rng(0).standard_normal((200, 80)).astype(np.float32)
    feeds = {"fbank": fbank[None], "weights": np.ones((1, 200), dtype=np.float32)}
    a = session(blob, 1).run(None, feeds)[0][0]
    b = session(converted, 1).run(None, feeds)[0][0]
    assert np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) > 0.9999


def _local(seconds_by_window):
    """A Local where window w has local speakers with these seconds; the embeddings of the first
    half and the second half of them are alike (cosine 0.8: one voice to the clustering)."""
    from gpuhost_diarizer.overlap import FRAMES, Local

    owners, seconds = [], []
    for w, secs in enumerate(seconds_by_window):
        for s, sec in enumerate(secs):
            owners.append((w, s))
            seconds.append(sec)
    seg = np.zeros((len(seconds_by_window), FRAMES, 3), dtype=np.float32)
    for w, s in owners:
        seg[w, 100 * s : 100 * s + 200, s] = 1
    a, b = np.zeros(256, dtype=np.float32), np.zeros(256, dtype=np.float32)
    a[0], b[0], b[1] = 1, 0.8, 0.6
    half = (len(owners) + 1) // 2
    return Local(
        starts=[w * 148 for w in range(len(seconds_by_window))],
        seg=seg,
        owners=owners,
        embeddings=np.array([a] * half + [b] * (len(owners) - half)),
        seconds=np.array(seconds),
        frames=len(seconds_by_window) * 148 + FRAMES,
    )


def test_two_long_speakers_of_one_window_are_two_people_even_when_they_sound_alike():
    from gpuhost_diarizer.overlap import THRESHOLD, cluster

    two = [[3.0], [2.5, 2.5], [2.5, 2.5], [3.0]]
    labels, centroids = cluster(_local(two), THRESHOLD)
    assert len(centroids) == 2 and labels[1] != labels[2], labels
    # A short second speaker is not enough to split one voice, nor is one window alone.
    for one in ([[3.0], [2.5, 0.5], [2.5, 0.5], [3.0]], [[3.0], [2.5, 2.5], [3.0], [3.0]]):
        labels, centroids = cluster(_local(one), THRESHOLD)
        assert len(centroids) == 1, (one, labels)
    # A smaller `min_speakers` does not lift the floor; an explicit count still wins.
    assert len(cluster(_local(two), THRESHOLD, min_speakers=1)[1]) == 2
    assert len(cluster(_local(two), THRESHOLD, num_speakers=1)[1]) == 1


def test_short_pauses_stay_inside_a_turn():
    from gpuhost_diarizer.overlap import _fill

    row = np.array([0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0], dtype=bool)
    _fill(row, 2, np.zeros(12, dtype=int))
    assert row.astype(int).tolist() == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    # Someone else answering in the pause keeps it a pause.
    row = np.array([0, 1, 1, 0, 0, 1, 0], dtype=bool)
    _fill(row, 2, np.array([0, 0, 0, 0, 1, 0, 0]))
    assert row.astype(int).tolist() == [0, 1, 1, 0, 0, 1, 0]


def test_a_speaker_heard_for_a_frame_or_two_is_no_turn():
    from gpuhost_diarizer.overlap import _drop_short

    row = np.array([1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 1], dtype=bool)
    _drop_short(row, 3)
    assert row.astype(int).tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_more_speakers_asked_for_than_talk_give_no_sliver_turns(engine, crosstalk):
    result = engine.diarize(read_wav(crosstalk[0]), num_speakers=4)
    short = [t for t in result["turns"] if t["end"] - t["start"] < 0.1]
    assert not short, result["turns"]


def test_a_stretch_several_windows_see_is_embedded_once(engine, crosstalk, monkeypatch):
    audio = np.tile(read_wav(crosstalk[0]), 2)  # ~30 s: windows overlap by three quarters
    calls = []
    real = engine.embedder.embed

    def counting(fbank, weights):
        calls.append(1)
        return real(fbank, weights)

    monkeypatch.setattr(engine.embedder, "embed", counting)
    reused = engine.local(audio)
    with_reuse = len(calls)
    monkeypatch.setattr(overlap, "REUSE_DIFFER", -1.0)  # nothing is ever close enough
    calls.clear()
    fresh = engine.local(audio)
    assert reused.owners == fresh.owners
    assert with_reuse < len(calls) == len(fresh.owners), (with_reuse, len(calls))
    # What a window got from an earlier one is the same voice as what it would have computed
    # itself (here one voice's views score 0.7-1.0 against each other, the other voice 0.1-0.2).
    cosines = np.sum(reused.embeddings * fresh.embeddings, axis=1)
    assert cosines.min() >= 0.8, cosines


def test_speech_to_the_last_sample_ends_with_the_recording(engine, crosstalk):
    # The frame grid is rounded up: a turn that runs to the end ended up to 60 ms past it.
    path, _ = crosstalk
    audio = read_wav(path)
    cut = audio[: int(2.0 * 16000)]  # the first voice, mid-sentence
    result = engine.diarize(cut)
    assert result["turns"], result
    assert all(0 <= t["start"] < t["end"] <= 2.0 for t in result["turns"]), result["turns"]
    assert all(0 <= s < e <= 2.0 for s, e in result["overlaps"]), result["overlaps"]


def test_more_local_speakers_than_clusters_keep_the_main_one():
    """One voice the segmentation split in two in a short clip (3.4 s and a 0.7 s edge): with one
    cluster, the long one must not be dropped because the short one scores closer to it."""
    from gpuhost_diarizer.overlap_clusters import _assign

    local = _local([[3.4, 0.7]])
    a, b = local.embeddings
    assert float(b @ b) > float(a @ b)  # the short one is the closer to a centroid at b
    centroid = b / np.linalg.norm(b)
    assert _assign(local, centroid[None, :]).tolist() == [0, 0]
    # With as many clusters as local speakers, each still gets its own.
    far = np.zeros(256, dtype=np.float32)
    far[2] = 1
    assert sorted(_assign(local, np.array([centroid, far])).tolist()) == [0, 1]
