"""Two-party conversations of real voices with exact references, spliced from the meeting clips of
`real_sets.py` (stdlib + sox). Built once into `.bench/real/calls/`, never committed.

Utterances are stretches of 1–4 s where exactly one reference speaker talks (nobody else within
0.1 s), and pieces of at most 4 s of the one-voice ASR sets (the asterisk prompts' voice, the
LibriVox and card readers). Each conversation takes two different voices of one split (at least
two utterances each) and alternates six of their utterances with gaps drawn from −0.2 s
(overlap) to 1 s; the reference turns are exact by
construction. Every conversation comes twice: wideband, and as a telephone call (300–3400 Hz,
8 kHz). Voices of `tune` items make `tune` conversations, those of `report` items `report` (the
asterisk voice is in both, with different prompts; AMI speaker labels are global). Voices from
different corpora also differ in channel, which makes those pairs easier than a real call.
"""

import json
import random
import subprocess
import wave
from pathlib import Path

RATE = 16000
PER_SPLIT = 24  # conversations per split (each also as a telephone call)
TURNS = 6


def _samples(path: Path, trim: bool = False) -> bytes:
    """16 kHz mono PCM16 bytes of any file sox reads (leading and trailing silence cut)."""
    cut = ["silence", "1", "0.05", "1%", "reverse", "silence", "1", "0.05", "1%", "reverse"]
    return subprocess.run(
        ["sox", str(path), "-t", "raw", "-r", str(RATE), "-e", "signed", "-b", "16", "-c", "1", "-"]
        + (cut if trim else []),
        check=True,
        capture_output=True,
    ).stdout


def readers(items: list) -> dict:
    """(split, voice) -> utterances of the one-voice ASR sets (asterisk prompts, LibriVox and card
    readings): each file's speech, cut into pieces of at most 4 s, pieces under 1 s dropped."""
    out: dict = {}
    for item in items:
        pcm = _samples(item["wav"], trim=True)
        for i in range(0, len(pcm), 4 * RATE * 2):
            piece = pcm[i : i + 4 * RATE * 2]
            if len(piece) >= RATE * 2:
                out.setdefault((item["split"], item["set"]), []).append(piece)
    return out


def utterances(items: list) -> dict:
    """(split, speaker) -> list of PCM16 byte strings, one per clean utterance."""
    out: dict = {}
    for item in items:
        pcm = _samples(item["wav"])
        frames = len(pcm) // 2
        step = 160  # 10 ms
        n = frames // step
        who = [set() for _ in range(n)]
        for t in item["turns"]:
            for i in range(max(0, int(t["start"] * 100) - 10), min(n, int(t["end"] * 100) + 10)):
                who[i].add(t["speaker"])
        for t in item["turns"]:
            a, b = int(t["start"] * 100), min(n, int(t["end"] * 100))
            i = a
            while i < b:
                if who[i] != {t["speaker"]}:
                    i += 1
                    continue
                j = i
                while j < b and who[j] == {t["speaker"]} and j - i < 400:
                    j += 1
                if j - i >= 100:
                    key = (item["split"], t["speaker"])
                    out.setdefault(key, []).append(pcm[i * step * 2 : j * step * 2])
                i = j
    return out


def _write(path: Path, pcm: bytes, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)


def _mix(a: bytearray, offset: int, pcm: bytes) -> None:
    """Adds PCM16 `pcm` into `a` at sample `offset`, clipping."""
    end = offset * 2 + len(pcm)
    if len(a) < end:
        a.extend(b"\0" * (end - len(a)))
    for k in range(0, len(pcm), 2):
        x = int.from_bytes(a[offset * 2 + k : offset * 2 + k + 2], "little", signed=True)
        y = int.from_bytes(pcm[k : k + 2], "little", signed=True)
        a[offset * 2 + k : offset * 2 + k + 2] = max(-32768, min(32767, x + y)).to_bytes(
            2, "little", signed=True
        )


def build(items: list, folder: Path, read: list = ()) -> list:
    """The conversations as set items (`calls`), built into `folder` unless already there, from
    the meeting clips `items` and the one-voice recordings `read`."""
    index = folder / f"index-{PER_SPLIT}-{len(items)}.json"  # another recipe, another build
    if not index.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        rng = random.Random(11)
        voices = utterances(items)
        voices.update(readers(read))
        made = []
        for split in ("tune", "report"):
            speakers = sorted(s for (sp, s), u in voices.items() if sp == split and len(u) >= 2)
            for k in range(PER_SPLIT):
                a, b = rng.sample(speakers, 2)
                pools = {a: list(voices[(split, a)]), b: list(voices[(split, b)])}
                audio, turns, t = bytearray(), [], 0.5
                for turn in range(TURNS):
                    who = (a, b)[turn % 2]
                    pcm = rng.choice(pools[who])
                    start = t if turn == 0 else max(0.0, t + rng.uniform(-0.2, 1.0))
                    _mix(audio, int(start * RATE), pcm)
                    end = start + len(pcm) / 2 / RATE
                    turns.append({"start": round(start, 3), "end": round(end, 3), "speaker": who})
                    t = end
                audio.extend(b"\0" * RATE)  # a second of silence at the end
                name = f"call_{split}_{k:02d}"
                _write(folder / f"{name}.wav", bytes(audio))
                subprocess.run(
                    ["sox", str(folder / f"{name}.wav"), str(folder / f"{name}_phone.wav")]
                    + ["sinc", "300-3400", "rate", "8000"],
                    check=True,
                )
                span = (0.0, round(len(audio) / 2 / RATE, 3))
                for suffix in ("", "_phone"):
                    made.append(
                        {"name": name + suffix, "split": split, "turns": turns, "uem": span}
                    )
        index.write_text(json.dumps(made, indent=1))
    return [
        dict(item, wav=folder / f"{item['name']}.wav", set="calls", uem=tuple(item["uem"]))
        for item in json.loads(index.read_text())
    ]


LONG_S = 90  # length of each long recording
LONG_PER_SPLIT = 4


def long_recordings(prompts: list, folder: Path) -> list:
    """Long recordings of one real voice with pauses, for hallucinations and run-on repetition:
    each split's asterisk prompts in order, joined into recordings of about LONG_S seconds with
    silences of 0.3–6 s between them (a faint noise floor, as a line has). The reference is the
    prompts' texts in order. Built once into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(11)
    out = []
    for split in ("tune", "report"):
        mine = [p for p in prompts if p["split"] == split]
        at = 0
        for n in range(LONG_PER_SPLIT):
            wav, ref = folder / f"long_{split}_{n:02d}.wav", folder / f"long_{split}_{n:02d}.json"
            if not (wav.exists() and ref.exists()):
                pcm, texts = bytearray(), []
                while len(pcm) < LONG_S * RATE * 2 and at < len(mine):
                    gap = rng.uniform(0.3, 6.0) if rng.random() < 0.3 else rng.uniform(0.3, 1.2)
                    pcm += b"\0" * (int(gap * RATE) * 2)
                    pcm += _samples(mine[at]["wav"], trim=True)
                    texts.append(mine[at]["text"])
                    at += 1
                pcm += b"\0" * (RATE * 2)
                noise = bytearray(
                    b"".join(
                        int(rng.gauss(0, 20)).to_bytes(2, "little", signed=True)
                        for _ in range(len(pcm) // 2)
                    )
                )
                _mix(noise, 0, bytes(pcm))
                _write(wav, bytes(noise))
                ref.write_text(json.dumps({"text": " ".join(texts), "prompts": len(texts)}))
            else:
                at += json.loads(ref.read_text())["prompts"]  # where a fresh build would be
            out.append(
                {
                    "name": wav.stem,
                    "wav": wav,
                    "text": json.loads(ref.read_text())["text"],
                    "set": "long",
                    "split": split,
                }
            )
    return out
