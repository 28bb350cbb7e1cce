"""gpuhost aligner worker: word start/end times for the ASR text, by forced alignment."""

REQUIRES = ["pocketsphinx", "numpy"]
