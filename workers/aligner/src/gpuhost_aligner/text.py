"""Text normalization for alignment, and a letter-to-phone rule for words missing from the
dictionary (CMUdict phone set)."""

import re

_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# Crude but total: every letter (and common pairs) maps to phones, so no word is ever refused.
_PAIRS = {
    "ch": "CH",
    "sh": "SH",
    "th": "TH",
    "ph": "F",
    "ng": "NG",
    "ck": "K",
    "qu": "K W",
    "ee": "IY",
    "oo": "UW",
    "ea": "IY",
    "ai": "EY",
    "ay": "EY",
    "ou": "AW",
    "ow": "OW",
    "oi": "OY",
}
_LETTERS = {
    "a": "AE",
    "b": "B",
    "c": "K",
    "d": "D",
    "e": "EH",
    "f": "F",
    "g": "G",
    "h": "HH",
    "i": "IH",
    "j": "JH",
    "k": "K",
    "l": "L",
    "m": "M",
    "n": "N",
    "o": "AA",
    "p": "P",
    "q": "K",
    "r": "R",
    "s": "S",
    "t": "T",
    "u": "AH",
    "v": "V",
    "w": "W",
    "x": "K S",
    "y": "Y",
    "z": "Z",
}


def normalize(word: str) -> list:
    """The dictionary tokens for one ASR word ("Hello," → ["hello"], "42" → ["four", "two"])."""
    w = word.lower().replace("’", "'")
    w = re.sub(r"[^a-z0-9']+", " ", w).strip(" '")
    tokens = []
    for part in w.split():
        if part.isdigit():
            tokens.extend(_DIGITS[int(d)] for d in part)
        else:
            tokens.append(part.strip("'"))
    return [t for t in tokens if t]


def letter_to_phones(word: str) -> str:
    phones, i = [], 0
    while i < len(word):
        pair = word[i : i + 2]
        if pair in _PAIRS:
            phones.append(_PAIRS[pair])
            i += 2
            continue
        if word[i] in _LETTERS:
            phones.append(_LETTERS[word[i]])
        i += 1
    return " ".join(phones) or "AH"
