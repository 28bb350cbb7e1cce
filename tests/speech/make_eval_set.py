"""Builds the speech evaluation set: multi-speaker conversations synthesized with espeak-ng, with
exact ground truth (who spoke when, every word's start and end), in a wideband (22.05 kHz) and a
narrowband telephone version (300–3400 Hz, 8 kHz, mu-law) of each.

Words are synthesized one by one and joined with short pauses, so every word boundary is known
to the sample. Two sets: `conversation` (turns 0.5–0.9 s apart) and `turn-taking` (short turns
answered at once, 0–0.12 s apart, so a speaker change often has no pause at all: VAD alone cannot
separate the speakers). Stdlib only; needs `espeak-ng` and `sox` on PATH.

    python3 tests/speech/make_eval_set.py OUT_DIR
writes OUT_DIR/<name>.wav and OUT_DIR/<name>.json ({"words": [...], "turns": [...], "text": ...,
"set": ...}).
"""

import array
import json
import os
import random
import subprocess
import sys
import tempfile
import wave

RATE = 22050

# Voices that differ in the ways real speakers do: vocal tract (variant), pitch, speed.
VOICES = {
    "alice": ["-v", "en-us+f3", "-p", "62", "-s", "150"],
    "bob": ["-v", "en-us+m3", "-p", "35", "-s", "140"],
    "carol": ["-v", "en-gb+f4", "-p", "75", "-s", "160"],
    "dave": ["-v", "en-gb+m1", "-p", "25", "-s", "135"],
}

CONVERSATIONS = {
    "meeting": [
        ("alice", "good morning everyone thank you for joining the weekly planning meeting"),
        ("bob", "thanks alice the new build finished last night and every test passed"),
        ("alice", "great news what about the translation server on the graphics card"),
        ("bob", "it starts only when the card is idle and we stop it after each batch"),
        ("carol", "the image generation queue was empty this morning so nothing waited"),
        ("alice", "then we can move the speech pipeline to the same machine next week"),
        ("carol", "i will write the migration plan and send it around on friday"),
    ],
    "support_call": [
        ("dave", "hello this is the help desk how can i help you today"),
        ("carol", "my internet connection keeps dropping every few minutes since monday"),
        ("dave", "i am sorry to hear that please restart the router and wait two minutes"),
        ("carol", "i did that twice already and the light is still blinking orange"),
        ("dave", "then we will send a technician tomorrow morning between nine and noon"),
        ("carol", "thank you that works for me"),
    ],
    "interview": [
        ("bob", "welcome to the show today we talk about keeping old computers running"),
        ("alice", "thanks for having me most machines fail because nobody cleans the fans"),
        ("bob", "what should people check first when a laptop gets very hot"),
        ("alice", "look at the vents and the fan and replace the thermal paste every few years"),
        ("dave", "we also have a question from a listener about batteries that swell"),
        ("alice", "stop using the device at once and take it to a recycling center"),
    ],
}


# Quick exchanges: the next speaker starts within 0–0.12 s.
TURN_TAKING = {
    "quick_exchange": [
        ("bob", "so did the backup finish"),
        ("carol", "yes at four"),
        ("bob", "all of it"),
        ("carol", "every disk except the old one"),
        ("bob", "which old one"),
        ("carol", "the grey box under the desk"),
        ("bob", "right that one is broken anyway"),
        ("carol", "then we can throw it out"),
        ("bob", "agreed"),
        ("carol", "and the new drives arrive on tuesday"),
        ("bob", "good i will install them"),
    ],
    "quick_three": [
        ("alice", "who has the keys"),
        ("dave", "not me"),
        ("carol", "i left them at the front desk"),
        ("alice", "thanks"),
        ("dave", "is the van ready"),
        ("carol", "almost it needs fuel"),
        ("alice", "i can fill it up on the way"),
        ("dave", "great then we leave at ten"),
        ("carol", "see you there"),
    ],
}
GAPS = {"conversation": (0.5, 0.9), "turn-taking": (0.0, 0.12)}


def names() -> list:
    """Every recording the set has, wideband and telephone."""
    return sorted(n + s for n in [*CONVERSATIONS, *TURN_TAKING] for s in ("", "_phone"))


def synth_word(word: str, voice: list, workdir: str) -> array.array:
    path = os.path.join(workdir, "w.wav")
    subprocess.run(["espeak-ng", *voice, "-w", path, word], check=True)
    with wave.open(path) as w:
        assert w.getframerate() == RATE and w.getnchannels() == 1 and w.getsampwidth() == 2
        samples = array.array("h", w.readframes(w.getnframes()))
    # Trim silence at both ends (espeak pads each utterance).
    threshold = 300
    start = next((i for i, s in enumerate(samples) if abs(s) > threshold), 0)
    end = len(samples) - next((i for i, s in enumerate(reversed(samples)) if abs(s) > threshold), 0)
    return samples[max(0, start - 40) : min(len(samples), end + 40)]


def build(
    name: str, turns: list, workdir: str, rng: random.Random, kind: str = "conversation"
) -> tuple:
    audio = array.array("h", [0] * int(0.6 * RATE))
    words, truth_turns = [], []
    for speaker, sentence in turns:
        voice = VOICES[speaker]
        turn_start = len(audio) / RATE
        for i, word in enumerate(sentence.split()):
            if i:
                audio.extend([0] * int(rng.uniform(0.06, 0.11) * RATE))
            start = len(audio) / RATE
            audio.extend(synth_word(word, voice, workdir))
            words.append(
                {
                    "word": word,
                    "start": round(start, 4),
                    "end": round(len(audio) / RATE, 4),
                    "speaker": speaker,
                }
            )
        truth_turns.append(
            {"speaker": speaker, "start": round(turn_start, 4), "end": round(len(audio) / RATE, 4)}
        )
        audio.extend([0] * int(rng.uniform(*GAPS[kind]) * RATE))
    if kind != "conversation":
        audio.extend([0] * int(0.6 * RATE))
    # A little noise so the silence is not digital zero.
    noisy = array.array("h", (max(-32768, min(32767, s + rng.randint(-30, 30))) for s in audio))
    text = " ".join(s for _, s in turns)
    return noisy, {
        "name": name,
        "set": kind,
        "words": words,
        "turns": truth_turns,
        "text": text,
        "speakers": sorted({s for s, _ in turns}),
        "duration": round(len(noisy) / RATE, 4),
    }


def write_wav(path: str, samples: array.array, rate: int = RATE) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as workdir:
        sets = [(n, t, "conversation") for n, t in CONVERSATIONS.items()]
        sets += [(n, t, "turn-taking") for n, t in TURN_TAKING.items()]
        for name, turns, kind in sets:
            samples, truth = build(name, turns, workdir, rng, kind)
            wide = os.path.join(out, f"{name}.wav")
            write_wav(wide, samples)
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump(truth, f, indent=1)
            # Telephone: band-limit, 8 kHz, mu-law, as a phone line would deliver it. `-R`:
            # sox's dither is seeded the same every time, so every build of the set is the same
            # (a fresh seed per build moved a phone recording's WER across its bound).
            phone = os.path.join(out, f"{name}_phone.wav")
            subprocess.run(
                [
                    "sox",
                    "-R",
                    wide,
                    "-r",
                    "8000",
                    "-e",
                    "u-law",
                    "-b",
                    "8",
                    phone,
                    "sinc",
                    "300-3400",
                    "gain",
                    "-1",
                ],
                check=True,
            )
            with open(os.path.join(out, f"{name}_phone.json"), "w") as f:
                json.dump(dict(truth, name=f"{name}_phone", narrowband=True), f, indent=1)
    print(f"wrote {len(names())} recordings to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/speech-eval")
