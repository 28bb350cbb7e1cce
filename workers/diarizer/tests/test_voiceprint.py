import json
import subprocess

import numpy as np
import pytest
from conftest import start_worker
from gpuhost_diarizer import voiceprint
from gpuhost_diarizer.engine import VadDvectorDiarizer, read_wav
from gpuhost_diarizer.resnet import SpeakerEmbedder

HIGH = ("en-us+f3", "62")
LOW = ("en-gb+m1", "25")


def _say(d, name, voice, text, pad=0.3):
    raw, out = d / f"{name}.raw.wav", d / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice[0], "-p", voice[1], "-w", str(raw), text], check=True)
    subprocess.run(
        ["sox", str(raw), "-r", "16000", "-b", "16", "-c", "1", str(out), "pad", "0", str(pad)],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
    """Enrolment clips of two voices, and a conversation of them saying other things."""
    d = tmp_path_factory.mktemp("voices")
    high = _say(d, "high", HIGH, "the quick brown fox jumps over the lazy dog into the forest")
    low = _say(d, "low", LOW, "we should plan the trip to the mountains before the winter")
    lines = [
        (HIGH, "did you finish the report for the meeting on friday"),
        (LOW, "yes i sent it to everyone early this morning"),
        (HIGH, "great then we can talk about the budget next week"),
        (LOW, "fine by me and i will bring the numbers with me"),
    ]
    parts = [_say(d, f"line{i}", voice, text) for i, (voice, text) in enumerate(lines)]
    conversation = d / "conversation.wav"
    subprocess.run(["sox", *map(str, parts), str(conversation), "pad", "0.5", "0.5"], check=True)
    return {"high": str(high), "low": str(low), "conversation": str(conversation)}


@pytest.fixture(scope="module")
def embedder():
    return SpeakerEmbedder()


def test_a_voiceprint_is_a_unit_vector_and_knows_its_voice(embedder, voices):
    high = voiceprint.enroll(embedder, read_wav(voices["high"]), None)
    low = voiceprint.enroll(embedder, read_wav(voices["low"]), None)
    assert len(high["vector"]) == 256 and high["seconds"] > 2
    assert abs(np.linalg.norm(high["vector"]) - 1) < 1e-3
    assert np.dot(high["vector"], low["vector"]) < voiceprint.THRESHOLD


def test_too_little_speech_is_refused_with_what_to_give(embedder, voices):
    audio = read_wav(voices["high"])
    with pytest.raises(voiceprint.EnrollError, match="at least 2 s"):
        voiceprint.enroll(embedder, audio, [(0.0, 1.2)])
    with pytest.raises(voiceprint.EnrollError):
        voiceprint.enroll(embedder, audio, [])  # no spans is no speech, not all of it
    # Speech in short phrases counts in full (only the first phrase counted: "only 0.8 s").
    phrases = voiceprint.enroll(embedder, audio, [(0.0, 0.8), (1.0, 1.8), (2.0, 2.8)])
    assert phrases["seconds"] == pytest.approx(2.4, abs=0.01)
    whole = voiceprint.enroll(embedder, audio, None)
    assert np.dot(phrases["vector"], whole["vector"]) > 0.8


def test_enrolled_voices_name_their_speakers_and_the_rest_keep_theirs(embedder, voices):
    audio = read_wav(voices["conversation"])
    result = VadDvectorDiarizer().diarize(audio, num_speakers=2)
    first = result["turns"][0]["speaker"]
    prints = [
        {"name": "Alice", **voiceprint.enroll(embedder, read_wav(voices["high"]), None)},
    ]
    named = voiceprint.identify(embedder, audio, result, prints)
    assert named["turns"][0]["speaker"] == "Alice", named
    others = {t["speaker"] for t in named["turns"]} - {"Alice"}
    assert len(others) == 1 and others.pop().startswith("SPEAKER_"), named["turns"]
    alice = next(i for i in named["identities"] if i["voiceprint"] == "Alice")
    assert alice["cluster"] == first and alice["score"] >= voiceprint.THRESHOLD
    stranger = next(i for i in named["identities"] if i["voiceprint"] is None)
    assert stranger["best"] == "Alice" and stranger["score"] < voiceprint.THRESHOLD


def test_two_clusters_of_one_enrolled_voice_become_one_speaker(embedder, voices):
    audio = read_wav(voices["conversation"])
    result = VadDvectorDiarizer().diarize(audio, num_speakers=4)  # over-split on purpose
    prints = [
        {"name": "Alice", **voiceprint.enroll(embedder, read_wav(voices["high"]), None)},
        {"name": "Bob", **voiceprint.enroll(embedder, read_wav(voices["low"]), None)},
    ]
    named = voiceprint.identify(embedder, audio, result, prints)
    assert named["speakers"] == ["Alice", "Bob"], named["identities"]
    # One speaker's turns never overlap each other after the merge.
    for name in ("Alice", "Bob"):
        mine = [t for t in named["turns"] if t["speaker"] == name]
        assert all(a["end"] < b["start"] for a, b in zip(mine, mine[1:])), mine


def test_spans_lose_what_overlaps_and_cut_into_pieces():
    assert voiceprint._minus([(0, 10)], [(2, 3), (9, 12)]) == [(0, 2), (3, 9)]
    assert voiceprint._minus([(0, 1)], [(5, 6)]) == [(0, 1)]
    cut = voiceprint.pieces([(0, 7), (10, 10.5)])
    assert cut == [[(0, 7 / 3)], [(7 / 3, 14 / 3)], [(14 / 3, 7)]]  # the half second is left out
    assert voiceprint.pieces([(0, 0.5)]) == [[(0, 0.5)]]  # unless there is nothing else
    # Speech in short phrases is joined, none of it lost; one long span does not push it out.
    phrases = [(2 * i, 2 * i + 0.7) for i in range(8)]
    cut = voiceprint.pieces(phrases + [(20, 21.5)])
    assert [len(g) for g in cut] == [5, 3, 1], cut
    assert sum(b - a for g in cut for a, b in g) == pytest.approx(8 * 0.7 + 1.5)
    # The same second given twice counts once.
    assert voiceprint.union([(0, 1.2)] * 10 + [(1, 2), (3, 4)]) == [(0, 2), (3, 4)]


def test_a_sample_gives_the_speech_of_its_one_voice_or_is_refused():
    def turns(*spans):
        return {"turns": [{"speaker": who, "start": s, "end": e} for who, s, e in spans]}

    # Someone else's short reply is left out, and what they say over the voice with it.
    alone = voiceprint.one_voice(turns(("A", 0, 6), ("B", 5.5, 6.5), ("A", 7, 12)))
    assert alone == [(0, 5.5), (7, 12)]
    # Two people who both talk (a meeting given as one person's sample): refused.
    with pytest.raises(voiceprint.EnrollError, match="holds 2 voices"):
        voiceprint.one_voice(turns(("A", 0, 6), ("B", 6, 11), ("A", 11, 12)))
    assert voiceprint.one_voice({"turns": []}) == []


def test_renamed_turns_join_and_the_overlaps_follow():
    turns = [
        {"start": 0.0, "end": 2.0, "speaker": "SPEAKER_00"},
        {"start": 1.5, "end": 3.0, "speaker": "SPEAKER_01"},
        {"start": 2.5, "end": 4.0, "speaker": "SPEAKER_02"},
        {"start": 5.0, "end": 6.0, "speaker": "SPEAKER_02"},
        {"start": 6.0, "end": 7.0, "speaker": "SPEAKER_02"},
    ]
    names = {"SPEAKER_00": "Ann", "SPEAKER_01": "Ann"}
    merged = voiceprint._merged(turns, names)
    assert [(t["start"], t["end"], t["speaker"]) for t in merged] == [
        (0.0, 3.0, "Ann"),
        (2.5, 4.0, "SPEAKER_02"),
        (5.0, 6.0, "SPEAKER_02"),  # nobody renamed them: left as the engine gave them
        (6.0, 7.0, "SPEAKER_02"),
    ]
    assert voiceprint.overlaps_of(merged) == [[2.5, 3.0]]


def test_protocol_enrol_then_identify(tmp_path, voices):
    proc = start_worker("gpuhost_diarizer")
    enroll_out, run_out = tmp_path / "e.json", tmp_path / "r.json"
    enroll = {"action": "enroll", "audio_path": voices["low"], "_output_path": str(enroll_out)}
    stdout = []
    # Too little speech is the client's to change: an `error` of kind `refused`, with the
    # message as the client reads it.
    short = {**enroll, "segments": [[0.0, 0.5]]}
    proc.stdin.write(json.dumps(short) + "\n")
    proc.stdin.flush()
    while not (line := proc.stdout.readline().strip()).startswith("error"):
        assert line.startswith("ready"), line
        stdout.append(line)
    refused = json.loads(line[len("error ") :])
    assert refused["kind"] == "refused" and "at least 2 s" in refused["message"], refused
    # A conversation given as one voice's sample: refused, not one voiceprint of both.
    both = {**enroll, "audio_path": voices["conversation"]}
    proc.stdin.write(json.dumps(both) + "\n")
    proc.stdin.flush()
    while not (line := proc.stdout.readline().strip()).startswith("error"):
        assert line != "done" and line, "a sample of two voices was enrolled"
    refused = json.loads(line[len("error ") :])
    assert refused["kind"] == "refused" and "holds 2 voices" in refused["message"], refused
    proc.stdin.write(json.dumps(enroll) + "\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline().strip()
        stdout.append(line)
        if line == "done" or line.startswith("error") or not line:
            break
    assert stdout[-1] == "done", stdout
    enrolled = json.loads(enroll_out.read_text())
    assert enrolled["model"] == "wespeaker-resnet34" and len(enrolled["vector"]) == 256
    task = {
        "audio_path": voices["conversation"],
        "num_speakers": 2,
        "voiceprints": [{"name": "Bob", "vector": enrolled["vector"]}],
        "_output_path": str(run_out),
    }
    out, err = proc.communicate(json.dumps(task) + "\n", timeout=120)
    assert out.splitlines()[-1] == "done", err
    result = json.loads(run_out.read_text())
    assert "Bob" in result["speakers"] and result["turns"][1]["speaker"] == "Bob", result
    assert json.loads(stdout[0][len("ready ") :])["voiceprints"] == "wespeaker-resnet34"
