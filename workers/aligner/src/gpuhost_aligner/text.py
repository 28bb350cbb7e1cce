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


_ONES = _DIGITS[1:] + [
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred")]
_ORDINALS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_SYMBOLS = {"&": "and", "@": "at", "+": "plus", "=": "equals", "#": "number"}
_UNITS = {"%": "percent", "$": "dollars", "€": "euros", "£": "pounds", "°": "degrees"}
# A number (with separators and a suffix), a word, or a symbol said as a word.
_PARTS = re.compile(
    r"-?[0-9][0-9,.:]*[0-9](?:st|nd|rd|th|'s|s)?|-?[0-9](?:st|nd|rd|th|'s|s)?|[a-z']+|[&@+=#]"
)


def number_words(n: int) -> list:
    """How a cardinal is said: 1234 → one thousand two hundred thirty four."""
    if n == 0:
        return ["zero"]
    out = []
    for value, name in _SCALES:
        if n >= value:
            out += number_words(n // value) + [name]
            n %= value
    if n >= 20:
        out.append(_TENS[n // 10])
        n %= 10
    if n:
        out.append(_ONES[n - 1])
    return out


def year_words(n: int) -> list:
    """How a year is said: 1990 → nineteen ninety, 2024 → twenty twenty four, 2005 → two
    thousand five, 1900 → nineteen hundred."""
    high, low = divmod(n, 100)
    if 2000 <= n < 2010:
        return number_words(n)
    if low == 0:
        return number_words(high) + ["hundred"]
    return number_words(high) + (["oh"] if low < 10 else []) + number_words(low)


def ordinal(words: list) -> list:
    last = words[-1]
    if last in _ORDINALS:
        last = _ORDINALS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return words[:-1] + [last]


def _plural(words: list) -> list:
    last = words[-1]
    return words[:-1] + [last[:-1] + "ies" if last.endswith("y") else last + "s"]


def _say_number(token: str) -> list:
    """A token of digits (with , . : - and a suffix) as words; [] when it is not one."""
    m = re.fullmatch(r"(-?)([0-9][0-9,]*)(?:([.:])([0-9]+))?(st|nd|rd|th|s|'s)?", token)
    if not m:
        return []
    sign, whole, sep, frac, suffix = m.groups()
    digits = whole.replace(",", "")
    if len(digits) > 12:
        return [_DIGITS[int(d)] for d in digits]
    n = int(digits)
    if sep == ":":  # a time: 10:30 → ten thirty, 9:05 → nine oh five, 7:00 → seven o'clock
        minutes = int(frac)
        tail = (
            ["o'clock"]
            if minutes == 0
            else (["oh"] if minutes < 10 else []) + number_words(minutes)
        )
        return number_words(n) + tail
    is_year = "," not in whole and len(digits) == 4 and 1100 <= n < 2100 and not sep
    words = year_words(n) if is_year and suffix != "th" else number_words(n)
    if sep == ".":
        words += ["point"] + [_DIGITS[int(d)] for d in frac]
    if suffix in ("st", "nd", "rd", "th"):
        words = ordinal(words)
    elif suffix in ("s", "'s"):
        words = _plural(words)  # the 1990s → nineteen nineties
    return (["minus"] if sign else []) + words


def normalize(word: str) -> list:
    """The dictionary tokens for one ASR word, said as spoken: "Hello," → ["hello"], "42" →
    ["forty", "two"], "$20" → ["twenty", "dollars"], "1990s" → ["nineteen", "nineties"],
    "3.5%" → ["three", "point", "five", "percent"]. The aligner times the whole word from its
    first and last token, so numbers and symbols get word times too."""
    w = word.lower().replace("’", "'").strip()
    units = [name for sym, name in _UNITS.items() if sym in w]
    w = w.replace("€", " ").replace("£", " ").replace("$", " ").replace("%", " ").replace("°", " ")
    tokens = []
    for part in _PARTS.findall(w):
        said = _say_number(part) if part[0] in "-0123456789" else []
        if said:
            tokens += said
        elif part in _SYMBOLS:
            tokens.append(_SYMBOLS[part])
        else:
            tokens.append(part.strip("'-"))
    return [t for t in tokens if t] + (units if tokens else [])


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
