"""What the host configured for this worker: `[workers.<name>] engine` and `options`."""

import json
import os


def engine(default: str) -> str:
    """The configured engine name (`GPUHOST_ENGINE`), or `default`."""
    return os.environ.get("GPUHOST_ENGINE") or default


def options() -> dict:
    """The configured options (`GPUHOST_OPTIONS`, a JSON object), or {}."""
    raw = os.environ.get("GPUHOST_OPTIONS")
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("GPUHOST_OPTIONS must be a JSON object")
    return value
