"""Speech Whisper skipped is found: pauses between words, and the speech the VAD hears in them."""

import numpy as np
from gpuhost_asr import gaps


def seg(start, end, words=None):
    return {"start": start, "end": end, "text": "", "words": words or []}


def word(start, end):
    return {"word": "w", "start": start, "end": end}


def test_pauses_are_the_long_stretches_no_word_covers():
    segments = [
        seg(0.5, 4.0, [word(0.5, 1.0), word(1.2, 4.0)]),
        # A segment's own span is ignored when it has words: only the words count.
        seg(4.0, 20.0, [word(9.0, 10.0)]),
        seg(21.0, 22.0),  # no words: the segment's span counts
    ]
    assert gaps.pauses(segments, 30.0) == [(4.0, 9.0), (10.0, 21.0), (22.0, 30.0)]


def test_short_pauses_and_overlapping_words_make_no_pause():
    segments = [seg(0.0, 5.0, [word(0.0, 3.0), word(1.0, 2.0), word(4.5, 5.0)])]
    assert gaps.pauses(segments, 6.0) == []
    assert gaps.pauses([], 2.0) == []
    assert gaps.pauses([], 10.0) == [(0.0, 10.0)]


def test_unheard_keeps_pauses_with_enough_speech_padded_inside_the_pause():
    audio = np.zeros(30 * gaps.RATE, dtype=np.float32)
    segments = [seg(0.0, 2.0, [word(0.0, 2.0)]), seg(20.0, 21.0, [word(20.0, 21.0)])]
    asked = []

    def speech_in(clip):
        asked.append(len(clip) / gaps.RATE)
        if len(clip) == 18 * gaps.RATE:  # the pause 2-20 s: speech at 3-8 s of it
            return [(3 * gaps.RATE, 5 * gaps.RATE), (6 * gaps.RATE, 8 * gaps.RATE)]
        return [(0, gaps.RATE // 2)]  # the tail: half a second, a cough

    # Each stretch of speech on its own, padded; the silence between them is not decoded.
    assert gaps.unheard(audio, segments, 30.0, speech_in) == [(4.8, 7.2), (7.8, 10.2)]
    assert asked == [18.0, 9.0]


def test_recovered_segments_go_in_their_places():
    a, b, c = seg(0.0, 1.0), seg(5.0, 6.0), seg(2.0, 3.0)
    assert gaps.merged([a, b], [c]) == [a, c, b]


def said(start, end, text):
    words = text.split()
    step = (end - start) / len(words)
    return {
        "start": start,
        "end": end,
        "text": text,
        "words": [
            word(start + i * step, start + (i + 1) * step) | {"word": w}
            for i, w in enumerate(words)
        ],
    }


def test_a_segment_that_recovered_speech_says_again_is_a_suspect():
    misplaced = said(47.0, 57.0, "If you'd like to test out the voice over IP capabilities")
    kept = said(60.0, 62.0, "press one to continue")
    recovered = said(
        27.2, 37.4, "if you'd like to test out the VoiceOverIP capabilities of asterisk"
    )
    assert gaps.repeats(misplaced, [recovered])
    assert not gaps.repeats(kept, [recovered])
    # Short phrases said twice are speech said twice.
    assert not gaps.repeats(said(40.0, 41.0, "yes yes"), [said(30.0, 31.0, "yes yes")])
    # Far away, the same words are another occurrence.
    assert not gaps.repeats(said(90.0, 95.0, misplaced["text"]), [recovered])
    assert gaps.says(kept, [said(0.0, 3.0, "please press one to continue now")])
    assert not gaps.says(kept, [said(0.0, 3.0, "a 28.8 kilobit modem")])


def said_twice(tmp_path, speech_wav):
    """The sentence of `speech_wav`, 4 s of silence, the sentence again; and its length (s)."""
    import wave

    with wave.open(speech_wav) as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    twice = tmp_path / "twice.wav"
    with wave.open(str(twice), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames + b"\0\0" * (4 * rate) + frames)
    return twice, len(frames) / 2 / rate


def test_speech_a_lost_window_held_is_decoded_again(tmp_path, speech_wav):
    """The real model and VAD, with the first pass made to lose the second sentence (as tiny.en
    lost 27-47 s of a real telephone reading): the pause is found, decoded again, and its words
    are in the result."""
    from gpuhost_asr.engine import AsrSettings, Transcriber

    twice, spoken = said_twice(tmp_path, speech_wav)
    transcriber = Transcriber(AsrSettings())
    decode, clips = transcriber.model.transcribe, []

    def losing_the_second_sentence(audio, **options):
        clips.append(options.get("clip_timestamps"))
        segments, info = decode(audio, **options)
        if options.get("clip_timestamps") is None:
            segments = [s for s in segments if s.start < spoken]
        return segments, info

    transcriber.model.transcribe = losing_the_second_sentence
    result = transcriber.transcribe(str(twice))
    # The full pass, the lost sentence, and the first one checked (the same words said twice
    # within 30 s are a suspect until its own span is decoded again: it stays).
    assert len(clips) == 3 and clips[0] is None, clips
    assert clips[2][0] == 0.0 and clips[2][1] < spoken + 0.5, clips
    start, end = clips[1]
    assert spoken + 3 < start < end <= 2 * spoken + 4 + 0.01, (clips, spoken)
    later = " ".join(
        w["word"] for s in result["segments"] for w in s["words"] if w["start"] > spoken + 3
    ).lower()
    assert "world" in later and "worker" in later, result["segments"]
    text = " ".join(s["text"] for s in result["segments"]).lower()
    assert text.count("worker") == 2, result["segments"]
    starts = [s["start"] for s in result["segments"]]
    assert starts == sorted(starts)


def test_words_kept_at_the_wrong_time_are_not_said_twice(tmp_path, speech_wav):
    """The first pass keeps the second sentence but squeezes it into the pause before it (the
    other way a window goes wrong): the sentence decoded again where it is replaces it."""
    import dataclasses

    from gpuhost_asr.engine import AsrSettings, Transcriber

    twice, spoken = said_twice(tmp_path, speech_wav)
    transcriber = Transcriber(AsrSettings())
    decode = transcriber.model.transcribe

    def misaligned(audio, **options):
        if options.get("clip_timestamps") is None:
            options = dict(options, initial_prompt=None)  # the first pass, as without a prompt
        segments, info = decode(audio, **options)
        if options.get("clip_timestamps") is not None:
            # With a prompt, the decodes of the pauses say nothing (see the prompt test below):
            # the pass without it must check its suspects as this one does.
            return ([] if options.get("initial_prompt") else segments), info
        out, base = [], spoken + 0.2
        for s in segments:
            if s.start > spoken + 1:
                k = 0.8 / max(1e-3, s.end - s.start)
                words = [
                    dataclasses.replace(
                        w, start=base + (w.start - s.start) * k, end=base + (w.end - s.start) * k
                    )
                    for w in s.words
                ]
                s = dataclasses.replace(s, start=base, end=base + 0.8, words=words)
            out.append(s)
        return out, info

    transcriber.model.transcribe = misaligned
    for prompt in [None, "Ebenezer, Andrew, marketing"]:
        result = transcriber.transcribe(str(twice), prompt=prompt)
        text = " ".join(s["text"] for s in result["segments"]).lower()
        assert text.count("worker") == 2, (prompt, result["segments"])
        later = [w for s in result["segments"] for w in s["words"] if w["start"] > spoken + 3]
        assert any("worker" in w["word"].lower() for w in later), (prompt, result["segments"])


def test_nothing_is_decoded_again_when_nothing_was_lost(tmp_path, speech_wav):
    from gpuhost_asr.engine import AsrSettings, Transcriber

    transcriber = Transcriber(AsrSettings())
    decode, calls = transcriber.model.transcribe, []

    def counted(audio, **options):
        calls.append(options.get("clip_timestamps"))
        return decode(audio, **options)

    transcriber.model.transcribe = counted
    transcriber.transcribe(speech_wav)
    assert calls == [None]


def test_speech_the_prompt_kept_from_being_written_is_decoded_without_it(tmp_path, speech_wav):
    """A prompt can make Whisper stop after a window's first words (tiny.en with "Ebenezer,
    Andrew, marketing" gave an empty transcript of a real 30 s meeting, with a 200), and the
    pauses decoded again carried the same prompt: the speech still unwritten is decoded once
    more without it, and the result says so."""
    from gpuhost_asr.engine import AsrSettings, Transcriber

    twice, spoken = said_twice(tmp_path, speech_wav)
    transcriber = Transcriber(AsrSettings())
    decode, prompts = transcriber.model.transcribe, []

    def silenced_by_the_prompt(audio, **options):
        prompts.append(options.get("initial_prompt"))
        segments, info = decode(audio, **options)
        return ([] if options.get("initial_prompt") else list(segments)), info

    transcriber.model.transcribe = silenced_by_the_prompt
    result = transcriber.transcribe(str(twice), prompt="Ebenezer, Andrew, marketing")
    text = " ".join(s["text"] for s in result["segments"]).lower()
    assert text.count("worker") == 2, result["segments"]
    assert prompts[0] == "Ebenezer, Andrew, marketing" and prompts[-1] is None, prompts
    assert any("without the prompt" in w for w in result.get("warnings", [])), result
    # Without a prompt there is no such pass.
    prompts.clear()
    transcriber.transcribe(str(twice))
    assert prompts == [None], prompts
