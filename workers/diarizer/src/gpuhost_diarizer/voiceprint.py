"""Voiceprints: a speaker's ResNet34 embedding from a few seconds of their speech, and the
naming of a diarization's speakers after the enrolled voices they match. No protocol code here.

A voiceprint is the mean of unit embeddings of 1–3 s pieces of speech (at most `MAX_SPEECH_S` of
it), itself a unit vector; two voices score their cosine similarity. The host keeps the
voiceprints; a diarization task carries them, and `identify` renames each speaker whose voice
scores at least the threshold against one of them (one name per speaker, one speaker per name).
"""

from __future__ import annotations

import numpy as np

from .resnet import DIM, RATE, SpeakerEmbedder

PIECE_S = 3.0  # the span one embedding looks at (as the overlap engine's)
MIN_PIECE_S = 1.0  # shorter pieces are left out (while longer ones exist)
MAX_SPEECH_S = 30.0  # the speech a voiceprint or a speaker's identity is taken from
MIN_ENROLL_S = 2.0  # less speech than this is refused at enrolment
THRESHOLD = 0.4  # cosine similarity from which a speaker gets an enrolled name
MIN_IDENTIFY_S = 1.5  # a speaker with less speech keeps its SPEAKER_nn label


class EnrollError(ValueError):
    """The audio cannot give a voiceprint (too little speech in it)."""


def union(spans: list) -> list:
    """`spans` sorted, overlapping and touching ones made one (no second counted twice)."""
    out: list = []
    for s, e in sorted((float(s), float(e)) for s, e in spans if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def pieces(spans: list, min_s: float = MIN_PIECE_S) -> list:
    """The audio one embedding each looks at: lists of [start, end] spans. A span of `min_s` or
    more is cut into parts of at most PIECE_S; shorter ones (speech in short phrases, a list of
    names) are joined in time order up to PIECE_S of speech, so that none of it is lost. Longest
    first, up to MAX_SPEECH_S in all; a piece under `min_s` only when there is nothing longer."""
    spans = union(spans)
    groups: list = []
    for start, end in (x for x in spans if x[1] - x[0] >= min_s):
        k = max(1, int(np.ceil((end - start) / PIECE_S)))
        cuts = [start + (end - start) * i / k for i in range(k + 1)]
        groups.extend([(a, b)] for a, b in zip(cuts, cuts[1:]))
    joined: list = []
    for span in (x for x in spans if x[1] - x[0] < min_s):
        joined.append(span)
        if _speech(joined) >= PIECE_S:
            groups.append(joined)
            joined = []
    if joined:
        groups.append(joined)
    out, total = [], 0.0
    for group in sorted(groups, key=lambda g: -_speech(g)):
        if _speech(group) < min_s and out:
            continue
        out.append(group)
        total += _speech(group)
        if total >= MAX_SPEECH_S:
            break
    return out


def _speech(spans: list) -> float:
    return sum(b - a for a, b in spans)


def embed_spans(embedder: SpeakerEmbedder, audio: np.ndarray, spans: list) -> tuple:
    """(unit mean embedding or None, seconds of speech it is taken from)."""
    vectors, weights = [], []
    for group in pieces(spans):
        piece = np.concatenate([audio[int(a * RATE) : int(b * RATE)] for a, b in group])
        if len(piece) < int(0.3 * RATE):
            continue
        vectors.append(embedder.embed(embedder.fbank(piece)))
        weights.append(len(piece) / RATE)
    if not vectors:
        return None, 0.0
    mean = np.average(np.array(vectors), axis=0, weights=weights)
    return mean / (np.linalg.norm(mean) + 1e-12), float(sum(weights))


def one_voice(diarization: dict) -> list:
    """The spans of a sample's one voice, from its diarization: the speaker with the most
    speech, less what others say over it. Refused (`EnrollError`) when another voice has at
    least `MIN_ENROLL_S` and a fifth as much speech: a voiceprint of two people names both
    (a meeting given as one person's sample named two of its speakers after them). A short
    reply or a cough of someone else is left out, not refused."""
    turns = diarization.get("turns") or []
    speech: dict = {}
    for t in turns:
        speech.setdefault(t["speaker"], []).append((t["start"], t["end"]))
    if not speech:
        return []
    seconds = {who: _speech(union(spans)) for who, spans in speech.items()}
    main = max(seconds, key=seconds.get)
    others = sorted(
        (
            s
            for who, s in seconds.items()
            if who != main and s >= max(MIN_ENROLL_S, seconds[main] / 5)
        ),
        reverse=True,
    )
    if others:
        heard = ", ".join(f"{s:.0f} s" for s in [seconds[main], *others])
        raise EnrollError(
            f"the sample holds {1 + len(others)} voices ({heard} of speech): send audio of this "
            "voice alone, or say where it speaks (`segments`, or a transcript and its `speaker`)"
        )
    rest = [span for who, spans in speech.items() if who != main for span in spans]
    return _minus(union(speech[main]), union(rest))


def enroll(embedder: SpeakerEmbedder, audio: np.ndarray, spans: list | None) -> dict:
    """A voiceprint from `spans` of `audio` (all of it when None). Silence adds nothing: the
    caller passes speech spans (the worker finds them with its VAD when none are given)."""
    duration = len(audio) / RATE
    if spans is None:
        spans = [(0.0, duration)]
    spans = [(max(0.0, s), min(duration, e)) for s, e in spans]
    vector, seconds = embed_spans(embedder, audio, spans)
    if vector is None or seconds < MIN_ENROLL_S:
        raise EnrollError(
            f"only {seconds:.1f} s of speech to learn the voice from; "
            f"give at least {MIN_ENROLL_S:.0f} s (5–30 s is best)"
        )
    return {"vector": [round(float(x), 6) for x in vector], "seconds": round(seconds, 2)}


def identify(
    embedder: SpeakerEmbedder,
    audio: np.ndarray,
    result: dict,
    voiceprints: list,
    threshold: float = THRESHOLD,
) -> dict:
    """`result` (a diarization) with the speakers that match an enrolled voice renamed after it,
    and `identities`: every speaker's best match and its score."""
    prints = [
        p
        for p in voiceprints
        if len(p.get("vector") or ()) == DIM
        and all(isinstance(x, (int, float)) for x in p["vector"])
        and np.isfinite(np.asarray(p["vector"], dtype=np.float64)).all()
    ]
    labels = sorted({t["speaker"] for t in result["turns"]})
    if not prints:
        return result
    if not labels:
        return {**result, "identities": []}
    overlaps = result.get("overlaps") or []
    vectors, seconds = [], []
    for label in labels:
        spans = [(t["start"], t["end"]) for t in result["turns"] if t["speaker"] == label]
        vector, s = embed_spans(embedder, audio, _minus(spans, overlaps))
        if vector is None:  # all of it overlapped: take it anyway
            vector, s = embed_spans(embedder, audio, spans)
        vectors.append(vector if vector is not None else np.zeros(DIM))
        seconds.append(s)
    known = np.array([p["vector"] for p in prints], dtype=np.float32)
    known /= np.linalg.norm(known, axis=1, keepdims=True) + 1e-12
    scores = np.array(vectors) @ known.T  # (speakers, voiceprints)
    best = scores.argmax(axis=1)
    # Each speaker is named after its best match alone: two speakers that both match one voice
    # are one person the clustering split, and become one.
    names = {
        label: prints[best[i]]["name"]
        for i, label in enumerate(labels)
        if scores[i, best[i]] >= threshold and seconds[i] >= MIN_IDENTIFY_S
    }
    identities = [
        {
            "speaker": names.get(label, label),
            "cluster": label,
            "voiceprint": names.get(label),
            "best": prints[best[i]]["name"],
            "score": round(float(scores[i, best[i]]), 3),
            "speech_s": round(seconds[i], 2),
        }
        for i, label in enumerate(labels)
    ]
    out = dict(result)
    if len(set(names.values())) < len(names):
        # Two speakers became one person: their turns join, and where only they overlapped
        # nobody else talks over anyone.
        out["turns"] = _merged(result["turns"], names)
        if "overlaps" in result:
            out["overlaps"] = overlaps_of(out["turns"])
    else:
        out["turns"] = [
            {**t, "speaker": names.get(t["speaker"], t["speaker"])} for t in result["turns"]
        ]
    out["speakers"] = sorted({t["speaker"] for t in out["turns"]})
    out["identities"] = identities
    return out


def _merged(turns: list, names: dict) -> list:
    """Turns renamed, in time order; the overlapping or touching turns of one person that came
    from different speakers made one (the others are left as the engine gave them)."""
    out: list = []
    last: dict = {}  # person -> index in `out` of their latest renamed turn
    for t in sorted(turns, key=lambda t: (t["start"], t["end"])):
        who = names.get(t["speaker"])
        i = last.get(who)
        if who is not None and i is not None and out[i]["end"] >= t["start"] - 0.01:
            out[i]["end"] = max(out[i]["end"], t["end"])
            continue
        out.append({**t, "speaker": who or t["speaker"]})
        if who is not None:
            last[who] = len(out) - 1
    return out


def overlaps_of(turns: list) -> list:
    """Spans where turns of two or more speakers overlap."""
    edges = sorted([(t["start"], 1) for t in turns] + [(t["end"], -1) for t in turns])
    out, talking, since = [], 0, None
    for at, step in edges:
        talking += step
        if talking >= 2 and since is None:
            since = at
        elif talking < 2 and since is not None:
            if at > since:
                out.append([round(since, 3), round(at, 3)])
            since = None
    return out


def _minus(spans: list, cuts: list) -> list:
    """`spans` with the parts inside any of `cuts` removed."""
    out = []
    for s, e in spans:
        parts = [(s, e)]
        for a, b in cuts:
            parts = [
                part
                for ps, pe in parts
                for part in ((ps, min(pe, a)), (max(ps, b), pe))
                if part[1] - part[0] > 0.05
            ]
        out += parts
    return out
