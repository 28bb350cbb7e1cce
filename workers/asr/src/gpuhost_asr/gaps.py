"""Speech Whisper skipped: stretches of a transcript without words that the VAD hears speech in.

Long-form Whisper decodes 30 s windows and moves on by the timestamps it wrote. Now and then a
window's decode stops early or its words are aligned late (tiny.en on a 95 s telephone reading:
the words of 27–47 s aligned to 47–57 s), and the next window starts past speech nobody wrote
down, or the silence-hallucination guard drops the misplaced words. Either way the speech is lost
without a trace. `unheard` finds such stretches — long pauses between words that hold speech by
the VAD — so the engine can decode each on its own.
"""

from __future__ import annotations

import re

RATE = 16000
# A pause between words at least this long is checked for speech (real pauses are shorter, and the
# VAD then runs on little audio).
MIN_GAP_SECONDS = 3.0
# Speech shorter than this inside a pause is a breath, a click or a cough, not lost words.
MIN_SPEECH_SECONDS = 1.0
# Kept on both sides of the speech found, so its first and last words are whole.
PAD_SECONDS = 0.2
# A first-pass segment most of whose words (this share, in order) recovered speech within this
# many seconds says again is a suspect: decoded again on its own span, it goes if that says
# something else (its words were misplaced), and stays if it says the same (said twice).
REPEATED_SHARE = 0.6
REPEAT_WITHIN_S = 30.0
# Rounds of recovery: a misplaced segment dropped in one leaves a pause the next decodes.
ROUNDS = 2


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
    """The stretches of speech (start, end seconds) in `audio` (float32, 16 kHz) that lie in
    pauses of `segments` holding at least MIN_SPEECH_SECONDS of speech by `speech_in(clip)`
    (which returns (start, end) sample offsets of speech in a clip), each padded within its
    pause. Silence between them is left out: nothing is decoded where nobody speaks."""
    out = []
    for start, end in pauses(segments, duration):
        clip = audio[int(start * RATE) : int(end * RATE)]
        found = speech_in(clip)
        if sum(e - s for s, e in found) < MIN_SPEECH_SECONDS * RATE:
            continue
        for s, e in found:
            out.append(
                (
                    round(float(max(start, start + s / RATE - PAD_SECONDS)), 3),
                    round(float(min(end, start + e / RATE + PAD_SECONDS)), 3),
                )
            )
    return out


def _words(segment: dict) -> list:
    words = [w["word"] for w in segment.get("words") or []] or segment["text"].split()
    return [t for t in (re.sub(r"[^\w']", "", w.lower()) for w in words) if t]


def _common(a: list, b: list) -> int:
    """Length of the longest common subsequence of `a` and `b`."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b):
            diagonal, row[j + 1] = row[j + 1], diagonal + 1 if x == y else max(row[j + 1], row[j])
    return row[-1]


def says(segment: dict, others: list) -> bool:
    """Whether most of the words of `segment` (REPEATED_SHARE, in order) are words of `others`."""
    mine = _words(segment)
    theirs = [w for o in others for w in _words(o)]
    return bool(mine) and _common(mine, theirs) >= REPEATED_SHARE * len(mine)


def repeats(segment: dict, recovered: list) -> bool:
    """Whether `segment` (four words or more) says again what speech recovered within 30 s of it
    says: a suspect, kept at the wrong time by the first pass while its speech was lost. (Or
    the same words said twice: the engine decodes the suspect's own span to tell.)"""
    if len(_words(segment)) < 4:
        return False
    near = [r for r in recovered if abs(r["start"] - segment["start"]) <= REPEAT_WITHIN_S]
    return says(segment, near)


def merged(segments: list, recovered: list) -> list:
    """`segments` with `recovered` put in their places by start time."""
    return sorted(segments + recovered, key=lambda s: (s["start"], s["end"]))
