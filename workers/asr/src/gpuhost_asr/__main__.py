"""Protocol glue: the ASR engine behind the gpuhost worker SDK."""

import sys

import numpy as np
from gpuhost_worker import TaskRefused, Worker, engine, options, serve, synthetic_voices

from .engine import AsrSettings, UnsupportedRequest, transcriber


class AsrWorker(Worker):
    def load(self):
        settings = AsrSettings.from_options(engine("cpu"), options())
        self.transcriber = transcriber(settings)
        self.model = self.transcriber.model_name
        self.device = self.transcriber.device
        # The host refuses other languages before they queue (never silent English output).
        return {
            "languages": self.transcriber.languages(),
            "translate": not self.transcriber.english_only,
        }

    def warmup(self):
        self.transcriber.warm_up(np.asarray(synthetic_voices(16000), dtype=np.float32))

    def run(self, task, progress):
        furthest = [0.0]

        def on_segment(segment, duration):
            # Speech decoded again (gaps.py) comes after the rest: the fraction never goes back.
            fraction = None
            if duration:
                furthest[0] = max(furthest[0], segment["end"] / duration)
                fraction = furthest[0]
            progress(
                fraction,
                segment["text"],
                partial={"start": segment["start"], "end": segment["end"], "text": segment["text"]},
            )

        try:
            return self.transcriber.transcribe(
                task["audio_path"],
                language=task.get("language"),
                prompt=task.get("prompt"),
                on_segment=on_segment,
                translate=bool(task.get("translate")),
            )
        except UnsupportedRequest as e:
            # The client's to change: refused (422), not a failure of the worker.
            raise TaskRefused(str(e)) from e


if __name__ == "__main__":
    sys.exit(serve(AsrWorker()))
