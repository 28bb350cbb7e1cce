"""Clustering choices of the overlap diarizer, measured on the real meeting clips and calls.

    workers/diarizer/.venv/bin/python benches/diarizer_tune.py [VARIANT ...]

Cells: DER (recordings with the right speaker count / recordings); for `long` (90 s recordings
of one voice) only the count. Steps 1 and 2 of the engine (segmentation, one embedding per local speaker and window) run once
per recording and are cached under `.bench/tune/`; each variant re-runs only the clustering and
the reconstruction (overlap.assemble) with other settings, so a grid costs seconds. Only the
*tune* rows may decide; the *report* rows are printed to show what a choice does on recordings
it was not chosen on. The host-level numbers (docs/benchmarks.md) come from benches/quality.py;
these differ slightly because the audio is resampled by sox here, not by the host.
"""

import hashlib
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(REPO / "benches"),
    str(REPO / "tests/speech"),
    str(REPO / "workers/diarizer/src"),
]

import metrics  # noqa: E402
import numpy as np  # noqa: E402
import real_sets  # noqa: E402
from gpuhost_diarizer import engine, overlap, overlap_clusters  # noqa: E402
from scipy.optimize import linear_sum_assignment  # noqa: E402

CACHE = REPO / ".bench" / "tune"

# name → constants of overlap.py / overlap_clusters.py to change (the engine as it is when empty).
VARIANTS = {
    "default": {},
    "threshold 0.9": {"THRESHOLD": 0.9},
    "threshold 1.0": {"THRESHOLD": 1.0},
    "threshold 1.2": {"THRESHOLD": 1.2},
    "train ≥ 1.5 s": {"MIN_TRAIN_S": 1.5},
    "train ≥ 3 s": {"MIN_TRAIN_S": 3.0},
    "no floor": {"FLOOR_S": None},
    "floor ≥ 1 s": {"FLOOR_S": 1.0},
    "floor ≥ 3 s": {"FLOOR_S": 3.0},
    "floor in 1 window": {"FLOOR_WINDOWS": 1},
    "floor in 3 windows": {"FLOOR_WINDOWS": 3},
    "no fill": {"FILL_S": 0.0},
    "fill 0.25 s": {"FILL_S": 0.25},
    "turns of any length": {"MIN_TURN_S": 0.0},
    "turns ≥ 0.2 s": {"MIN_TURN_S": 0.2},
    "fill 1 s": {"FILL_S": 1.0},
    "neither": {"FLOOR_S": None, "FILL_S": 0.0},
    "drop the rest": {"MERGE_REST": False},
    # Not a setting: every local speaker given the reference speaker it overlaps most in its
    # window. What is left is the error of the segmentation and the reconstruction alone.
    "oracle clustering": {"ORACLE": True},
}


def locals_of(items):
    """(item, Local) for every item, computed once."""
    CACHE.mkdir(parents=True, exist_ok=True)
    diarizer = None
    out = []
    for item in items:
        # Keyed by the audio and the settings of steps 1 and 2.
        key = hashlib.sha256(Path(item["wav"]).read_bytes())
        settings = ("reuse-by-speech", overlap.STEP_S, overlap.MIN_EMBED_S, overlap.EMBED_MAX_S)
        key.update(repr(settings + (overlap.REUSE_DIFFER,)).encode())
        path = CACHE / f"{item['set']}_{item['name']}_{key.hexdigest()[:12]}.pickle"
        if not path.is_file():
            if diarizer is None:
                diarizer = overlap.OverlapDiarizer()
            with tempfile.TemporaryDirectory() as tmp:
                wav = Path(tmp) / "16k.wav"
                subprocess.run(
                    ["sox", str(item["wav"]), "-r", "16000", "-c", "1", "-b", "16", str(wav)],
                    check=True,
                )
                local = diarizer.local(engine.read_wav(str(wav)))
            path.write_bytes(pickle.dumps(local))
        out.append((item, pickle.loads(path.read_bytes())))
    return out


def score(pairs, constants):
    """{(set, split): (DER, speakers right, items)} of one variant."""
    constants = dict(constants)
    oracle = constants.pop("ORACLE", False)
    # Each constant lives in the module of the step it tunes.
    home = {k: overlap if hasattr(overlap, k) else overlap_clusters for k in constants}
    saved = {k: getattr(home[k], k) for k in constants}
    try:
        for k, v in constants.items():
            setattr(home[k], k, v)
        return _score(pairs, oracle)
    finally:
        for k, v in saved.items():
            setattr(home[k], k, v)


def oracle_labels(item, local):
    """(labels, centroids) as `overlap.cluster` gives them, from the reference: in each window,
    its local speakers to distinct reference speakers, those with most active frames in common
    (the one-to-one rule the engine's own assignment follows)."""
    speakers = sorted({t["speaker"] for t in item["turns"]})
    hop, half = overlap.FRAME_HOP / overlap.RATE, overlap.FRAME_LEN / 2 / overlap.RATE
    truth = np.zeros((len(speakers), local.frames + overlap.FRAMES), dtype=np.float32)
    for t in item["turns"]:
        a, b = (max(0, round((t[k] - half) / hop)) for k in ("start", "end"))
        truth[speakers.index(t["speaker"]), a:b] = 1
    labels = np.full(len(local.owners), -1, dtype=int)
    by_window = {}
    for i, (w, _) in enumerate(local.owners):
        by_window.setdefault(w, []).append(i)
    for w, rows in by_window.items():
        seen = truth[:, local.starts[w] : local.starts[w] + overlap.FRAMES]
        common = np.array([seen @ local.seg[w, :, local.owners[i][1]] for i in rows])
        for r, c in zip(*linear_sum_assignment(-common)):
            labels[rows[r]] = c
    return labels, np.zeros((len(speakers), 256))


def _score(pairs, oracle=False):
    rows = {}
    real_cluster = overlap.cluster
    for item, local in pairs:
        if oracle and "turns" in item:
            found = oracle_labels(item, local)
            overlap.cluster = lambda *_, found=found: found
        try:
            result = overlap.assemble(local, overlap.THRESHOLD, None, None, None, "tune")
        finally:
            overlap.cluster = real_cluster
        if "turns" not in item:  # one voice: only the speaker count is known
            row = rows.setdefault((item["set"], item["split"]), [0.0, 1.0, 0, 0])
            row[2] += len(result["speakers"]) == 1
            row[3] += 1
            continue
        # Corpus level: the split's errors over its scored speaker-frames.
        errors, total = metrics.der_overlap_counts(item["turns"], result["turns"], item["uem"])
        row = rows.setdefault((item["set"], item["split"]), [0.0, 0.0, 0, 0])
        row[0] += errors
        row[1] += total
        row[2] += len(result["speakers"]) == len({t["speaker"] for t in item["turns"]})
        row[3] += 1
    return {k: (e / s, right, n) for k, (e, s, right, n) in rows.items()}


def main():
    wanted = sys.argv[1:] or list(VARIANTS)
    # The long recordings are one voice each: a check that one voice stays one speaker.
    items = [i for i in real_sets.load() if i["set"] in ("meetings", "calls", "long")]
    pairs = locals_of(items)
    keys = sorted({(i["set"], i["split"]) for i in items}, key=lambda k: (k[0], k[1] != "tune"))
    print("| variant | " + " | ".join(f"{s} {p}" for s, p in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name in wanted:
        rows = score(pairs, VARIANTS[name])
        cells = [f"{rows[k][0]:.3f} ({rows[k][1]}/{rows[k][2]})" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
