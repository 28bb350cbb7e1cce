"""The `wordtimes` set: real recordings with word-level reference times, for the median
word-boundary error on real speech (issue 11's ≤ 80 ms). Fetched from three PyPI source packages
on first use and checked by sha256, cached under `.bench/real/wordtimes/`, never committed.
Stdlib only. Every item is *report*: nothing is tuned on it.

- Hand-labelled (phone or word boundaries set by a person in Praat): the example clips of
  praatio 6.2.2 (MIT; `examples/files/`: "bobby ripped the ledger", "mary rolled the barrel",
  "damon fried the omelet", three voices, 0.9–1.9 s; damon's TextGrid also carries
  "manually_labeled_pitch_errors") and praat-parselmouth 0.4.7's test recording (GPL-3.0 package,
  the clip only read here; `tests/data/the_north_wind_and_the_sun.{wav,TextGrid}`: a phoneme
  tier, its words found from the phonemes: ðə | nɔθ | wɪnd | ən | ðə | sʌn). 18 words.
- Aligner-made (a forced aligner's output, probably Montreal Forced Aligner's, whose author
  recorded it; not checked by hand as far as the package says): polyglotdb 1.4.3's
  `tests/data/textgrids/acoustic_corpus.{wav,TextGrid}` (MIT), 26.7 s of spontaneous speech of
  one man, about 60 words. Scores against it measure agreement with another aligner, not truth.

Items: name, wav, text, `words` ([{word, start, end}] in seconds), set `wordtimes`, split
`report`, `reference` ("hand" or "aligner").
"""

import re
from pathlib import Path

import sdists

SDISTS = {
    "praatio": (
        "https://files.pythonhosted.org/packages/de/fa/be0bab2b2da04427204f84cd5e54bd3364937456adf"
        "03d98f0f2cfb8f402/praatio-6.2.2.tar.gz",
        "ed8fdee6121bdae142817879ed9a50cc8334e72c03c110162e21ed8160180d2a",
        ("examples/files/",),
    ),
    "parselmouth": (
        "https://files.pythonhosted.org/packages/4f/28/2c1204fe3e7aeb6942051ff6776e31da52c7ab5b7df"
        "2ca438f371bd60d8a/praat_parselmouth-0.4.7.tar.gz",
        "6dd81d246ce1eef5fd93d8cbdaf1bef61ca40ef1d2fc12aa23996a28071181e6",
        ("tests/data/the_north_wind_and_the_sun.",),
    ),
    "polyglotdb": (
        "https://files.pythonhosted.org/packages/0c/fe/248ae83506e390a947d7f91f7f1124cf6ac0bb56f0e"
        "f33dd569264d3b154/polyglotdb-1.4.3.tar.gz",
        "3bb51606a9936e612d3d7ad3e25678891f90bd85133f0b3d0e954ab937de9e5d",
        ("tests/data/textgrids/acoustic_corpus.",),
    ),
}
# (name, package, wav, TextGrid, tier, reference kind)
ITEMS = [
    ("bobby", "praatio", "examples/files/bobby.wav", "bobby_words.TextGrid", "word", "hand"),
    ("mary", "praatio", "examples/files/mary.wav", "mary.TextGrid", "word", "hand"),
    (
        "damon",
        "praatio",
        "examples/files/damon_set_test.wav",
        "damon_set_test.TextGrid",
        "words",
        "hand",
    ),
    (
        "north_wind",
        "parselmouth",
        "tests/data/the_north_wind_and_the_sun.wav",
        "the_north_wind_and_the_sun.TextGrid",
        "phonemes",
        "hand",
    ),
    (
        "acoustic_corpus",
        "polyglotdb",
        "tests/data/textgrids/acoustic_corpus.wav",
        "acoustic_corpus.TextGrid",
        "word",
        "aligner",
    ),
]
# The north wind clip has phonemes only: the words they make, in order.
NORTH_WIND = [("the", 2), ("north", 3), ("wind", 4), ("and", 2), ("the", 1), ("sun", 3)]
SILENCE = {"", "sil", "sp", "<sil>"}


def _fetch(folder: Path) -> None:
    for name, (url, sha, wanted) in SDISTS.items():
        sdists.fetch(folder, name, url, sha, wanted)


def interval_tiers(text: str) -> dict:
    """{tier name: [(start, end, label)]} of a Praat TextGrid in its long or short text format
    (both are the same stream of numbers and quoted strings once the `key =` names and the
    `[n]` indices are dropped). Point tiers are skipped."""
    text = re.sub(r"\[\d+\]", "", text)
    tokens = re.findall(r'"((?:[^"]|"")*)"|([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)', text)
    stream = [s.replace('""', '"') if n == "" else float(n) for s, n in tokens]
    # "ooTextFile" "TextGrid" xmin xmax tiers, then per tier: class name xmin xmax n items.
    at, tiers = 5, {}
    for _ in range(int(stream[4])):
        kind, name, count = stream[at], stream[at + 1], int(stream[at + 4])
        at += 5
        width = 3 if kind == "IntervalTier" else 2
        if kind == "IntervalTier":
            tiers[name] = [tuple(stream[at + 3 * i : at + 3 * i + 3]) for i in range(count)]
        at += width * count
    return tiers


def _words(tier: list, name: str) -> list:
    if name == "north_wind":
        phones = [iv for iv in tier if iv[2].strip() not in SILENCE]
        out, at = [], 0
        for word, n in NORTH_WIND:
            out.append({"word": word, "start": phones[at][0], "end": phones[at + n - 1][1]})
            at += n
        if at != len(phones):
            raise RuntimeError(f"north wind: {len(phones)} phonemes, {at} expected")
        return out
    return [
        {"word": label.strip().lower(), "start": a, "end": b}
        for a, b, label in tier
        if label.strip().lower() not in SILENCE
    ]


def load(cache: Path) -> list:
    folder = cache / "wordtimes"
    folder.mkdir(parents=True, exist_ok=True)
    _fetch(folder)
    items = []
    for name, package, wav, grid, tier, kind in ITEMS:
        root = folder / package
        path = root / Path(wav).parent / grid
        raw = path.read_bytes()
        text = raw.decode("utf-16") if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else raw.decode()
        words = _words(interval_tiers(text)[tier], name)
        items.append(
            {
                "name": name,
                "wav": root / wav,
                "text": " ".join(w["word"] for w in words),
                "words": words,
                "set": "wordtimes",
                "split": "report",
                "reference": kind,
            }
        )
    return items
