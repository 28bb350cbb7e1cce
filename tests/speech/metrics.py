"""Quality metrics against the ground truth of make_eval_set.py. Stdlib only.

- WER: word edit distance / reference words, on lowercase letters-and-digits tokens, with British
  spellings mapped to American ones and titles spelled out (as Whisper's English normalizer does:
  "grey" = "gray", "Mr" = "mister"), numbers below 10 000 spelled out ("1" = "one"), and the
  hesitations that normalizer drops ("uh", "um", "hmm", "mm", "mhm", "mmm") left out of both sides.
- DER: (missed + false alarm + speaker confusion) / reference speech time, 10 ms frames, with a
  0.25 s collar around every reference turn boundary excluded, best speaker mapping.
- Word boundary error: |start - true start| and |end - true end| of every correctly recognized word
  (matched by the WER alignment); the median is reported.
- Speaker-attributed word accuracy: of the correctly recognized words, those whose speaker maps
  to the true speaker.
"""

import itertools
import math
import re
import statistics
import unicodedata

FRAME = 0.01


# The British/American pairs that occur in the evaluation set's vocabulary.
SPELLING = {"grey": "gray", "centre": "center", "colour": "color", "favourite": "favorite"}
# Titles as Whisper's English normalizer spells them out ("st" left alone: saint or street).
SPELLING.update(mr="mister", mrs="missus", dr="doctor", prof="professor", jr="junior", sr="senior")
# Hesitations Whisper's English normalizer drops: the references leave them out, and whether a
# model writes them down is a style, not an error.
HESITATIONS = {"uh", "um", "hmm", "mm", "mhm", "mmm"}


ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def spoken(n):
    """An integer below 10 000 as words ("25" -> "twenty five"), as a reference reads it."""
    if n < 20:
        return [ONES[n]]
    if n < 100:
        return [TENS[n // 10]] + ([ONES[n % 10]] if n % 10 else [])
    if n < 1000:
        return [ONES[n // 100], "hundred"] + (spoken(n % 100) if n % 100 else [])
    return spoken(n // 1000) + ["thousand"] + (spoken(n % 1000) if n % 1000 else [])


def tokens(text):
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()
    out = []
    for t in words:
        if not t.strip("'") or t in HESITATIONS:
            continue
        if t.isdigit() and len(t) <= 4:
            out += spoken(int(t))  # "press 1" and "press one" are the same words
        else:
            out.append(SPELLING.get(t, t))
    return out


def tokens_any(text):
    """Words of any language for WER: lowercase, accents taken off (the Spanish references are
    written without them), letters of any script and apostrophes kept, no number spelling."""
    text = unicodedata.normalize("NFKD", text.lower().replace("-", " "))
    text = "".join(c for c in text if not unicodedata.combining(c))
    return [t for t in re.sub(r"[^\w' ]+|_", " ", text).split() if t.strip("'")]


def align_words(ref, hyp):
    """Levenshtein alignment; returns (errors, [(ref_index, hyp_index)] of exact matches)."""
    n, m = len(ref), len(hyp)
    d = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        d[i][0] = i
    for j in range(m + 1):
        d[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1])
            )
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1] and d[i][j] == d[i - 1][j - 1]:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif d[i][j] == d[i - 1][j - 1] + 1:
            i, j = i - 1, j - 1
        elif d[i][j] == d[i - 1][j] + 1:
            i -= 1
        else:
            j -= 1
    return d[n][m], list(reversed(pairs))


def hyp_words(result):
    """Flattened (token, start, end, speaker) of a gpuhost result, one per token."""
    out = []
    for seg in result["segments"]:
        for w in seg["words"]:
            for t in tokens(w["word"]):
                out.append((t, w["start"], w["end"], w.get("speaker", seg.get("speaker"))))
    return out


def wer(truth, result):
    ref = [t for w in truth["words"] for t in tokens(w["word"])]
    hyp = [w[0] for w in hyp_words(result)]
    errors, _ = align_words(ref, hyp)
    return errors / max(1, len(ref))


def _frames(turns, n):
    labels = [None] * n
    for t in turns:
        for i in range(int(t["start"] / FRAME), min(n, int(t["end"] / FRAME))):
            labels[i] = t["speaker"]
    return labels


def best_mapping(ref_labels, hyp_labels):
    overlap = {}
    for r, h in zip(ref_labels, hyp_labels):
        if r and h:
            overlap[(r, h)] = overlap.get((r, h), 0) + 1
    return optimal_mapping(overlap)


def optimal_mapping(overlap):
    """hyp label -> ref label, one-to-one, with the most shared frames in all (every pairing
    tried: a greedy pick of the largest overlap first is wrong even for two speakers a side).
    `overlap` maps (ref, hyp) to the frames they share."""
    refs = sorted({r for r, _ in overlap})
    hyps = sorted({h for _, h in overlap})
    if math.perm(max(len(refs), len(hyps)), min(len(refs), len(hyps))) > 200_000:
        # Too many pairings to try (a diarizer that found a crowd): greedy, largest first.
        mapping, used = {}, set()
        for (r, h), _ in sorted(overlap.items(), key=lambda kv: -kv[1]):
            if h not in mapping and r not in used:
                mapping[h] = r
                used.add(r)
        return mapping
    best, best_score = {}, -1
    if len(hyps) <= len(refs):
        for perm in itertools.permutations(refs, len(hyps)):
            score = sum(overlap.get((r, h), 0) for h, r in zip(hyps, perm))
            if score > best_score:
                best, best_score = dict(zip(hyps, perm)), score
    else:
        for perm in itertools.permutations(hyps, len(refs)):
            score = sum(overlap.get((r, h), 0) for r, h in zip(refs, perm))
            if score > best_score:
                best, best_score = {h: r for r, h in zip(refs, perm)}, score
    return best


def der(truth, turns, collar=0.25):
    n = int(truth["duration"] / FRAME) + 1
    ref, hyp = _frames(truth["turns"], n), _frames(turns, n)
    excluded = [False] * n
    for t in truth["turns"]:
        for edge in (t["start"], t["end"]):
            for i in range(
                max(0, int((edge - collar) / FRAME)), min(n, int((edge + collar) / FRAME))
            ):
                excluded[i] = True
    mapping = best_mapping(ref, hyp)
    total = missed = false_alarm = confusion = 0
    for r, h, x in zip(ref, hyp, excluded):
        if x:
            continue
        if r:
            total += 1
            if not h:
                missed += 1
            elif mapping.get(h) != r:
                confusion += 1
        elif h:
            false_alarm += 1
    return (missed + false_alarm + confusion) / max(1, total), mapping


def boundary_errors(ref_words, result):
    """|reference − hypothesis| in seconds of the start and of the end of every word the two
    share (Levenshtein-matched tokens; a word that splits into several tokens gives each of them
    its times). `ref_words`: [{word, start, end}]; `result`: anything with `segments[].words[]`."""
    ref = [(t, w["start"], w["end"]) for w in ref_words for t in tokens(w["word"])]
    hyp = hyp_words(result)
    _, pairs = align_words([r[0] for r in ref], [h[0] for h in hyp])
    return [abs(ref[i][k] - hyp[j][k]) for i, j in pairs for k in (1, 2)]


def word_timing(truth, result):
    """(median boundary error in seconds, speaker-attributed word accuracy)."""
    ref = [
        (t, w["start"], w["end"], w["speaker"]) for w in truth["words"] for t in tokens(w["word"])
    ]
    hyp = hyp_words(result)
    _, pairs = align_words([r[0] for r in ref], [h[0] for h in hyp])
    turns = [
        {"start": s["start"], "end": s["end"], "speaker": s["speaker"]} for s in result["segments"]
    ]
    _, mapping = der(truth, turns)
    errors, correct = [], 0
    for i, j in pairs:
        errors += [abs(ref[i][1] - hyp[j][1]), abs(ref[i][2] - hyp[j][2])]
        correct += mapping.get(hyp[j][3]) == ref[i][3]
    median = statistics.median(errors) if errors else float("inf")
    return median, correct / max(1, len(pairs))


def evaluate(truth, result):
    d, _ = der(
        truth,
        result.get("turns")
        or [
            {"start": s["start"], "end": s["end"], "speaker": s["speaker"]}
            for s in result["segments"]
        ],
    )
    boundary, attributed = word_timing(truth, result)
    return {
        "wer": wer(truth, result),
        "der": d,
        "boundary_ms": boundary * 1000,
        "speaker_words": attributed,
        "speakers_found": len(result.get("speakers", [])),
        "speakers_true": len(truth["speakers"]),
    }


def der_overlap(ref_turns, hyp_turns, span, collar=0.25):
    """DER with overlapped speech scored (NIST style): per 10 ms frame inside `span` and outside
    the collar around every reference boundary, missed = max(0, |ref| - |hyp|), false alarm =
    max(0, |hyp| - |ref|), confusion = min(|ref|, |hyp|) - correctly mapped speakers, over the
    sum of |ref|; one speaker mapping for the whole recording, the one sharing the most frames."""
    errors, total = der_overlap_counts(ref_turns, hyp_turns, span, collar)
    return errors / max(1, total)


def der_overlap_counts(ref_turns, hyp_turns, span, collar=0.25):
    """`der_overlap`'s (errors, scored reference speaker-frames): a set's DER is the sum of one
    over the sum of the other (corpus level), not a mean of the recordings' DERs."""
    start, end = span
    n = int((end - start) / FRAME) + 1

    def sets(turns):
        frames = [set() for _ in range(n)]
        for t in turns:
            a, b = int((t["start"] - start) / FRAME), int((t["end"] - start) / FRAME)
            for i in range(max(0, a), min(n, b)):
                frames[i].add(t["speaker"])
        return frames

    ref, hyp = sets(ref_turns), sets(hyp_turns)
    excluded = [False] * n
    for t in ref_turns:
        for edge in (t["start"], t["end"]):
            a, b = int((edge - collar - start) / FRAME), int((edge + collar - start) / FRAME)
            for i in range(max(0, a), min(n, b)):
                excluded[i] = True
    overlap = {}
    for r, h in zip(ref, hyp):
        for x in r:
            for y in h:
                overlap[(x, y)] = overlap.get((x, y), 0) + 1
    mapping = optimal_mapping(overlap)
    total = errors = 0
    for r, h, x in zip(ref, hyp, excluded):
        if x:
            continue
        total += len(r)
        hits = len({mapping.get(y) for y in h} & r)
        errors += max(len(r), len(h)) - hits
    return errors, total
