"""Protocol glue: the aligner engine behind the gpuhost worker SDK."""

import sys

from gpuhost_worker import Worker, engine, options, serve

from .engine import load, read_wav
from .words import passthrough


class AlignerWorker(Worker):
    def load(self):
        self.engine = load(engine("pocketsphinx"), options())
        self.model = self.engine.name
        # Said in `ready`: a worker on the CPU is not unloaded to make room on the GPU.
        self.device = self.engine.device

    def run(self, task, progress):
        asr = (task.get("results") or {}).get("asr")
        if not asr:
            raise ValueError(
                "the aligner needs the asr stage's result (put asr before aligner in the pipeline)"
            )
        segments = asr.get("segments", [])
        # A translation is English text, whatever language was spoken (`language` says that).
        language = "en" if asr.get("task") == "translate" else asr.get("language")
        known = getattr(self.engine, "languages", None)
        if language and known is not None and language not in known:
            # No acoustic model for this language: the ASR's own word times stand.
            return passthrough(self.engine.name, segments, language)
        audio = read_wav(task["audio_path"])
        return self.engine.align(
            audio, segments, lambda done, of: progress(done / of, f"segment {done}/{of}")
        )


if __name__ == "__main__":
    sys.exit(serve(AlignerWorker()))
