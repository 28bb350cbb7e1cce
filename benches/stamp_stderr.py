"""Runs a worker script unmodified, with each stderr line prefixed by the wall-clock time it was
written, so a benchmark client can measure stderr-line-to-client latency. Used identically for
gpuhost and the seed anchor.  Usage: python stamp_stderr.py WORKER.py [ARGS...]"""

import runpy
import sys
import time


class Stamped:
    def __init__(self, inner):
        self.inner = inner
        self.pending = ""

    def write(self, text):
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.inner.write(f"{time.time():.6f} {line}\n")
        return len(text)

    def flush(self):
        self.inner.flush()


sys.stderr = Stamped(sys.stderr)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
