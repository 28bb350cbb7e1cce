"""End to end through HTTP on synthesized speech with exact ground truth (make_eval_set.py):
wideband and telephone recordings of 2–3 speakers, conversations and quick turn-taking without
pauses, through the three real workers.

The diarizer here is `vad-dvector`, not the default `overlap`: the espeak-ng voices are too alike
for the ResNet34 embedding, which was trained on real people (the default is measured on real
recordings by benches/quality.py; test_default_engines.py runs it through the host)."""

import json
import statistics
import time

import harness
import metrics
import pytest

# Bounds for the CPU engines on this evaluation set. The targets apply to the
# medians over the set (DER ≤ 5 %, word-boundary error ≤ 80 ms, wideband WER ≤ 10 %); each file
# also gets a looser guard, since decoding of synthetic 8 kHz speech varies from run to run: a
# window that decodes unsure is decoded again by sampling (telephone WER 20–56 % measured with
# tiny.en, 0.49–0.56 on quick_three_phone alone; see docs/benchmarks.md).
WER_WIDE_MEDIAN, WER_WIDE, WER_PHONE = 0.10, 0.15, 0.60
DER_MAX = 0.05
BOUNDARY_MS_MEDIAN, BOUNDARY_MS_MAX = 80, 110
# Turn-taking recordings are there for the diarizer (speaker changes without a pause). Their
# 1–6-word turns are hard for tiny.en (20 % wideband WER measured), and words next to a change
# are the ones a 0.1–0.2 s boundary error gives to the wrong speaker.
WER_QUICK, SPEAKER_WORDS, SPEAKER_WORDS_QUICK = 0.30, 0.9, 0.85


@pytest.fixture(scope="module")
def server():
    s = harness.Server(engines={"diarizer": "vad-dvector"})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def recordings():
    return harness.eval_set()


@pytest.fixture(scope="module")
def results(server, recordings):
    folder, names = recordings
    out = {}
    for name in names:
        events, _ = server.transcribe(folder / f"{name}.wav")
        out[name] = events
    return out


def final(events):
    assert events[-1]["type"] == "result", events[-1]
    return events[-1]["result"]


def test_every_recording_meets_the_bounds(recordings, results):
    folder, names = recordings
    report = {}
    for name in names:
        truth = json.loads((folder / f"{name}.json").read_text())
        m = metrics.evaluate(truth, final(results[name]))
        m["narrowband"] = bool(truth.get("narrowband"))
        m["quick"] = truth["set"] == "turn-taking"
        report[name] = m
        assert m["wer"] <= (
            WER_PHONE if m["narrowband"] else WER_QUICK if m["quick"] else WER_WIDE
        ), (name, m)
        assert m["der"] <= DER_MAX, (name, m)
        assert m["speakers_found"] == m["speakers_true"], (name, m)
        assert m["boundary_ms"] <= BOUNDARY_MS_MAX, (name, m)
        assert m["speaker_words"] >= (SPEAKER_WORDS_QUICK if m["quick"] else SPEAKER_WORDS), (
            name,
            m,
        )
    print(json.dumps(report, indent=1))
    wide = [m["wer"] for m in report.values() if not m["narrowband"] and not m["quick"]]
    assert statistics.median(wide) <= WER_WIDE_MEDIAN, report
    assert statistics.median(m["boundary_ms"] for m in report.values()) <= BOUNDARY_MS_MEDIAN, (
        report
    )


def test_stream_carries_stages_progress_and_partial_text(results):
    events = results["meeting"]
    stages = [(e["stage"], e["status"]) for e in events if e["type"] == "stage"]
    # Diarizer and ASR run at the same time (the default parallel group); the aligner after both.
    assert stages[:2] == [("diarizer", "started"), ("asr", "started")], stages
    assert set(stages[2:4]) == {("diarizer", "done"), ("asr", "done")}, stages
    assert stages[4:] == [("aligner", "started"), ("aligner", "done")], stages
    partial = [
        e for e in events if e["type"] == "progress" and e["stage"] == "asr" and e.get("partial")
    ]
    assert partial and "morning" in partial[0]["partial"]["text"].lower()
    result = final(events)
    assert set(result["timings"]) == {"diarizer", "asr", "aligner"}
    assert result["pipeline_seconds"] < sum(result["timings"].values()), (
        "the first two stages overlapped"
    )
    assert result["language"] == "en" and result["duration"] > 40
    word = result["segments"][0]["words"][0]
    assert {"word", "start", "end", "score", "speaker"} <= word.keys()


@pytest.mark.parametrize(
    "fmt,check",
    [
        ("srt", lambda t: t.startswith("1\n00:00:0") and "[SPEAKER_00]" in t),
        ("vtt", lambda t: t.startswith("WEBVTT\n\n") and "<v SPEAKER_01>" in t),
        ("txt", lambda t: t.startswith("SPEAKER_00: ") and "help desk" in t.lower()),
        ("rttm", lambda t: t.startswith("SPEAKER audio 1 ") and "SPEAKER_01" in t),
        ("json", lambda t: json.loads(t)["speakers"] == ["SPEAKER_00", "SPEAKER_01"]),
    ],
)
def test_formats(server, recordings, fmt, check):
    folder, _ = recordings
    with server.request(
        f"/transcribe?format={fmt}", (folder / "support_call.wav").read_bytes()
    ) as r:
        text = r.read().decode()
    assert check(text), text[:400]


def test_num_speakers_is_honoured(server, recordings):
    folder, _ = recordings
    events, _ = server.transcribe(folder / "meeting.wav", "?num_speakers=2&stages=diarizer,asr")
    assert final(events)["speakers"] == ["SPEAKER_00", "SPEAKER_01"]


def test_openai_client_works_unchanged(server, recordings):
    import openai

    folder, _ = recordings
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.token)
    with open(folder / "support_call.wav", "rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-1",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )
    assert "help desk" in verbose.text.lower()
    assert verbose.language == "english" and verbose.duration > 20
    assert verbose.words and verbose.words[0].end > verbose.words[0].start
    # Words as OpenAI writes them: without the punctuation the text has around them.
    assert any(c in verbose.text for c in ".,?"), verbose.text
    assert not [w.word for w in verbose.words if w.word[-1] in ".,?!" or w.word[0] in '"¿']
    speakers = {
        s.model_extra.get("speaker") if hasattr(s, "model_extra") else s["speaker"]
        for s in verbose.segments
    }
    assert speakers == {"SPEAKER_00", "SPEAKER_01"}
    with open(folder / "support_call.wav", "rb") as f:
        text = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert "technician" in str(text).lower()
    with open(folder / "support_call.wav", "rb") as f:
        plain = client.audio.transcriptions.create(model="whisper-1", file=f)
    assert "router" in plain.text.lower()
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong")
    with open(folder / "support_call.wav", "rb") as f, pytest.raises(openai.AuthenticationError):
        bad.audio.transcriptions.create(model="whisper-1", file=f)


def test_client_leaving_mid_asr_cancels_the_stage_and_keeps_the_model(server, recordings):
    folder, _ = recordings
    before = {w["name"]: w for w in json.load(server.request("/workers"))["workers"]}
    # Stream a transcription, and hang up once the ASR has reported its first segment.
    r = server.request("/transcribe", (folder / "meeting.wav").read_bytes())
    for line in r:
        event = json.loads(line)
        if event["type"] == "progress" and event["stage"] == "asr":
            break
    r.close()  # the client goes away
    deadline = time.time() + 15
    while time.time() < deadline:
        asr = {w["name"]: w for w in json.load(server.request("/workers"))["workers"]}["asr"]
        if asr["tasks_cancelled"] > before["asr"]["tasks_cancelled"]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the ASR job was not cancelled: {asr}")
    assert asr["pid"] == before["asr"]["pid"] and asr["restarts"] == before["asr"]["restarts"], (
        "the model stayed loaded"
    )
    aligner = {w["name"]: w for w in json.load(server.request("/workers"))["workers"]}["aligner"]
    assert aligner["tasks_done"] == before["aligner"]["tasks_done"], "the aligner stage was skipped"
    # The next job works.
    events, _ = server.transcribe(folder / "support_call.wav", "?stages=asr")
    assert "help desk" in " ".join(s["text"] for s in final(events)["segments"]).lower()


def test_home_assistant_wyoming_client_transcribes(server, recordings):
    """Home Assistant's own protocol library (`wyoming` from PyPI) against `[wyoming] listen`:
    describe, then a recording streamed in 20 ms chunks as a voice satellite sends it."""
    import asyncio
    import wave

    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.info import Describe, Info

    folder, _ = recordings
    truth = json.loads((folder / "support_call.json").read_text())
    with wave.open(str(folder / "support_call.wav"), "rb") as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        audio = w.readframes(w.getnframes())

    async def converse():
        async with AsyncTcpClient("127.0.0.1", server.wyoming_port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await client.read_event())
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
            step = rate * width * channels // 50
            for i in range(0, len(audio), step):
                chunk = AudioChunk(
                    rate=rate, width=width, channels=channels, audio=audio[i : i + step]
                )
                await client.write_event(chunk.event())
            await client.write_event(AudioStop().event())
            answer = await client.read_event()
            # A wrong format is refused with an `error` event, and the stream ends: Home
            # Assistant reads on until a transcript or the end, and gives up only then.
            await client.write_event(AudioStart(rate=rate, width=4, channels=channels).event())
            refused = await client.read_event()
            ended = await asyncio.wait_for(client.read_event(), 10)
            return info, answer, refused, ended

    info, answer, refused, ended = asyncio.run(converse())
    assert ended is None
    assert info.asr[0].name == "gpuhost" and info.asr[0].installed
    assert info.asr[0].models[0].languages == ["en"]
    assert Transcript.is_type(answer.type), answer
    transcript = Transcript.from_event(answer)
    hyp = {
        "segments": [
            {"words": [{"word": w, "start": 0, "end": 0} for w in transcript.text.split()]}
        ]
    }
    assert metrics.wer(truth, hyp) <= WER_WIDE, transcript.text
    assert transcript.language == "en"
    assert Error.is_type(refused.type) and "width 4" in Error.from_event(refused).text


def test_a_language_the_model_lacks_is_a_clear_400(server, recordings):
    """The bundled tiny.en says so in `ready`; Korean is refused up front, never answered in
    English."""
    import urllib.error

    folder, _ = recordings
    workers = {w["name"]: w for w in json.load(server.request("/workers"))["workers"]}
    assert workers["asr"]["loaded"]["languages"] == ["en"], workers["asr"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        server.transcribe(folder / "support_call.wav", "?language=ko")
    body = json.loads(refused.value.read())
    assert refused.value.code == 400 and "tiny.en" in body["message"], body


def test_an_enrolled_voice_names_its_speaker_in_another_recording(server, recordings, results):
    """Enrol Alice (under a Korean name) as one speaker of a finished transcript of the meeting;
    in the interview, a different recording, her words carry that name and nobody else's do.
    Then the voice is deleted for good. (Alice is the one female voice of the interview: the
    espeak-ng voices of one sex score alike to the speaker embedding, unlike real people.)"""
    import urllib.parse

    folder, _ = recordings
    meeting = final(results["meeting"])
    alice = meeting["turns"][0]["speaker"]  # she opens the meeting
    fields = {"name": "앨리스", "transcript": json.dumps(meeting), "speaker": alice}
    with server.post_form("/speakers", fields, {"file": folder / "meeting.wav"}) as r:
        assert r.status == 201
        voice = json.load(r)
    assert voice["seconds"] > 5, voice
    try:
        events, _ = server.transcribe(folder / "interview.wav")
        result = final(events)
        truth = json.loads((folder / "interview.json").read_text())
        assert "앨리스" in result["speakers"], result["identities"]

        def truth_speaker(w):
            t = (w["start"] + w["end"]) / 2
            return next((x["speaker"] for x in truth["turns"] if x["start"] <= t <= x["end"]), None)

        words = [w for s in result["segments"] for w in s["words"]]
        hers = [w for w in words if truth_speaker(w) == "alice"]
        others = [w for w in words if truth_speaker(w) not in (None, "alice")]
        named = [(w["word"], w.get("speaker")) for w in words]
        assert sum(w.get("speaker") == "앨리스" for w in hers) >= 0.8 * len(hers), named
        assert sum(w.get("speaker") == "앨리스" for w in others) <= 0.05 * len(others), named
        identity = next(i for i in result["identities"] if i["voiceprint"] == "앨리스")
        assert identity["score"] >= 0.4, result["identities"]
    finally:
        with server.delete("/speakers/" + urllib.parse.quote("앨리스")) as gone:
            assert gone.status == 200
    events, _ = server.transcribe(folder / "interview.wav", "?stages=diarizer")
    assert "앨리스" not in json.dumps(final(events)), "a deleted voice names nobody"
