"""The three channels. Protocol signals get a private duplicate of fd 1; fd 1 itself is pointed at
stderr, so anything a library prints (Python or C level, progress bars included) lands in the log
and can never corrupt the signal stream."""

import json
import math
import os
import sys
import threading

EVENT_PREFIX = "@gpuhost "


def finite(value):
    """`value` with every NaN and infinity made `null`: JSON has no such numbers, and Python's
    `json` would write them anyway (`NaN`), which the host cannot read: a model's one bad score
    would fail the whole job."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(value, **options) -> str:
    """Strict JSON of `value` (non-finite numbers as `null`)."""
    return json.dumps(finite(value), allow_nan=False, **options)


class Channels:
    def __init__(self, signal_fd: int, stdin=None):
        self._signals = os.fdopen(signal_fd, "w", buffering=1, encoding="utf-8", closefd=True)
        self._stdin = stdin if stdin is not None else sys.stdin
        self._lock = threading.Lock()

    @classmethod
    def take_over_stdout(cls) -> "Channels":
        """Moves the real stdout to a private fd and makes fd 1 an alias of stderr."""
        sys.stdout.flush()
        signal_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return cls(signal_fd)

    def signal(self, word: str, payload: dict | None = None) -> None:
        line = word if payload is None else f"{word} {to_json(payload, separators=(',', ':'))}"
        sys.stderr.flush()  # logs written before a signal are read before it
        with self._lock:
            self._signals.write(line + "\n")
            self._signals.flush()

    def event(self, payload: dict) -> None:
        line = EVENT_PREFIX + to_json(payload, separators=(",", ":"), default=str)
        with self._lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def log(self, message: str, level: str | None = None) -> None:
        if level is None:
            with self._lock:
                sys.stderr.write(message.rstrip("\n") + "\n")
                sys.stderr.flush()
        else:
            self.event({"event": "log", "level": level, "message": message})

    def tasks(self):
        """Yields each non-empty stdin line; ends at EOF."""
        for line in self._stdin:
            line = line.strip()
            if line:
                yield line
