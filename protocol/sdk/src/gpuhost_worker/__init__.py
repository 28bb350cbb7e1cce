"""gpuhost worker SDK: subclass `Worker`, implement `load()` and `run(task, progress)`, call `serve()`.

The protocol (see protocol/PROTOCOL.md in the gpuhost repository) is handled here: signals on the
real stdout, logs and events on stderr, results written atomically, errors turned into the `error`
signal, exit when the parent dies, persistent and one-shot modes.
"""

from .channels import Channels
from .options import engine, options
from .progress import Progress
from .runner import PROTOCOL_VERSION, JobCancelled, TaskCancelled, TaskRefused, Worker, serve
from .warmup import synthetic_voices

__all__ = [
    "Channels",
    "JobCancelled",
    "TaskCancelled",
    "TaskRefused",
    "Progress",
    "PROTOCOL_VERSION",
    "Worker",
    "engine",
    "options",
    "serve",
    "synthetic_voices",
]
