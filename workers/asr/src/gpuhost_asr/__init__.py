"""gpuhost ASR worker: speech to text with word timestamps (faster-whisper)."""
