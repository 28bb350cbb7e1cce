"""The `progress` object handed to `Worker.run`: fraction 0..1, message, partial results, logs."""

import math
import threading
import time


class Progress:
    """Progress events of one worker, at most one per `min_interval` (a model loop may report
    thousands a second). A report that comes too soon is held back, the newest one only, and goes
    out once the interval is over unless a later one went out first: the last thing a stage said
    before a long quiet step (clustering after the windows) is never lost."""

    def __init__(self, channels, min_interval: float = 0.05):
        self._channels = channels
        self._min_interval = min_interval
        self._lock = threading.Lock()  # the caller's thread and the timer's
        self._last = 0.0
        self._held = None
        self._timer = None
        self._task = 0  # counts finished tasks: a timer of an earlier task sends nothing

    def __call__(
        self,
        fraction: float | None = None,
        message: str | None = None,
        partial=None,
        force: bool = False,
    ) -> None:
        """Reports progress. Calls closer than `min_interval` apart are held back (the newest
        one goes out when the interval is over) unless they carry a partial result, are final
        (fraction 1) or `force` is set."""
        event = {"event": "progress"}
        if fraction is not None:
            f = float(fraction)
            event["fraction"] = 0.0 if math.isnan(f) else min(max(f, 0.0), 1.0)
        if message is not None:
            event["message"] = str(message)
        if partial is not None:
            event["partial"] = partial
        final = fraction is not None and fraction >= 1
        with self._lock:
            wait = self._min_interval - (time.monotonic() - self._last)
            if force or final or partial is not None or wait <= 0:
                self._send(event)
                return
            self._held = event
            if self._timer is None:
                self._timer = threading.Timer(wait, self._send_held, args=(self._task,))
                self._timer.daemon = True
                self._timer.start()

    def _send(self, event: dict) -> None:
        """Sends `event` (the lock held); whatever was held back is older: dropped."""
        self._held = None
        self._last = time.monotonic()
        self._channels.event(event)

    def _send_held(self, task: int) -> None:
        with self._lock:
            self._timer = None
            if task == self._task and self._held is not None:
                self._send(self._held)

    def finish(self) -> None:
        """The task is over: what is held back is dropped (nothing may follow its end)."""
        with self._lock:
            self._task += 1
            self._held = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._last = 0.0

    def log(self, message: str, level: str = "info") -> None:
        self._channels.log(message, level)
