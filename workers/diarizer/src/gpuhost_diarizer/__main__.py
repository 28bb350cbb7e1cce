"""Protocol glue: the diarizer engine behind the gpuhost worker SDK."""

import sys

import numpy as np
from gpuhost_worker import TaskRefused, Worker, engine, options, serve, synthetic_voices

from . import voiceprint
from .engine import load, read_wav
from .resnet import SpeakerEmbedder

VOICEPRINT_MODEL = "wespeaker-resnet34"


class DiarizerWorker(Worker):
    def load(self):
        # `overlap` wins on every real set (docs/benchmarks.md, "Speech on real recordings").
        self.engine = load(engine("overlap"), options())
        self.model = self.engine.name
        self.device = getattr(self.engine, "device", "cuda")
        own = getattr(self.engine, "embedder", None)
        self._embedder = own if isinstance(own, SpeakerEmbedder) else None
        # The host enrols voices through this worker and hands it the voiceprints.
        return {"voiceprints": VOICEPRINT_MODEL}

    def warmup(self):
        # Two synthetic voices: segmentation (or VAD and pitch), embeddings and clustering all
        # run once.
        self.engine.diarize(np.asarray(synthetic_voices(16000), dtype=np.float32))

    def embedder(self):
        """The overlap engine's ResNet34, or one of its own (loaded at first use)."""
        if self._embedder is None:
            self._embedder = SpeakerEmbedder()
        return self._embedder

    def run(self, task, progress):
        audio = read_wav(task["audio_path"])
        if task.get("action") == "enroll":
            return self.enroll(audio, task.get("segments"))
        result = self.engine.diarize(
            audio,
            task.get("num_speakers"),
            task.get("min_speakers"),
            task.get("max_speakers"),
            progress=progress,
        )
        # Voiceprints of another embedding model would score nonsense: they are left out.
        prints = [
            p
            for p in task.get("voiceprints") or []
            if p.get("model", VOICEPRINT_MODEL) == VOICEPRINT_MODEL
        ]
        if prints:
            progress(0.95, f"matching {len(result['speakers'])} speakers to enrolled voices")
            given = task.get("voiceprint_threshold")
            threshold = voiceprint.THRESHOLD if given is None else float(given)
            result = voiceprint.identify(self.embedder(), audio, result, prints, threshold)
        return result

    def enroll(self, audio, segments):
        """A voiceprint from `segments` ([start, end] seconds), or from the speech of the one
        voice the diarizer hears in the sample."""
        try:
            if not segments:
                segments = voiceprint.one_voice(self.engine.diarize(audio))
            made = voiceprint.enroll(self.embedder(), audio, segments)
        except voiceprint.EnrollError as e:
            # Too little speech, or several voices: the client's to change (400), not a
            # failure of the worker.
            raise TaskRefused(str(e)) from e
        return {"model": VOICEPRINT_MODEL, **made}


if __name__ == "__main__":
    sys.exit(serve(DiarizerWorker()))
