"""Parent-death guard: a worker must never outlive its host (an orphan keeps its GPU memory)."""

import ctypes
import os
import signal
import sys
import threading
import time


def _set_pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def watch_parent(interval: float = 0.25) -> None:
    """Exits the process when the parent goes away: at once by PR_SET_PDEATHSIG where the kernel
    has it, and by polling getppid() for wrappers (shells, `uv run`) that sit in between."""
    expected = os.environ.get("GPUHOST_PARENT_PID")
    parent = os.getppid()
    _set_pdeathsig()
    if expected is not None and str(parent) != expected and parent == 1:
        os._exit(1)

    def poll() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(interval)

    threading.Thread(target=poll, name="gpuhost-parent-watch", daemon=True).start()
