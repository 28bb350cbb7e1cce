"""Speech quality benchmark. First the real recordings (`benches/real_sets.py`: telephone prompts,
read speech, meeting clips; fetched from the registries on first use): corpus WER per set and
split, overlap-scored DER (collar 0.25 s) on the meeting clips, real-time factor; the median
word-boundary error on the real recordings with word times (`benches/word_times_set.py`). Then the
espeak-ng set, a unit check only: WER, DER, median word-boundary error and speaker-attributed
word accuracy per recording, and the pipeline's real-time factor resident vs oneshot, with the
host's own overhead.

    cargo build --release && python3 benches/quality.py [ROUNDS] [--real-only]
        [--sets=asterisk,meetings,wordtimes,...] [--diarizer=ENGINE] [--asr=ENGINE]
        [--asr-options='{ beam_size = 5 }']
    (GPUHOST_BIN overrides the binary; --diarizer / --asr run the real sets with that engine,
    --asr-options with those worker options, a TOML inline table)

Host overhead = request wall time − the time the pipeline's stages ran (first stage's job sent →
last stage's `done`, as the host measured it: `pipeline_seconds`), i.e. intake, queueing, merging
and streaming, as a share of that time.
"""

import json
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/speech"))

import harness  # noqa: E402
import metrics  # noqa: E402
import real_sets  # noqa: E402
import word_times_set  # noqa: E402

# Targets of issue 11 for the default CPU pipeline, by set.
TARGETS = {"asterisk": ("WER", 0.10), "librivox": ("WER", 0.05), "cards": ("WER", 0.05)}
TARGETS["wideband"] = ("WER", 0.05)  # the read-speech target, for wideband speech
TARGETS["meetings"] = ("DER", 0.15)
TARGETS["calls"] = ("DER", 0.05)
TARGETS["long"] = ("WER", 0.10)  # telephone speech, as the asterisk prompts it is made of
for _lang in real_sets.LANGUAGES:  # no target in the issue: transcribed, not English
    TARGETS[f"asterisk-{_lang}"] = ("WER", None)


def real_report(sets=None, engines=None, options=None):
    """Every real item once through a resident server: ASR sets with `?stages=asr`, meeting clips
    with `?stages=diarizer`; one row per set and split."""
    items = [i for i in real_sets.load() if not sets or i["set"] in sets]
    # A report prompt that says the same as a tune prompt (another take of it) is no test of
    # what was tuned: left out of the scores (it still is in the `long` and `calls` recordings).
    seen = sum(bool(i.get("seen")) for i in items)
    items = [i for i in items if not i.get("seen")]
    if seen:
        print(f"# left out: {seen} report prompts whose text a tune prompt also says\n")
    server = harness.Server(mode="resident", engines=engines, options=options)
    rows = {}
    try:
        with server.request("/workers") as r:
            asr = next(w for w in json.load(r)["workers"] if w["name"] == "asr")
        known = set((asr.get("loaded") or {}).get("languages") or ["en"])
        skipped = sorted({i["set"] for i in items if i.get("language", "en") not in known})
        if skipped:
            print(f"# skipped {', '.join(skipped)}: the ASR model is English-only (--asr=base)\n")
        for item in items:
            if item.get("language", "en") not in known:
                continue
            key = (item["set"], item["split"])
            row = rows.setdefault(
                key, {"n": 0, "err": 0.0, "ref": 0, "audio": 0.0, "wall": 0.0, "failed": 0}
            )
            stages = "diarizer" if "turns" in item else "asr"
            query = f"?stages={stages}"
            if "language" in item:
                # Detected first (the language left out), then transcribed as that language.
                events, _ = server.transcribe(item["wav"], query)
                detected = events[-1].get("result", {}).get("language")
                row["detected"] = row.get("detected", 0) + (detected == item["language"])
                query += f"&language={item['language']}"
            events, wall = server.transcribe(item["wav"], query)
            last = events[-1]
            row["n"] += 1
            row["wall"] += wall
            # A failed request scores as if nothing was heard (it never drops out of the set).
            result = last["result"] if last.get("type") == "result" else None
            if result is None:
                row["failed"] += 1
            else:
                row["audio"] += result.get("duration") or 0.0
            if "turns" in item:
                turns = result["stages"]["diarizer"]["turns"] if result else []
                # Corpus level: the split's errors over its scored speaker-frames.
                errors, total = metrics.der_overlap_counts(item["turns"], turns, item["uem"])
                row["err"] += errors
                row["ref"] += total
                found = len({t["speaker"] for t in turns})
                true = len({t["speaker"] for t in item["turns"]})
                row.setdefault("speakers", []).append(f"{found}/{true}")
            else:
                if "language" in item:
                    ref = metrics.tokens_any(item["text"])
                    hyp = metrics.tokens_any(result.get("text", "")) if result else []
                else:
                    ref = metrics.tokens(item["text"])
                    hyp = [w[0] for w in metrics.hyp_words(result)] if result else []
                errors, _ = metrics.align_words(ref, hyp)
                row["err"] += errors
                row["ref"] += len(ref)
    finally:
        server.stop()
    chosen = ", ".join(
        [f"{w} engine `{e}`" for w, e in (engines or {}).items()]
        + [f"{w} options `{o}`" for w, o in (options or {}).items()]
    )
    print(f"# real recordings ({chosen or 'default CPU engines'}, 3 workers resident, 2 cores)\n")
    print("| set | split | items | audio min | metric | value | target | RTF | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (set_name, split), r in sorted(rows.items()):
        metric, target = TARGETS[set_name]
        value = r["err"] / max(1e-9, r["ref"])
        mark = "—" if target is None else ("✓" if value <= target else "✗") + f" ≤ {target:.2f}"
        note = f"speakers found/true: {' '.join(r['speakers'])}" if "speakers" in r else ""
        if "detected" in r:
            note += f"language detected right: {r['detected']}/{r['n']}"
        if r["failed"]:
            note += f" {r['failed']} failed"
        print(
            f"| {set_name} | {split} | {r['n']} | {r['audio'] / 60:.1f} | {metric} | {value:.3f} "
            f"| {mark} | {r['wall'] / max(1e-9, r['audio']):.3f} | {note} |"
        )
    print()


def word_times_report(engines=None, options=None):
    """The `wordtimes` recordings once each through a resident server with `?stages=asr,aligner`:
    median word-boundary error of the aligner's times, and of the ASR's own (a second request
    with `?stages=asr`), per kind of reference (hand-labelled, aligner-made)."""
    items = word_times_set.load(real_sets.CACHE)
    server = harness.Server(mode="resident", engines=engines, options=options)
    rows = {}
    try:
        for item in items:
            events, _ = server.transcribe(item["wav"], "?stages=asr,aligner")
            row = rows.setdefault(
                item["reference"], {"n": 0, "words": 0, "err": 0, "aligner": [], "asr": []}
            )
            row["n"] += 1
            ref = metrics.tokens(item["text"])
            row["words"] += len(ref)  # WER over the scored tokens (hesitations left out)
            result = events[-1].get("result")
            if result is None:
                row["failed"] = row.get("failed", 0) + 1
                row["err"] += len(ref)
                continue
            row["err"] += metrics.align_words(ref, [w[0] for w in metrics.hyp_words(result)])[0]
            row["aligner"] += metrics.boundary_errors(item["words"], result)
            events, _ = server.transcribe(item["wav"], "?stages=asr")  # the ASR's own times
            if events[-1].get("result") is not None:
                row["asr"] += metrics.boundary_errors(item["words"], events[-1]["result"])
    finally:
        server.stop()
    print("# word boundaries on real speech (`wordtimes`, report only; ?stages=asr,aligner)\n")
    print(
        "| reference | items | words | WER | boundaries scored | median error, aligner "
        "| within 80 ms, aligner | median error, ASR's own times | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, r in sorted(rows.items(), key=lambda kv: kv[0] != "hand"):
        aligner, asr = r["aligner"], r["asr"]
        median = statistics.median(aligner) if aligner else float("inf")
        within = sum(e <= 0.08 for e in aligner) / max(1, len(aligner))
        mark = ("✓" if median <= 0.08 else "✗") + " ≤ 80 ms"
        note = f" ({r['failed']} failed)" if r.get("failed") else ""
        print(
            f"| {kind}{note} | {r['n']} | {r['words']} | {r['err'] / max(1, r['words']):.3f} "
            f"| {len(aligner)} | {median * 1000:.0f} ms | {within:.2f} "
            f"| {statistics.median(asr) * 1000 if asr else float('inf'):.0f} ms | {mark} |"
        )
    print()


def run(mode, folder, names, rounds):
    # The espeak-ng voices are too alike for the default `overlap` diarizer's embedding (trained
    # on real people): the unit check runs `vad-dvector`, as tests/speech does.
    server = harness.Server(mode=mode, engines={"diarizer": "vad-dvector"})
    try:
        server.transcribe(folder / f"{names[0]}.wav")  # warm-up (page cache, first-call paths)
        rows = {}
        for name in names:
            samples = []
            for _ in range(rounds):
                events, wall = server.transcribe(folder / f"{name}.wav")
                result = events[-1]["result"]
                samples.append((wall, result["pipeline_seconds"], result))
            wall = statistics.median(s[0] for s in samples)
            stage = statistics.median(s[1] for s in samples)
            rows[name] = {"wall": wall, "stages": stage, "result": samples[0][2]}
        return rows
    finally:
        server.stop()


def main():
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return
    valued = {"--sets", "--diarizer", "--asr", "--asr-options"}
    for a in sys.argv[1:]:
        if not a.startswith("-"):
            if not a.isdigit():
                sys.exit(f"{a!r} is not a number of rounds; see --help")
            continue
        name, is_set, _ = a.partition("=")
        if name in valued and not is_set:
            sys.exit(f"{name} takes a value: {name}=...; see --help")
        if a != "--real-only" and name not in valued:
            sys.exit(f"unknown option {a}; see --help")
    # A SIGTERM (a CI timeout, `kill`) ends the run through the `finally`s that stop its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(args[0]) if args else 3
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    sets = flags["sets"].split(",") if "sets" in flags else None
    engines = {w: flags[w] for w in ("diarizer", "asr") if w in flags}
    options = {"asr": flags["asr-options"]} if "asr-options" in flags else None
    others = None if sets is None else [s for s in sets if s != "wordtimes"]
    if others is None or others:
        real_report(others, engines, options)
    if not sets or "wordtimes" in sets:
        word_times_report(engines, options)
    if "--real-only" in sys.argv:
        return
    folder, names = harness.eval_set()
    resident = run("resident", folder, names, rounds)
    oneshot = run("oneshot", folder, names, 1)
    print(
        f"# speech quality and speed (median of {rounds} runs resident, 1 oneshot; 2-core CPU, default engines)\n"
    )
    print(
        "| recording | dur s | WER | DER | boundary ms | spk words | speakers | RTF resident | RTF oneshot | resident/oneshot | host overhead |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    totals = {}
    for name in names:
        truth = json.loads((folder / f"{name}.json").read_text())
        m = metrics.evaluate(truth, resident[name]["result"])
        dur = truth["duration"]
        r, o = resident[name], oneshot[name]
        overhead = (r["wall"] - r["stages"]) / r["stages"]
        print(
            f"| {name} | {dur:.1f} | {m['wer']:.3f} | {m['der']:.3f} | {m['boundary_ms']:.0f} | {m['speaker_words']:.3f} "
            f"| {m['speakers_found']}/{m['speakers_true']} | {r['wall'] / dur:.3f} | {o['wall'] / dur:.3f} "
            f"| {r['wall'] / o['wall']:.2f} | {overhead * 100:.2f} % |"
        )
        row = {
            "wer": m["wer"],
            "der": m["der"],
            "boundary": m["boundary_ms"],
            "spk": m["speaker_words"],
            "rtf_r": r["wall"] / dur,
            "rtf_o": o["wall"] / dur,
            "ratio": r["wall"] / o["wall"],
            "overhead": overhead * 100,
        }
        for group in ("all", truth["set"]):
            for k, v in row.items():
                totals.setdefault(group, {}).setdefault(k, []).append(v)
    for group in ["conversation", "turn-taking", "all"]:
        if group not in totals:
            continue
        med = {k: statistics.median(v) for k, v in totals[group].items()}
        print(
            f"| **median, {group}** | | {med['wer']:.3f} | {med['der']:.3f} | {med['boundary']:.0f} | {med['spk']:.3f} "
            f"| | {med['rtf_r']:.3f} | {med['rtf_o']:.3f} | {med['ratio']:.2f} | {med['overhead']:.2f} % |"
        )


if __name__ == "__main__":
    main()
