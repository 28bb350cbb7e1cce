"""Voiceprints on real recordings: how the enrolled-voice threshold was chosen, and what naming
gives through the diarizer engines. Runs in the diarizer's venv:

    workers/diarizer/.venv/bin/python benches/voiceprints.py [THRESHOLD]

The meeting clips (`real_sets.meetings`) carry AMI's global speaker ids, so one person appears
in several clips. Each speaker of each clip is enrolled from their reference turns minus
everyone else's (at least 2 s of speech alone, as `POST /speakers` demands).

1. Pairs: every two voiceprints of different clips, same person or not; cosine scores and, per
   threshold, the share of same-person pairs missed and of different-person pairs accepted.
2. Naming: each clip diarized by the engine, its speakers named after the voices enrolled from
   the *other* clips (the mean of a person's samples). A speaker counts as `right` when it gets
   the name of the person with most of its reference speech, `wrong` for another name, `missed`
   when that person was enrolled but it kept `SPEAKER_nn`, `kept` when they were not (correct).

Split: pyannote's train clips are `tune` (the threshold was chosen there), development and test
clips are `report`.
"""

import collections
import itertools
import sys
import unicodedata
from pathlib import Path

import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_sets  # noqa: E402
from gpuhost_diarizer import voiceprint  # noqa: E402
from gpuhost_diarizer.engine import load  # noqa: E402
from gpuhost_diarizer.resnet import SpeakerEmbedder  # noqa: E402


def person(label):
    return unicodedata.normalize("NFC", label)


def read(path):
    audio, rate = soundfile.read(str(path), dtype="float32")
    assert rate == 16000, rate
    return audio if audio.ndim == 1 else audio.mean(axis=1)


def enrolled(clips, embedder):
    """{(clip, person): vector} from each person's speech alone."""
    out = {}
    for clip in clips:
        audio = read(clip["wav"])
        for who in {t["speaker"] for t in clip["turns"]}:
            mine = [(t["start"], t["end"]) for t in clip["turns"] if t["speaker"] == who]
            rest = [(t["start"], t["end"]) for t in clip["turns"] if t["speaker"] != who]
            try:
                v = voiceprint.enroll(embedder, audio, voiceprint._minus(mine, rest))["vector"]
            except voiceprint.EnrollError:
                continue
            out[(clip["name"], person(who))] = np.array(v)
    return out


def pairs(prints, split_of):
    for split in ("tune", "report"):
        keys = [k for k in prints if split_of[k[0]] == split]
        same, other = [], []
        for a, b in itertools.combinations(keys, 2):
            if a[0] != b[0]:
                (same if a[1] == b[1] else other).append(float(prints[a] @ prints[b]))
        same, other = np.array(same), np.array(other)
        print(f"\n{split}: {len(keys)} voiceprints; same person {len(same)} pairs", end="")
        print(f" (scores {', '.join(f'{x:.3f}' for x in sorted(same))}),", end="")
        print(
            f" different {len(other)} pairs (max {other.max():.3f}, median {np.median(other):.3f})"
        )
        print("| threshold | same person missed | different accepted |\n|---|---|---|")
        for th in (0.3, 0.35, 0.4, 0.45, 0.5, 0.6):
            print(f"| {th} | {np.mean(same < th):.2f} | {np.mean(other >= th):.3f} |")


def naming(clips, prints, split_of, embedder, threshold):
    print(f"\nNaming at threshold {threshold} (speakers the engine found):")
    print(
        "| engine | split | speakers | right | wrong | missed | kept |\n|---|---|---|---|---|---|---|"
    )
    for name in ("vad-dvector", "overlap"):
        engine = load(name, {})
        for split in ("tune", "report"):
            counts = collections.Counter()
            for clip in (c for c in clips if split_of[c["name"]] == split):
                samples = collections.defaultdict(list)
                for (where, who), v in prints.items():
                    if where != clip["name"]:
                        samples[who].append(v)
                voices = [
                    {"name": w, "vector": list(np.mean(v, axis=0))} for w, v in samples.items()
                ]
                audio = read(clip["wav"])
                result = engine.diarize(audio)
                named = voiceprint.identify(embedder, audio, result, voices, threshold)
                for ident in named.get("identities", []):
                    spans = [
                        (t["start"], t["end"])
                        for t in result["turns"]
                        if t["speaker"] == ident["cluster"]
                    ]
                    held = collections.Counter()
                    for t in clip["turns"]:
                        for s, e in spans:
                            held[person(t["speaker"])] += max(
                                0.0, min(e, t["end"]) - max(s, t["start"])
                            )
                    major = held.most_common(1)[0][0] if held else None
                    counts["speakers"] += 1
                    if ident["voiceprint"] is None:
                        counts["missed" if major in samples else "kept"] += 1
                    else:
                        counts["right" if ident["voiceprint"] == major else "wrong"] += 1
            row = [counts[k] for k in ("speakers", "right", "wrong", "missed", "kept")]
            print(f"| {name} | {split} | " + " | ".join(map(str, row)) + " |")


def main():
    threshold = float(sys.argv[1]) if len(sys.argv) > 1 else voiceprint.THRESHOLD
    clips = real_sets.meetings(real_sets.fetch())
    split_of = {c["name"]: c["split"] for c in clips}
    embedder = SpeakerEmbedder()
    prints = enrolled(clips, embedder)
    pairs(prints, split_of)
    naming(clips, prints, split_of, embedder, threshold)


if __name__ == "__main__":
    main()
