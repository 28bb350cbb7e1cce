"""The server as it comes, with the default CPU engines: the overlap-aware diarizer through the
host. Its quality is measured on real recordings (benches/quality.py); here the synthetic meeting
checks that it runs end to end: segmentation finds the speech, the speaker count is honoured,
overlapped speech is reported."""

import json

import harness
import pytest


@pytest.fixture(scope="module")
def server():
    s = harness.Server()
    yield s
    s.stop()


def test_the_default_diarizer_is_overlap_aware(server):
    folder, _ = harness.eval_set()
    truth = json.loads((folder / "meeting.json").read_text())
    n = len(truth["speakers"])
    events, _ = server.transcribe(folder / "meeting.wav", f"?stages=diarizer&num_speakers={n}")
    assert events[-1]["type"] == "result", events[-1]
    diarized = events[-1]["result"]["stages"]["diarizer"]
    assert "overlap-aware" in diarized["engine"], diarized["engine"]
    assert len(diarized["speakers"]) == n, diarized["speakers"]
    assert isinstance(diarized["overlaps"], list)

    def covered(t):
        return any(x["start"] <= t <= x["end"] for x in diarized["turns"])

    # Every 10 ms of the true speech, away from turn edges: the segmentation found nearly all.
    frames = [
        turn["start"] + 0.25 + i * 0.01
        for turn in truth["turns"]
        for i in range(max(0, int((turn["end"] - turn["start"] - 0.5) / 0.01)))
    ]
    found = sum(covered(t) for t in frames) / len(frames)
    assert found >= 0.9, found
