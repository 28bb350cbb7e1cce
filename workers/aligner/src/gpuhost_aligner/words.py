"""The aligner's word entries and their times: what the worker returns for each ASR word
(`placed`) and the answer made of them (`result`), the ASR's own times for a language without a
model (`passthrough`), and the words' times kept in their order across pieces aligned apart
(`keep_order`). No protocol code here."""

from __future__ import annotations


def placed(word: dict, start: float, end: float, score: float, aligned: bool) -> dict:
    """The ASR's `word` with its times: the aligner's (`aligned`) or its own; the ASR's `joined`
    mark (no space before this word) kept when there is one."""
    return {
        "word": word["word"],
        **({"joined": True} if word.get("joined") else {}),
        "start": round(start, 3),
        "end": round(end, 3),
        "score": score,
        "aligned": aligned,
    }


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


def keep_order(segments: list) -> list:
    """`segments` with their words' times made to follow the words' order, across segments too.
    Pieces aligned apart (neighbouring segments, the halves of one) each see the same 0.15 s
    margin around their edge, so the last word of one and the first of the next can overlap; a
    word left with the ASR's rough times can sit anywhere near its aligned neighbours.

    Aligned words first: where one starts before the one before it ends, the two meet in the
    middle of the overlap. Where that middle would leave either with no time at all (the later
    one placed before the earlier one starts, or inside it), the two pieces disagree about where
    the words are: the later word is no longer counted aligned (it used to come out `aligned`
    with a length of zero). Then each word left unaligned is fitted between the words around it
    (the one before it, as placed, and the next aligned one): it moves, they do not. The words
    then keep their order wherever they are sorted."""
    words = [w for seg in segments for w in seg["words"]]
    last = None  # the last word still counted aligned
    for b in (w for w in words if w["aligned"]):
        if last is not None and b["start"] < last["end"]:
            cut = round((last["end"] + b["start"]) / 2, 3)
            if cut <= last["start"] or cut >= b["end"]:
                b["aligned"] = False
                continue
            last["end"] = b["start"] = cut
        last = b
    before = float("-inf")
    for i, w in enumerate(words):
        if not w["aligned"]:
            after = next((n["start"] for n in words[i + 1 :] if n["aligned"]), float("inf"))
            w["start"] = min(max(w["start"], before), after)
            w["end"] = min(max(w["end"], w["start"]), after)
        before = w["end"]
    return segments
