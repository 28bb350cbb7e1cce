"""The worker behind the SDK golden transcripts: echoes `text`, reports `steps` progress events,
fails with `fail`, works `sleep` seconds, and prints to stdout like a careless library would."""

import sys
import time

from gpuhost_worker import Worker, serve


class Echo(Worker):
    model = "echo"
    device = "cpu"

    def run(self, task, progress):
        if task.get("fail"):
            raise ValueError(task["fail"])
        if task.get("sleep"):
            progress.log("working")
            try:
                time.sleep(float(task["sleep"]))
            except Exception:  # careless model code must not swallow a cancel
                progress.log("swallowed an exception")
        steps = int(task.get("steps", 0))
        for i in range(steps):
            partial = {"text": task.get("text")} if i + 1 == steps else None
            progress((i + 1) / steps, f"step {i + 1}/{steps}", partial=partial)
        print("a library printed this to stdout")
        sys.stdout.flush()
        progress.log(f"echoed {len(task.get('text', ''))} characters")
        return {"echo": task.get("text"), "stage": task.get("_stage")}


if __name__ == "__main__":
    sys.exit(serve(Echo()))
