"""Helpers for testing a worker package: run it as the host would, and make speech to feed it."""

import os
import subprocess
import sys


def start_worker(module: str, env: dict | None = None) -> subprocess.Popen:
    """Starts `python -m module` with the three channels piped (text mode), as the host does."""
    return subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **(env or {})),
    )


def speech_wav(text: str, folder, voice: str = "en-us", rate_wpm: int = 140) -> str:
    """`text` spoken by espeak-ng, as 16 kHz mono PCM16 WAV in `folder` (needs espeak-ng and sox)."""
    raw, wav = os.path.join(folder, "raw.wav"), os.path.join(folder, "speech.wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate_wpm), "-w", raw, text], check=True)
    subprocess.run(
        ["sox", raw, "-r", "16000", "-b", "16", "-e", "signed", "-c", "1", wav], check=True
    )
    return wav
