"""The WeSpeaker ResNet34 speaker embedding on ONNX Runtime, with its Kaldi fbank input. The
overlap engine and the voiceprints share it. No protocol code here."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

RATE = 16000
DIM = 256
# The embedding sees a new input length at nearly every call (speech stretches of up to 3 s), and
# ONNX Runtime's default, cuDNN's exhaustive search, times every convolution again for each new
# length: 4-5x slower on an H200 than the heuristic choice, with the same output
# (docs/benchmarks.md, "On a real GPU").
CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}


def session(blob: bytes, threads: int, providers: list | None = None):
    """An ONNX Runtime session over a carved model. `providers` with CUDA needs onnxruntime-gpu:
    never a silent fall back to CPU, since the GPU's memory plan counts on this worker."""
    import onnxruntime as ort

    if providers and "CUDAExecutionProvider" in providers:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(
                "device = cuda needs onnxruntime with CUDA in the diarizer's venv "
                "(`onnxruntime-gpu` instead of `onnxruntime`); this one has "
                f"{', '.join(ort.get_available_providers())}"
            )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(blob, options, providers=with_options(providers))


def with_options(providers: list | None) -> list:
    """The providers as ONNX Runtime takes them, CUDA with `CUDA_OPTIONS`."""
    return [
        ("CUDAExecutionProvider", dict(CUDA_OPTIONS)) if p == "CUDAExecutionProvider" else p
        for p in providers or ["CPUExecutionProvider"]
    ]


def as_onnx(blob: bytes) -> bytes:
    """An ORT-format model as the same graph in ONNX format. ONNX Runtime runs an ORT-format
    model as it was saved, so the carved ResNet34 would cast and scale its int8 weights back to
    float at every call; from ONNX it folds those constants once, when the session is made.
    (Only for the embedding: the segmentation model's `If` subgraphs do not survive the trip.)"""
    import onnxruntime as ort

    if blob[4:8] != b"ORTM":
        return blob
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
        return out.read_bytes()


class SpeakerEmbedder:
    """80-bin Kaldi fbank (hamming window, mean-normalized) → 256-d unit vector."""

    def __init__(self, threads: int = 2, providers: list | None = None):
        import kaldi_native_fbank as knf

        from .models import model_bytes

        self.session = session(as_onnx(model_bytes("embedding")), threads, providers)
        self.device = "cuda" if "CUDAExecutionProvider" in self.session.get_providers() else "cpu"
        opts = knf.FbankOptions()
        opts.frame_opts.dither = 0.0
        opts.frame_opts.samp_freq = RATE
        opts.frame_opts.window_type = "hamming"
        opts.mel_opts.num_bins = 80
        self.fbank_options, self.knf = opts, knf

    def fbank(self, audio: np.ndarray, normalize: bool = True) -> np.ndarray:
        """(frames, 80): 25 ms frames every 10 ms, the mean over `audio` taken out (unless not
        `normalize`)."""
        online = self.knf.OnlineFbank(self.fbank_options)
        audio = np.asarray(audio, dtype=np.float32)
        # A piece at a time, each frame copied out and dropped from knf as soon as it is ready:
        # an hour of audio is 360 000 frames, which as knf's own vectors plus a list of arrays
        # took several times the 115 MB the result needs.
        feats = np.zeros((max(0, 1 + (len(audio) - 400) // 160), 80), dtype=np.float32)
        done = 0
        for i in range(0, max(1, len(audio)), 30 * RATE):
            online.accept_waveform(RATE, audio[i : i + 30 * RATE] * 32768.0)
            if i + 30 * RATE >= len(audio):
                online.input_finished()
            ready = min(online.num_frames_ready, len(feats))
            for k in range(done, ready):
                feats[k] = online.get_frame(k)  # a view into knf's buffer: copied before pop
            online.pop(ready - done)
            done = ready
        return feats - feats.mean(axis=0) if normalize and len(feats) else feats

    def embed(self, fbank: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The unit embedding of `fbank`, pooled over the frames `weights` keeps (all of them
        when None)."""
        if weights is None:
            weights = np.ones(len(fbank), dtype=np.float32)
        out = self.session.run(
            None, {"fbank": fbank[None], "weights": weights[None].astype(np.float32)}
        )[0][0]
        return out / (np.linalg.norm(out) + 1e-12)
