"""The aligner's word entries and their times: what the worker returns for each ASR word
(`placed`) and the answer made of them (`result`), the ASR's own times for a language without a
model (`passthrough`), and the words' times kept in their order across pieces aligned apart
(`keep_order`). No protocol code here."""

from __future__ import annotations


def placed(word: dict, start: float, end: float, score: float, aligned: bool) -> dict:
    """The ASR's `word` with its times: the aligner's (`aligned`) or its own; the ASR's `joined`
    mark (no space before this word) kept when there is one. An aligned word keeps the ASR's
    times and probability aside (`_asr`, until `keep_order`), for when it is demoted."""
    out = {
        "word": word["word"],
        **({"joined": True} if word.get("joined") else {}),
        "start": round(start, 3),
        "end": round(end, 3),
        "score": score,
        "aligned": aligned,
    }
    if aligned and word.get("start") is not None and word.get("end") is not None:
        out["_asr"] = (word["start"], word["end"], word.get("probability", 0.0))
    return out


def segment(seg: dict, words: list) -> dict:
    """The ASR's segment `seg` with its `words` placed."""
    return {"start": seg["start"], "end": seg["end"], "text": seg.get("text", ""), "words": words}


def result(engine: str, segments: list, duration: float | None = None) -> dict:
    """What the aligner answers: its segments, their words in order (`keep_order`) and within
    the recording's `duration` (a last word aligned with the padding ran 30 ms past its end),
    and how many words it placed of how many."""
    words = [w for seg in keep_order(segments) for w in seg["words"]]
    if duration is not None:
        end = round(duration, 3)
        for item in [*words, *segments]:
            item["start"] = min(max(item["start"], 0.0), end)
            item["end"] = min(max(item["end"], item["start"]), end)
    return {
        "engine": engine,
        "segments": segments,
        "aligned_words": sum(w["aligned"] for w in words),
        "total_words": len(words),
    }


def passthrough(engine: str, segments: list, language: str) -> dict:
    """The ASR's segments with its own word times, for a language the aligner has no model for."""
    out = [
        segment(
            seg,
            [
                placed(w, w["start"], w["end"], w.get("probability", 0.0), False)
                for w in seg.get("words") or []
            ],
        )
        for seg in segments
    ]
    skipped = f"{engine} has no model for language {language!r}: word times are the ASR's"
    return {**result(engine, out), "skipped": skipped}


# How many aligned words back a word may find the one it follows: pieces aligned apart overlap
# by their 0.15 s margins, so a misplaced word is a few words out of place at most.
ORDER_WINDOW = 16


def _fits(a: dict, b: dict) -> bool:
    """Whether `b` can follow `a`: it starts after `a` ends, or their overlap can be cut in the
    middle leaving each some time."""
    if b["start"] >= a["end"]:
        return True
    cut = round((a["end"] + b["start"]) / 2, 3)
    return a["start"] < cut < b["end"]


def _in_order(aligned: list) -> set:
    """The positions in `aligned` of the most words that can keep their times in order (each
    `_fits` after the one kept before it; among equals, the earlier words are kept). A word
    more than `ORDER_WINDOW` words back is taken to fit."""
    best, back, lead = [], [], []  # chain length, previous in it; best chain up to each position
    for j, b in enumerate(aligned):
        far = j - ORDER_WINDOW - 1
        length, prev = (lead[far][0] + 1, lead[far][1]) if far >= 0 else (1, -1)
        for i in range(max(0, far + 1), j):
            if best[i] + 1 > length and _fits(aligned[i], b):
                length, prev = best[i] + 1, i
        best.append(length)
        back.append(prev)
        lead.append(max(lead[-1], (length, j), key=lambda t: t[0]) if lead else (length, j))
    keep, j = set(), (lead[-1][1] if lead else -1)
    while j >= 0:
        keep.add(j)
        j = back[j]
    return keep


def _demote(w: dict) -> None:
    """`w` is no longer counted aligned: it gets back the ASR's times and probability."""
    w["aligned"] = False
    if "_asr" in w:
        start, end, probability = w["_asr"]
        w["start"], w["end"], w["score"] = round(start, 3), round(end, 3), probability


def keep_order(segments: list) -> list:
    """`segments` with their words' times made to follow the words' order, across segments too.
    Pieces aligned apart (neighbouring segments, the halves of one) each see the same 0.15 s
    margin around their edge, so the last word of one and the first of the next can overlap; a
    word left with the ASR's rough times can sit anywhere near its aligned neighbours.

    Aligned words first: the most of them that can keep their order stay aligned, and where one
    starts before the one before it ends, the two meet in the middle of the overlap. The others
    (placed before a word before them, or inside it: the pieces disagree about where they are)
    are no longer counted aligned and get back the ASR's times; one bad word costs only itself,
    not the good words after it. Then each word left unaligned is fitted between the words
    around it (the one before it, as placed, and the next aligned one): it moves, they do not.
    The words then keep their order wherever they are sorted."""
    words = [w for seg in segments for w in seg["words"]]
    aligned = [w for w in words if w["aligned"]]
    keep = _in_order(aligned)
    last = None  # the last word still counted aligned
    for k, b in enumerate(aligned):
        if k not in keep or (last is not None and not _fits(last, b)):
            _demote(b)
            continue
        if last is not None and b["start"] < last["end"]:
            last["end"] = b["start"] = round((last["end"] + b["start"]) / 2, 3)
        last = b
    before = float("-inf")
    for i, w in enumerate(words):
        w.pop("_asr", None)
        if not w["aligned"]:
            after = next((n["start"] for n in words[i + 1 :] if n["aligned"]), float("inf"))
            w["start"] = min(max(w["start"], before), after)
            w["end"] = min(max(w["end"], w["start"]), after)
        before = w["end"]
    return segments
