"""Speech Whisper skipped: stretches of a transcript without words that the VAD hears speech in.

Long-form Whisper decodes 30 s windows and moves on by the timestamps it wrote. Now and then a
window's decode stops early or its words are aligned late (tiny.en on a 95 s telephone reading:
the words of 27–47 s aligned to 47–57 s), and the next window starts past speech nobody wrote
down, or the silence-hallucination guard drops the misplaced words. Either way the speech is lost
without a trace. `unheard` finds such stretches — long pauses between words that hold speech by
the VAD — so the engine can decode each on its own.
"""

from __future__ import annotations

RATE = 16000
# A pause between words at least this long is checked for speech (real pauses are shorter, and the
# VAD then runs on little audio).
MIN_GAP_SECONDS = 3.0
# Speech shorter than this inside a pause is a breath, a click or a cough, not lost words.
MIN_SPEECH_SECONDS = 1.0
# Kept on both sides of the speech found, so its first and last words are whole.
PAD_SECONDS = 0.2


def pauses(segments: list, duration: float) -> list:
    """The stretches of [0, duration] at least MIN_GAP_SECONDS long that no word (or, for a
    segment without words, no segment) covers, as (start, end) seconds."""
    spans = []
    for segment in segments:
        words = segment.get("words") or []
        if words:
            spans.extend((w["start"], w["end"]) for w in words)
        else:
            spans.append((segment["start"], segment["end"]))
    spans.sort()
    out, reached = [], 0.0
    for start, end in spans + [(duration, duration)]:
        if start - reached >= MIN_GAP_SECONDS:
            out.append((reached, start))
        reached = max(reached, end)
    return out


def unheard(audio, segments: list, duration: float, speech_in) -> list:
    """The stretches (start, end seconds) of `audio` (float32, 16 kHz) inside pauses of
    `segments` where `speech_in(clip)` finds at least MIN_SPEECH_SECONDS of speech; each spans
    that speech, padded. `speech_in` returns (start, end) sample offsets of speech in a clip."""
    out = []
    for start, end in pauses(segments, duration):
        clip = audio[int(start * RATE) : int(end * RATE)]
        found = speech_in(clip)
        if sum(e - s for s, e in found) < MIN_SPEECH_SECONDS * RATE:
            continue
        first, last = found[0][0] / RATE, found[-1][1] / RATE
        out.append(
            (
                round(float(max(start, start + first - PAD_SECONDS)), 3),
                round(float(min(end, start + last + PAD_SECONDS)), 3),
            )
        )
    return out


def merged(segments: list, recovered: list) -> list:
    """`segments` with `recovered` put in their places by start time."""
    return sorted(segments + recovered, key=lambda s: (s["start"], s["end"]))
