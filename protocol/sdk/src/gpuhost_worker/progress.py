"""The `progress` object handed to `Worker.run`: fraction 0..1, message, partial results, logs."""

import math
import time


class Progress:
    def __init__(self, channels, min_interval: float = 0.05):
        self._channels = channels
        self._min_interval = min_interval
        self._last = 0.0

    def __call__(
        self,
        fraction: float | None = None,
        message: str | None = None,
        partial=None,
        force: bool = False,
    ) -> None:
        """Reports progress. Calls closer than `min_interval` apart are dropped unless they carry a
        partial result, are final (fraction 1) or `force` is set."""
        now = time.monotonic()
        final = fraction is not None and fraction >= 1
        if not (force or final or partial is not None) and now - self._last < self._min_interval:
            return
        self._last = now
        event = {"event": "progress"}
        if fraction is not None:
            f = float(fraction)
            event["fraction"] = 0.0 if math.isnan(f) else min(max(f, 0.0), 1.0)
        if message is not None:
            event["message"] = str(message)
        if partial is not None:
            event["partial"] = partial
        self._channels.event(event)

    def log(self, message: str, level: str = "info") -> None:
        self._channels.log(message, level)
