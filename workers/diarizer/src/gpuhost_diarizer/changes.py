"""Speaker changes inside one stretch of speech: people often answer without a pause, so a VAD
region may hold several turns. No protocol code here.

A change at boundary b scores the cosine distance between the mean d-vector of the two encoder
windows that end before b and the two that start after it, plus `pitch_weight` times the
difference of the median F0 (octaves) in the second before and after b. Peaks above
`CHANGE_THRESHOLD` (at least `MIN_TURN_S` apart) are changes. Each is then moved to the pause,
within ±0.5 s, across which F0 differs most: the windows locate a change to ~0.4 s, the pitch
track to a word gap.
"""

from __future__ import annotations

import numpy as np

from .cluster import PITCH_WEIGHT

CHANGE_THRESHOLD = 1.1
MIN_TURN_S = 0.6
SNAP_S = 0.5
FRAME_S = 0.01  # feature frames
WINDOW_FRAMES = 80  # the encoder's window: 0.8 s


class PitchTrack:
    """log2 F0 and loudness every 20 ms over the whole recording (one YIN pass)."""

    HOP = 320

    def __init__(self, audio: np.ndarray, rate: int):
        import librosa

        self.step = self.HOP / rate
        if len(audio) < 1024:
            self.lf0 = self.rms = np.zeros(0)
            return
        f0 = librosa.yin(audio, fmin=60, fmax=400, sr=rate, frame_length=1024, hop_length=self.HOP)
        rms = librosa.feature.rms(y=audio, frame_length=1024, hop_length=self.HOP)[0]
        n = min(len(f0), len(rms))
        self.lf0, self.rms = np.log2(f0[:n]), rms[:n]

    def median(self, start: float, end: float) -> float:
        """Median log2 F0 of the louder half of the frames in [start, end) s (NaN when none)."""
        a, b = max(0, int(start / self.step)), max(0, int(end / self.step))
        lf0, rms = self.lf0[a:b], self.rms[a:b]
        if lf0.size < 4:
            return float("nan")
        voiced = lf0[rms > np.median(rms)]
        return float(np.median(voiced)) if voiced.size else float("nan")

    def jump(self, at: float, span: float) -> float:
        """|F0 before − F0 after| around `at`, 0 when either side has none."""
        d = abs(self.median(at - span, at) - self.median(at, at + span))
        return 0.0 if np.isnan(d) else d


def change_points(
    starts: list,
    emb: np.ndarray,
    pitch: PitchTrack,
    energy: np.ndarray,
    region: tuple,
    threshold: float = CHANGE_THRESHOLD,
) -> list:
    """Speaker changes (seconds) inside `region`, given its encoder windows: `starts` (feature
    frame of each window) and their L2-normalised d-vectors `emb`; `energy` per feature frame."""
    if len(starts) < 3:
        return []
    begins = np.array(starts)
    ends = begins + WINDOW_FRAMES
    scored = []
    for b in starts[1:]:
        left, right = np.where(ends <= b)[0][-2:], np.where(begins >= b)[0][:2]
        if not len(left) or not len(right):
            continue
        lv, rv = emb[left].mean(axis=0), emb[right].mean(axis=0)
        cos = 1.0 - float(lv @ rv / (np.linalg.norm(lv) * np.linalg.norm(rv) + 1e-12))
        scored.append((cos + PITCH_WEIGHT * pitch.jump(b * FRAME_S, 1.0), b))
    chosen: list = []
    for score, b in sorted(scored, reverse=True):
        if score < threshold:
            break
        if all(abs(b - c) * FRAME_S >= MIN_TURN_S for c in chosen):
            chosen.append(b)
    return sorted(snap(b, pitch, energy, region) for b in chosen)


def snap(b: int, pitch: PitchTrack, energy: np.ndarray, region: tuple) -> float:
    """Moves a change at feature frame `b` to the pause nearby across which F0 differs most."""
    first, last = int(region[0] / FRAME_S), int(region[1] / FRAME_S)
    lo, hi = max(first + 10, b - int(SNAP_S / FRAME_S)), min(last - 10, b + int(SNAP_S / FRAME_S))
    if hi - lo < 3:
        return b * FRAME_S
    e = energy[lo:hi]
    quiet = np.percentile(energy[first:last], 20)
    pauses = [
        lo + i for i in range(1, len(e) - 1) if e[i] <= min(e[i - 1], e[i + 1]) and e[i] <= quiet
    ]
    if not pauses:
        return (lo + int(np.argmin(e))) * FRAME_S
    return max(pauses, key=lambda g: pitch.jump(g * FRAME_S, 0.6)) * FRAME_S
