"""Speech quality benchmark: WER, DER (collar 0.25 s), median word-boundary error and
speaker-attributed word accuracy per recording of the evaluation set, and the pipeline's
real-time factor resident vs oneshot, with the host's own overhead.

    cargo build --release && python3 benches/quality.py      (GPUHOST_BIN overrides the binary)

Host overhead = request wall time − the time the pipeline's stages ran (first stage's job sent →
last stage's `done`, as the host measured it: `pipeline_seconds`), i.e. intake, queueing, merging
and streaming, as a share of that time.
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/speech"))

import harness  # noqa: E402
import metrics  # noqa: E402


def run(mode, folder, names, rounds):
    server = harness.Server(mode=mode)
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
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
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
