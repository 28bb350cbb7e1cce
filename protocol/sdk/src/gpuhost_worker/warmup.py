"""Synthetic input for `Worker.warmup`: vowel-like voices (stdlib only), so a worker can run its
model once before `ready` without shipping a recording."""

import math


def synthetic_voices(rate: int = 16000, pitches=(120.0, 210.0), seconds: float = 2.5) -> list:
    """One voice per pitch, each `seconds` long and followed by 0.4 s of silence: harmonics of the
    pitch under a 4 Hz syllable envelope, peak 0.3. Samples in -1..1 at `rate`."""
    out = []
    for f0 in pitches:
        harmonics = [k for k in range(1, 9) if k * f0 < rate / 2]
        for i in range(int(seconds * rate)):
            t = i / rate
            tone = sum(math.sin(2 * math.pi * k * f0 * t) / k for k in harmonics)
            envelope = 0.5 * (1 - math.cos(2 * math.pi * 4 * t))
            out.append(0.12 * tone * envelope)
        out.extend([0.0] * int(0.4 * rate))
    return out
