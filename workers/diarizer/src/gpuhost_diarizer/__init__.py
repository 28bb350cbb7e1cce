"""gpuhost diarizer worker: who spoke when."""
