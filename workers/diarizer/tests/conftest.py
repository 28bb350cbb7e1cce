import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory):
    """'hello world this is a test of the speech worker' as 16 kHz mono PCM16 (espeak-ng + sox)."""
    d = tmp_path_factory.mktemp("speech")
    raw, wav = d / "raw.wav", d / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "140", "-w", str(raw),
                    "hello world, this is a test of the speech worker"], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-b", "16", "-e", "signed", "-c", "1", str(wav)], check=True)
    return str(wav)


def start_worker(module, env=None):
    return subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))
