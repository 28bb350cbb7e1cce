import json
import subprocess

import numpy as np
import pytest
from conftest import start_worker
from gpuhost_diarizer.cluster import cluster, cluster_segments, distances
from gpuhost_diarizer.engine import VadDvectorDiarizer, read_wav


@pytest.fixture(scope="module")
def two_speakers(tmp_path_factory):
    """A high female and a low male voice taking turns with short (0.25 s) pauses."""
    d = tmp_path_factory.mktemp("two")
    parts = []
    lines = [
        ("en-us+f3", "62", "the weather is lovely today and the sun is out"),
        ("en-gb+m1", "25", "i would rather stay inside and read a long book"),
        ("en-us+f3", "62", "then i will walk to the park on my own"),
        ("en-gb+m1", "25", "enjoy the walk and bring back some coffee"),
    ]
    for i, (voice, pitch, text) in enumerate(lines):
        raw = d / f"{i}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-p", pitch, "-w", str(raw), text], check=True)
        padded = d / f"{i}p.wav"
        subprocess.run(
            [
                "sox",
                str(raw),
                str(padded),
                "silence",
                "1",
                "0.01",
                "1%",
                "reverse",
                "silence",
                "1",
                "0.01",
                "1%",
                "reverse",
                "pad",
                "0",
                "0.25",
            ],
            check=True,
        )
        parts.append(str(padded))
    wav = d / "conv.wav"
    subprocess.run(
        ["sox", *parts, "-r", "16000", "-b", "16", "-c", "1", str(wav), "pad", "0.5", "0.5"],
        check=True,
    )
    return str(wav)


@pytest.fixture(scope="module")
def no_pause(tmp_path_factory):
    """The same two voices, each answering the other at once: one VAD region, three turns.
    Returns (wav path, the two change times in seconds)."""
    d = tmp_path_factory.mktemp("nopause")
    lines = [
        ("en-us+f3", "62", "did you finish the report for the meeting"),
        ("en-gb+m1", "25", "yes i sent it to everyone this morning"),
        ("en-us+f3", "62", "great thank you very much"),
    ]
    parts = []
    for i, (voice, pitch, text) in enumerate(lines):
        raw, trimmed = d / f"{i}.wav", d / f"{i}t.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-p", pitch, "-w", str(raw), text], check=True)
        subprocess.run(
            [
                "sox",
                str(raw),
                "-r",
                "16000",
                "-b",
                "16",
                "-c",
                "1",
                str(trimmed),
                "silence",
                "1",
                "0.01",
                "1%",
                "reverse",
                "silence",
                "1",
                "0.01",
                "1%",
                "reverse",
            ],
            check=True,
        )
        parts.append(trimmed)
    lengths = [
        float(
            subprocess.run(
                ["soxi", "-D", str(p)], capture_output=True, text=True, check=True
            ).stdout
        )
        for p in parts
    ]
    wav = d / "conv.wav"
    subprocess.run(["sox", *map(str, parts), str(wav), "pad", "0.5", "0.5"], check=True)
    return str(wav), [0.5 + lengths[0], 0.5 + lengths[0] + lengths[1]]


@pytest.fixture(scope="module")
def diarizer():
    return VadDvectorDiarizer()


def test_counts_two_speakers_and_alternates(diarizer, two_speakers):
    result = diarizer.diarize(read_wav(two_speakers))
    assert result["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
    labels = [t["speaker"] for t in result["turns"]]
    assert labels == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_00", "SPEAKER_01"], result["turns"]


def test_finds_speaker_changes_without_a_pause(diarizer, no_pause):
    wav, changes = no_pause
    result = diarizer.diarize(read_wav(wav))
    assert len(result["speech_regions"]) == 1, "no pause: VAD sees one region"
    assert [t["speaker"] for t in result["turns"]] == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_00"], (
        result["turns"]
    )
    found = [t["start"] for t in result["turns"][1:]]
    assert all(abs(f - c) <= 0.25 for f, c in zip(found, changes)), (found, changes)


def test_short_segments_join_a_speaker_instead_of_founding_one():
    # Two long segments per speaker decide the speakers; the short, odd one joins the nearer.
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal(256), rng.standard_normal(256)
    emb = np.array([a, a, b, b, a + 1.2 * rng.standard_normal(256)])
    f0 = np.log2(np.array([200, 201, 100, 99, 180.0]))
    lengths = np.array([3.0, 3.0, 3.0, 3.0, 0.6])
    labels = cluster_segments(distances(emb, f0), lengths)
    assert labels.tolist() == [0, 0, 1, 1, 0]
    assert len(set(cluster(distances(emb, f0)).tolist())) == 3, (
        "plain clustering would found a third"
    )


def test_speaker_bounds_are_honoured(diarizer, two_speakers):
    audio = read_wav(two_speakers)
    assert len(diarizer.diarize(audio, num_speakers=1)["speakers"]) == 1
    assert len(diarizer.diarize(audio, min_speakers=3)["speakers"]) == 3
    assert len(diarizer.diarize(audio, max_speakers=1)["speakers"]) == 1


def test_cluster_uses_pitch_to_split_similar_embeddings():
    rng = np.random.default_rng(1)
    base = rng.standard_normal(256)
    emb = np.array([base + 0.05 * rng.standard_normal(256) for _ in range(6)])
    f0 = np.log2(np.array([100, 102, 99, 200, 205, 198.0]))
    labels = cluster(distances(emb, f0))
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert cluster(distances(emb, f0), num=1).tolist() == [0] * 6


def test_silence_has_no_speakers(diarizer, tmp_path):
    assert diarizer.diarize(np.zeros(16000 * 3, dtype=np.float32))["turns"] == []


def test_protocol(tmp_path, two_speakers):
    proc = start_worker("gpuhost_diarizer")
    out = tmp_path / "r.json"
    task = {"audio_path": two_speakers, "num_speakers": 2, "_output_path": str(out)}
    stdout, stderr = proc.communicate(json.dumps(task) + "\n", timeout=120)
    assert stdout.splitlines()[-1] == "done", stderr
    assert json.loads(out.read_text())["speakers"] == ["SPEAKER_00", "SPEAKER_01"]
