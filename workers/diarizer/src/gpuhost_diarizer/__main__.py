"""Protocol glue: the diarizer engine behind the gpuhost worker SDK."""

import sys

import numpy as np
from gpuhost_worker import Worker, engine, options, serve, synthetic_voices

from .engine import load, read_wav


class DiarizerWorker(Worker):
    def load(self):
        self.engine = load(engine("vad-dvector"), options())
        self.model = self.engine.name
        self.device = getattr(self.engine, "device", "cuda")

    def warmup(self):
        # Two synthetic voices: VAD, embeddings, pitch and clustering all run once.
        self.engine.diarize(np.asarray(synthetic_voices(16000), dtype=np.float32))

    def run(self, task, progress):
        audio = read_wav(task["audio_path"])
        return self.engine.diarize(
            audio,
            task.get("num_speakers"),
            task.get("min_speakers"),
            task.get("max_speakers"),
            progress=progress,
        )


if __name__ == "__main__":
    sys.exit(serve(DiarizerWorker()))
