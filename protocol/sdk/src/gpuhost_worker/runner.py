"""The worker loop: load once, say `ready`, then per stdin line run the task, write the result
atomically to `_output_path`, and say `done` (or `error`, staying alive for the next task).
`SIGINT` during a task abandons it (`error` of kind `cancelled`); the model stays loaded."""

import errno
import gc
import json
import os
import signal
import sys
import tempfile
import time
import traceback

from .channels import Channels, to_json
from .guard import watch_parent
from .progress import Progress

PROTOCOL_VERSION = 1


class TaskCancelled(BaseException):
    """Raised inside `Worker.run` when the host calls the task off (`SIGINT`). A `BaseException`,
    like `KeyboardInterrupt`, so that model code catching `Exception` does not swallow it."""


# The name before tasks had their own word; workers written against it keep working.
JobCancelled = TaskCancelled


class TaskRefused(ValueError):
    """Raise from `Worker.run` when the task asks what cannot be done with this input or this
    model (too little speech for a voiceprint, a language the model does not know). Its message
    goes to the client as it is; the host answers 400 (`refused`) and counts a refusal, not a
    failure."""


# The host keeps this many characters of a failure's message; the whole `error` line must stay
# under its 64 KiB line limit, or the JSON is cut and the kind (a refusal's 400) is lost.
MESSAGE_MAX = 4000


def _cut(message: str) -> str:
    if len(message) <= MESSAGE_MAX:
        return message
    return f"{message[:MESSAGE_MAX]} … ({len(message) - MESSAGE_MAX} characters left out)"


def failure(e: BaseException) -> dict:
    """The `error` signal's payload for an exception out of `Worker.run`: kind `refused` for a
    `TaskRefused`, `no_space` for a full disk or quota (the host answers 507, not 500), else the
    exception's class name. A message past `MESSAGE_MAX` characters (an exception quoting its
    whole input) is cut, as the host would."""
    if isinstance(e, TaskRefused):
        kind, message = "refused", str(e)
    elif isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        kind, message = "no_space", f"{type(e).__name__}: {e}"
    else:
        kind, message = type(e).__name__, f"{type(e).__name__}: {e}"
    return {"message": _cut(message), "kind": kind}


class _Task:
    """Whether a task runs: `SIGINT` cancels only then, and is ignored between tasks."""

    running = False

    @classmethod
    def on_sigint(cls, signum, frame):
        if cls.running:
            raise TaskCancelled()


def free_memory() -> None:
    """Collects garbage and empties the CUDA cache when torch is loaded (`del` first)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class Worker:
    """Subclass and implement `load` and `run`. Model code needs no protocol code."""

    #: Shown in `/workers` after `ready`.
    model: str | None = None
    device: str | None = None

    def load(self) -> dict | None:
        """Loads the model. May return extra metadata for the `ready` line."""
        return None

    def warmup(self) -> None:
        """Runs the model once on synthetic input after `load`, before `ready`, so the first real
        task does not pay for lazy initialization (kernel compilation, session setup, caches).
        Skipped in one-shot mode, where the first task is the only one. A failure is logged and
        `ready` still follows."""
        return None

    def run(self, task: dict, progress: Progress) -> dict:
        raise NotImplementedError

    def unload(self) -> None:
        """Frees memory in-process (one-shot mode exits instead). Override to drop model
        references; the default collects garbage and empties the CUDA cache when torch is loaded."""
        free_memory()


def write_result(path: str, result) -> None:
    """Writes JSON to `path` atomically: a temp file in the same folder, then rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".result-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(to_json(result, ensure_ascii=False))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def oneshot_requested(argv=None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--oneshot" in argv or os.environ.get("GPUHOST_MODE", "").lower() == "oneshot"


def serve(
    worker: Worker,
    channels: Channels | None = None,
    oneshot: bool | None = None,
    guard: bool = True,
) -> int:
    """Runs the protocol until stdin closes (or after one task in one-shot mode). Returns the exit code."""
    if channels is None:
        channels = Channels.take_over_stdout()
    if guard:
        watch_parent()
    if oneshot is None:
        oneshot = oneshot_requested()
    try:
        extra = worker.load() or {}
    except ImportError as e:  # a broken or stale venv: say how to fix it
        traceback.print_exc(file=sys.stderr)
        name = os.environ.get("GPUHOST_WORKER", "<worker>")
        sys.stderr.write(
            f"load failed: {e}. The worker's venv is missing packages: run `gpuhost setup {name}`\n"
        )
        sys.stderr.flush()
        return 3
    except Exception as e:  # a failed load is fatal: the host reports the log tail
        traceback.print_exc(file=sys.stderr)
        sys.stderr.write(f"load failed: {type(e).__name__}: {e}\n")
        sys.stderr.flush()
        return 2
    meta = {"protocol": PROTOCOL_VERSION}
    if not oneshot and type(worker).warmup is not Worker.warmup:
        started = time.monotonic()
        try:
            worker.warmup()
            meta["warmup_s"] = round(time.monotonic() - started, 3)
        except Exception as e:  # a warm-up is an optimization: never a reason not to serve
            traceback.print_exc(file=sys.stderr)
            sys.stderr.write(f"warm-up failed (serving anyway): {type(e).__name__}: {e}\n")
            sys.stderr.flush()
    if worker.model:
        meta["model"] = worker.model
    if worker.device:
        meta["device"] = worker.device
    meta["cancel"] = True
    meta.update(extra)
    signal.signal(signal.SIGINT, _Task.on_sigint)
    channels.signal("ready", meta)
    progress = Progress(channels)
    for line in channels.tasks():
        _handle(worker, channels, progress, line)
        if oneshot:
            break
    return 0


def _handle(worker: Worker, channels: Channels, progress: Progress, line: str) -> None:
    try:
        task = json.loads(line)
        if not isinstance(task, dict):
            raise ValueError("a task must be a JSON object")
    except ValueError as e:
        channels.log(f"bad task line: {e}", "error")
        channels.signal("error", {"message": f"bad task line: {e}", "kind": "ProtocolError"})
        return
    output = task.get("_output_path")
    # A SIGINT raises only while `running` is set, and `running` is cleared inside the outer try:
    # the one SIGINT the host sends per task raises at most once, always where it is caught, so
    # exactly one signal ends every task.
    try:
        try:
            _Task.running = True
            # The host's SIGINT may have come before this task was read: it left a marker too.
            cancel_path = task.get("_cancel_path")
            if cancel_path and os.path.exists(cancel_path):
                raise TaskCancelled()
            result = worker.run(task, progress)
        finally:
            _Task.running = False
            progress.finish()  # no progress event may follow the task's end
        if output:
            write_result(output, result if result is not None else {})
    except TaskCancelled:
        free_memory()  # what the abandoned task allocated
        channels.log("task cancelled: the host no longer wants its result", "info")
        channels.signal("error", {"message": "cancelled", "kind": "cancelled"})
        return
    except Exception as e:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        channels.signal("error", failure(e))
        return
    channels.signal("done")
