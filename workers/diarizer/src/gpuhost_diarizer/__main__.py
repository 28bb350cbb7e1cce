"""Protocol glue: the diarizer engine behind the gpuhost worker SDK."""

import sys

from gpuhost_worker import Worker, engine, options, serve

from .engine import load, read_wav


class DiarizerWorker(Worker):
    def load(self):
        self.engine = load(engine("vad-dvector"), options())
        self.model = self.engine.name
        self.device = "cpu" if "d-vector" in self.engine.name else "cuda"

    def run(self, job, progress):
        audio = read_wav(job["audio_path"])
        return self.engine.diarize(
            audio,
            job.get("num_speakers"),
            job.get("min_speakers"),
            job.get("max_speakers"),
            progress=progress,
        )


if __name__ == "__main__":
    sys.exit(serve(DiarizerWorker()))
