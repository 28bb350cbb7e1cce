import json

import numpy as np
import pytest
from conftest import start_worker
from gpuhost_aligner.engine import SphinxAligner, read_wav
from gpuhost_aligner.text import letter_to_phones, normalize


def test_normalize_and_letter_to_phones():
    assert normalize("Hello,") == ["hello"]
    # Numbers and symbols as they are said, so they get word times too.
    assert normalize("42") == ["forty", "two"]
    assert normalize("$1,250") == ["one", "thousand", "two", "hundred", "fifty", "dollars"]
    assert normalize("3.5%") == ["three", "point", "five", "percent"]
    assert normalize("1990s") == ["nineteen", "nineties"]
    assert normalize("2024,") == ["twenty", "twenty", "four"]
    assert normalize("21st") == ["twenty", "first"]
    assert normalize("9:05") == ["nine", "oh", "five"]
    assert normalize("R&D") == ["r", "and", "d"]
    assert normalize("—") == []
    assert letter_to_phones("gpuhost") == "G P AH HH AA S T"


def rough_words(audio, text):
    """ASR-like input: words spread evenly over the speech, timings deliberately rough."""
    voiced = np.flatnonzero(np.abs(audio) > 500)
    start, end = voiced[0] / 16000, voiced[-1] / 16000
    words = text.split()
    step = (end - start) / len(words)
    return [
        {
            "start": round(start, 2),
            "end": round(end, 2),
            "text": text,
            "words": [
                {
                    "word": w,
                    "start": start + i * step,
                    "end": start + (i + 1) * step,
                    "probability": round(0.5 + i / 40, 3),
                }
                for i, w in enumerate(words)
            ],
        }
    ]


@pytest.fixture(scope="module")
def aligner():
    return SphinxAligner()


def test_aligns_every_word_in_order(aligner, speech_wav):
    audio = read_wav(speech_wav)
    text = "hello world, this is a test of the speech worker"
    result = aligner.align(audio, rough_words(audio, text))
    words = result["segments"][0]["words"]
    assert result["aligned_words"] == result["total_words"] == 10
    # The ASR's probability (pocketsphinx gives none when it aligns: it read as 1.0 for all).
    probabilities = [w["probability"] for s in rough_words(audio, text) for w in s["words"]]
    assert [w["score"] for w in words] == probabilities
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert all(w["end"] > w["start"] for w in words)
    # The first word starts with the speech, not at the padding.
    first_voiced = np.flatnonzero(np.abs(audio) > 500)[0] / 16000
    assert abs(words[0]["start"] - first_voiced) < 0.12


def test_digital_silence_does_not_keep_words_from_aligning(aligner, tmp_path):
    from gpuhost_worker.testing import speech_wav as make_speech

    # The README's first example. Resampled by ffmpeg (as gpuhost does), its pauses are exact
    # zeros (sox dithers them): pocketsphinx then aligned 1 of its 5 words.
    text = "hello from the speech pipeline"
    audio = read_wav(make_speech(text, str(tmp_path), voice="en", rate_wpm=175)).copy()
    audio[np.abs(audio) <= 1] = 0
    assert (audio == 0).mean() > 0.2
    result = aligner.align(audio, rough_words(audio, text))
    assert result["aligned_words"] == result["total_words"] == 5, result


def test_out_of_vocabulary_words_still_align(aligner, speech_wav):
    audio = read_wav(speech_wav)
    result = aligner.align(
        audio, rough_words(audio, "hello world, this is a test of the gpuhost worker")
    )
    assert result["aligned_words"] == result["total_words"]


def test_numbers_and_symbols_get_word_times_as_they_are_said(aligner, tmp_path):
    from gpuhost_worker.testing import speech_wav as make_speech

    # What the speaker says, and how an ASR writes it down.
    said = "the rent went up fifty percent to one thousand two hundred dollars in nineteen ninety"
    written = "the rent went up 50% to $1,200 in 1990."
    audio = read_wav(make_speech(said, str(tmp_path)))
    words = rough_words(audio, written)
    result = aligner.align(audio, words)
    assert result["aligned_words"] == result["total_words"] == 9, result
    out = {w["word"]: w for w in result["segments"][0]["words"]}
    assert out["50%"]["aligned"] and out["$1,200"]["aligned"] and out["1990."]["aligned"]
    # "$1,200" spans "one thousand two hundred dollars", not the time of one token.
    assert out["$1,200"]["end"] - out["$1,200"]["start"] > 0.6, out["$1,200"]
    order = [w["start"] for w in result["segments"][0]["words"]]
    assert order == sorted(order)


def test_words_written_joined_are_said_as_one(aligner, tmp_path):
    from gpuhost_worker.testing import speech_wav as make_speech

    # Whisper writes "50%" as "50" and a joined "%", "$1,200" as "$1" and a joined ",200".
    said = "the rent went up fifty percent to one thousand two hundred dollars"
    audio = read_wav(make_speech(said, str(tmp_path)))
    (segment,) = rough_words(audio, "the rent went up 50 % to $1 ,200")
    for w in segment["words"]:
        if w["word"] in ("%", ",200"):
            w["joined"] = True
    result = aligner.align(audio, [segment])
    out = result["segments"][0]["words"]
    assert result["aligned_words"] == result["total_words"] == 9, result
    assert [w.get("joined", False) for w in out] == [False] * 5 + [True, False, False, True]
    # The pieces share their written word's span, in order, touching.
    percent, dollars = out[4:6], out[7:9]
    for first, second in (percent, dollars):
        assert first["end"] == second["start"] and first["start"] < first["end"] < second["end"]
    assert dollars[1]["end"] - dollars[0]["start"] > 0.6, dollars


def test_protocol_needs_the_asr_result(tmp_path, speech_wav):
    proc = start_worker("gpuhost_aligner")
    out = tmp_path / "r.json"
    stdout, _ = proc.communicate(
        json.dumps({"audio_path": speech_wav, "_output_path": str(out)}) + "\n", timeout=120
    )
    lines = stdout.splitlines()
    assert lines[0].startswith("ready")
    # It says it runs on the CPU: the host does not unload it to make room on the GPU.
    assert json.loads(lines[0].removeprefix("ready"))["device"] == "cpu", lines[0]
    assert lines[1].startswith("error ") and "asr stage" in lines[1]


def align_through_the_worker(tmp_path, wav, asr: dict) -> dict:
    """One task with the ASR result `asr` through a started aligner worker: its result."""
    proc = start_worker("gpuhost_aligner")
    out = tmp_path / "r.json"
    task = {"audio_path": wav, "_output_path": str(out), "results": {"asr": asr}}
    stdout, _ = proc.communicate(json.dumps(task) + "\n", timeout=120)
    assert stdout.splitlines()[1] == "done", stdout
    return json.loads(out.read_text())


def test_a_language_without_a_model_keeps_the_asr_word_times(tmp_path, speech_wav):
    # Korean ASR output: pocketsphinx (en-us) must not touch it; the ASR's times stand, marked.
    asr = {
        "language": "ko",
        "segments": [
            {
                "start": 0.1,
                "end": 1.9,
                "text": "안녕하세요 여러분",
                "words": [
                    {"word": "안녕하세요", "start": 0.1, "end": 0.9, "probability": 0.9},
                    {"word": "여러분", "start": 1.0, "end": 1.9, "probability": 0.8},
                    {"word": "!", "start": 1.9, "end": 1.9, "probability": 0.8, "joined": True},
                ],
            }
        ],
    }
    result = align_through_the_worker(tmp_path, speech_wav, asr)
    words = result["segments"][0]["words"]
    assert [(w["word"], w["start"], w["end"], w["aligned"]) for w in words] == [
        ("안녕하세요", 0.1, 0.9, False),
        ("여러분", 1.0, 1.9, False),
        ("!", 1.9, 1.9, False),
    ]
    # The ASR's mark for a word written on to the one before it goes through.
    assert [w.get("joined", False) for w in words] == [False, False, True]
    assert result["aligned_words"] == 0 and result["total_words"] == 3
    assert "'ko'" in result["skipped"]


def test_a_translation_is_aligned_as_the_english_it_is(tmp_path, speech_wav):
    # German speech translated to English: the words are English, `language` says "de" (the
    # spoken one). They were left with the ASR's times and a warning that read oddly.
    words = "hello world this is a test of the speech worker".split()
    asr = {
        "language": "de",
        "task": "translate",
        "segments": [
            {
                "start": 0.0,
                "end": 3.0,
                "text": " ".join(words),
                "words": [
                    {"word": w, "start": i * 0.3, "end": i * 0.3 + 0.3, "probability": 0.9}
                    for i, w in enumerate(words)
                ],
            }
        ],
    }
    result = align_through_the_worker(tmp_path, speech_wav, asr)
    assert "skipped" not in result, result
    assert result["aligned_words"] >= len(words) - 1, result


def test_a_stretch_that_does_not_align_is_halved_at_the_widest_pause(aligner, monkeypatch):
    # The decoder stand-in fails any stretch holding "mumble"; everything else aligns.
    tried = []

    def piece(audio, tokens, tries=None):
        tried.append(list(tokens))
        if "mumble" in tokens:
            return None
        step = len(audio) / 16000 / len(tokens)
        return [(i * step, (i + 1) * step, -100) for i in range(len(tokens))]

    monkeypatch.setattr(aligner, "_align_piece", piece)
    said = "one two three four mumble six"
    # The widest pause in the ASR's times is after "three", the next widest after "four".
    times = [(0.0, 0.3), (0.4, 0.7), (0.8, 1.1), (2.0, 2.3), (2.6, 2.9), (3.0, 3.3)]
    words = [{"word": w, "start": a, "end": b} for w, (a, b) in zip(said.split(), times)]
    audio = np.zeros(4 * 16000, dtype=np.int16)
    result = aligner.align(audio, [{"start": 0.0, "end": 3.3, "text": said, "words": words}])
    out = result["segments"][0]["words"]
    assert [w["aligned"] for w in out] == [True, True, True, True, False, False]
    assert tried[:3] == [said.split(), ["one", "two", "three"], ["four", "mumble", "six"]]
    assert tried[3] == ["four"]  # halved once more, at its widest pause, and no further
    assert len(tried) == 5
    assert out[0]["start"] < out[1]["start"] < out[2]["start"] < 1.25 < out[3]["start"]


def test_words_that_touch_are_halved_in_the_middle(aligner, monkeypatch):
    # Whisper's words mostly touch (every gap 0): the cut goes to the middle, not after the first.
    tried = []

    def piece(audio, tokens, tries=None):
        tried.append(list(tokens))
        return None if "mumble" in tokens else [(0.0, 0.1, -100)] * len(tokens)

    monkeypatch.setattr(aligner, "_align_piece", piece)
    said = "one two three four mumble six".split()
    words = [{"word": w, "start": i * 0.3, "end": (i + 1) * 0.3} for i, w in enumerate(said)]
    aligner.align(np.zeros(3 * 16000, dtype=np.int16), [{"start": 0.0, "end": 1.8, "words": words}])
    assert tried[1:3] == [said[:3], said[3:]]


def test_words_keep_their_order_where_halves_disagree():
    from gpuhost_aligner.words import keep_order, placed

    said = [("we", 4.30, 4.40, False), ("walked", 4.31, 4.95, True), ("on", 4.9, 5.2, False)]
    # "walked" placed by the aligner inside the ASR's time of "we"; "on" kept the ASR's times.
    words = [placed({"word": w}, a, b, 0.5, ok) for w, a, b, ok in said]
    out = keep_order([{"start": 4.3, "end": 5.2, "words": words}])[0]["words"]
    assert [(w["start"], w["end"]) for w in out] == [(4.30, 4.31), (4.31, 4.95), (4.95, 5.2)]
    assert [w["aligned"] for w in out] == [False, True, False]


def test_neighbouring_segments_meet_in_the_middle_of_their_overlap():
    from gpuhost_aligner.words import keep_order, placed

    # Each segment was aligned with 0.15 s of the other's audio around it: the last word of the
    # first ran on, the first word of the second started early (acoustic_corpus, "you know /
    # There's": 5.82–5.95 and 5.74–6.01 where a person marks 5.84).
    first = [placed({"word": "you"}, 5.58, 5.82, 0.5, True)]
    first.append(placed({"word": "know"}, 5.82, 5.95, 0.5, True))
    second = [placed({"word": "There's"}, 5.74, 6.01, 0.5, True)]
    out = keep_order(
        [
            {"start": 0.69, "end": 5.89, "words": first},
            {"start": 5.89, "end": 7.57, "words": second},
        ]
    )
    times = [(w["start"], w["end"]) for seg in out for w in seg["words"]]
    assert times == [(5.58, 5.82), (5.82, 5.845), (5.845, 6.01)]


def test_a_word_the_pieces_disagree_about_is_demoted_not_its_neighbours():
    from gpuhost_aligner.words import keep_order, placed

    def words(said):
        return [
            placed({"word": w, "start": a0, "end": b0, "probability": 0.9}, a, b, 0.5, True)
            for w, a0, b0, a, b in said
        ]

    # Two halves aligned apart put "me" late, after "at 3" ("please call me at three o'clock",
    # espeak-ng; aligned whole: me 0.64–0.76, at 0.76–0.86, 3 0.86–1.15). Meeting in the middle
    # left "at" and "3" aligned with no length; now "me" alone is demoted, to the ASR's times.
    out = keep_order(
        [
            {
                "words": words(
                    [
                        ("me", 0.62, 0.78, 1.03, 1.16),
                        ("at", 0.78, 0.9, 0.76, 0.86),
                        ("3", 0.9, 1.1, 0.86, 1.15),
                        ("o'clock", 1.1, 1.6, 1.2, 1.5),
                    ]
                )
            }
        ]
    )[0]["words"]
    assert [w["aligned"] for w in out] == [False, True, True, True]
    assert (out[0]["start"], out[0]["end"], out[0]["score"]) == (0.62, 0.76, 0.9)
    assert [(w["start"], w["end"]) for w in out[1:]] == [(0.76, 0.86), (0.86, 1.15), (1.2, 1.5)]
    assert all("_asr" not in w for w in out)
    # One word placed far too late costs only itself, not the good words after it.
    said = [("a", 0.0, 0.2), ("b", 3.0, 3.3), ("c", 0.4, 0.6), ("d", 0.7, 0.9), ("e", 1.0, 1.2)]
    said.append(("f", 3.5, 3.8))
    out = keep_order([{"words": words([(w, a, b, a, b) for w, a, b in said])}])[0]["words"]
    assert [w["word"] for w in out if not w["aligned"]] == ["b"]
    starts = [w["start"] for w in out]
    assert starts == sorted(starts), out
    # Two that cannot both stay: the earlier is kept.
    out = keep_order([{"words": words([("x", 0, 1, 1.0, 1.2), ("y", 1, 2, 0.8, 1.0)])}])
    assert [w["aligned"] for w in out[0]["words"]] == [True, False]


def test_a_word_left_unaligned_moves_not_its_aligned_neighbours():
    from gpuhost_aligner.words import keep_order, placed

    # A segment's last word kept the ASR's drifted times (3.0 s); the next segment's words were
    # aligned at 1.0 and 1.3 s: they stay, the unaligned word is fitted before them.
    first = [placed({"word": "2024"}, 3.0, 3.5, 0.0, False)]
    second = [
        placed({"word": w}, a, b, 0.5, True) for w, a, b in [("b", 1.0, 1.2), ("c", 1.3, 1.5)]
    ]
    out = keep_order([{"words": first}, {"words": second}])
    times = [(w["start"], w["end"]) for seg in out for w in seg["words"]]
    assert times == [(1.0, 1.0), (1.0, 1.2), (1.3, 1.5)]


def test_a_request_starts_afresh_whatever_came_before(aligner, speech_wav, monkeypatch):
    """The resident aligner's state (the beam setting that worked last, the padding noise's
    generator, its decoders' feature extraction) does not carry over from one request to the
    next: the same request gets the same times whatever the worker aligned between. (Compared
    within one aligner: the words a dictionary learned, and their order, can tip ties.)"""
    audio = read_wav(speech_wav)
    segments = rough_words(audio, "hello world, this is a test of the speech worker")
    seen = []
    align_piece = SphinxAligner._align_piece

    def recording(self, piece, tokens, tries=None):
        seen.append((self._preferred, self._rng.bit_generator.state["state"]["state"]))
        return align_piece(self, piece, tokens, tries)

    monkeypatch.setattr(SphinxAligner, "_align_piece", recording)
    first = aligner.align(audio, segments)
    # Whatever the requests between did: another beam setting preferred, the noise drawn on,
    # other audio aligned (words it knows: its dictionary stays the same).
    aligner._preferred = len(aligner._decoders) - 1
    aligner._rng.standard_normal(12345)
    noise = (np.random.default_rng(7).standard_normal(16000) * 3000).astype(np.int16)
    aligner.align(noise, rough_words(noise, "the speech"))
    seen_before = len(seen)
    assert aligner.align(audio, segments) == first
    assert seen[seen_before] == seen[0], "the second request started where the first did"


def test_a_request_called_off_mid_utterance_leaves_no_broken_decoder(speech_wav, monkeypatch):
    """A task called off (the host's SIGINT raises `TaskCancelled` wherever the code is) between
    an utterance's start and end left that decoder refusing every later alignment: the next
    requests' words moved by up to seconds, still `aligned: true`."""
    import gpuhost_aligner.engine as engine

    aligner = SphinxAligner()
    audio = read_wav(speech_wav)
    segments = rough_words(audio, "hello world, this is a test of the speech worker")
    first = aligner.align(audio, segments)
    preferred = aligner._preferred  # the beam setting that aligned it
    decode = engine._decode

    def called_off(decoder, text, padded):
        decoder.set_align_text(text)
        decoder.start_utt()
        decoder.process_raw(padded, full_utt=True)
        raise KeyboardInterrupt  # as TaskCancelled, a BaseException

    monkeypatch.setattr(engine, "_decode", called_off)
    with pytest.raises(KeyboardInterrupt):
        aligner.align(audio, segments)
    monkeypatch.setattr(engine, "_decode", decode)
    assert aligner.align(audio, segments) == first
    # Aligned by the same decoder, not by the next beam setting after the first refused.
    assert aligner._preferred == preferred
    assert aligner.align(audio, segments) == first


def test_no_word_ends_past_the_recording():
    # The last word of a recording aligned against the padding after it: 19.65-20.03 in a
    # 20.0 s recording (a real call's last 20 s). Its end is the recording's.
    from gpuhost_aligner.words import result

    seg = {"start": 19.0, "end": 20.03, "text": "it started.", "words": []}
    seg["words"] = [
        {"word": "it", "start": 19.2, "end": 19.6, "score": 1.0, "aligned": True},
        {"word": "started.", "start": 19.65, "end": 20.03, "score": 1.0, "aligned": True},
    ]
    out = result("test", [seg], 20.0)
    words = out["segments"][0]["words"]
    assert (words[-1]["start"], words[-1]["end"]) == (19.65, 20.0)
    assert out["segments"][0]["end"] == 20.0 and words[0]["end"] == 19.6
