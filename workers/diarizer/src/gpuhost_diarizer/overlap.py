"""The overlap-aware engine: pyannote's pipeline on ONNX Runtime, no torch. No protocol code here.

1. Local segmentation: 10 s windows every `step` seconds through pyannote community-1's
   segmentation model (589 frames × up to 3 local speakers per window, overlap included).
2. One WeSpeaker ResNet34 embedding per local speaker per window: Kaldi fbank of the window,
   pooled over the frames where that speaker talks alone (all of its frames when it never does),
   at most 3 s of them; a stretch an earlier window already embedded is not embedded again.
3. Clustering across windows (overlap_clusters.py: agglomerative, average linkage on unit
   vectors; speaker count automatic unless given; unless `num_speakers`/`max_speakers` say
   otherwise, never fewer than the local speakers with ≥ 2 s of speech each side by side in a
   window, in two windows), then every local speaker to a cluster, two speakers of one window
   never to the same one.
4. Reconstruction: per frame, the windows' speaker count says how many speakers talk; the
   clusters most active there are them; a speaker's pauses up to 0.5 s stay inside the turn
   unless someone else talks in them.
   Frames with two or more speakers are overlapped speech.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .overlap_clusters import cluster

RATE = 16000
CHUNK = 10 * RATE  # samples the segmentation model takes
FRAMES = 589  # its output frames per window
FRAME_HOP = 270  # samples between output frames
FRAME_LEN = 991  # samples each output frame sees
FBANK_HOP = 160  # samples between fbank frames (25 ms every 10 ms)
WINDOW_FBANK = 1 + (CHUNK - 400) // FBANK_HOP  # fbank frames of one window
STEP_S = 2.5  # window hop
THRESHOLD = 1.1  # average distance between unit embeddings below which clusters merge
MIN_EMBED_S = 0.25  # below this a local speaker gets no embedding and is dropped
EMBED_MAX_S = 3.0  # an embedding looks at most at this long a stretch of its window
FILL_S = 0.5  # a speaker's pauses up to this long are part of the turn
MIN_TURN_S = 0.1  # a speaker's stretch shorter than this (after the fill) is no turn
REUSE_DIFFER = 0.05  # reused for the same stretch when frames differing ≤ 5 % of its speech


@dataclass
class Local:
    """What steps 1 and 2 found: everything the clustering needs, reusable across settings."""

    starts: list  # window start frames on the global frame grid
    seg: np.ndarray  # (windows, FRAMES, 3) 0/1 activity
    owners: list  # (window, local speaker) of every embedding
    embeddings: np.ndarray  # (n, 256) unit vectors
    seconds: np.ndarray  # speech behind each embedding
    frames: int  # global frames
    duration: float | None = None  # seconds of the recording: no turn ends past it


class OverlapDiarizer:
    name = "pyannote community-1 segmentation + WeSpeaker ResNet34 (ONNX), overlap-aware"

    def __init__(
        self,
        step_s: float = STEP_S,
        threshold: float = THRESHOLD,
        threads: int = 2,
        providers: list | None = None,
    ):
        from .models import model_bytes
        from .resnet import SpeakerEmbedder, session

        self.embedder = SpeakerEmbedder(threads, providers)
        self.segmenter = session(model_bytes("segmentation"), threads, providers)
        self.device = self.embedder.device
        self.hop = max(1, round(step_s * RATE / FRAME_HOP)) * FRAME_HOP
        self.threshold = threshold

    def diarize(
        self, audio, num_speakers=None, min_speakers=None, max_speakers=None, progress=None
    ):
        local = self.local(audio, progress)
        if progress:
            progress(0.9, f"{len(local.embeddings)} local speakers in {len(local.starts)} windows")
        return assemble(local, self.threshold, num_speakers, min_speakers, max_speakers, self.name)

    def local(self, audio: np.ndarray, progress=None) -> Local:
        audio = np.asarray(audio, dtype=np.float32)
        n = len(audio)
        starts = list(range(0, max(1, n - CHUNK + 1), self.hop))
        last = n - CHUNK  # the last window ends with the audio
        if n > CHUNK and last > starts[-1]:
            starts.append(last)

        def window(s: int) -> np.ndarray:
            """The 10 s from sample `s`, zero-padded (made when needed: an hour of audio
            would be a gigabyte of overlapping windows)."""
            out = np.zeros(CHUNK, dtype=np.float32)
            piece = audio[s : s + CHUNK]
            out[: len(piece)] = piece
            return out

        batches = []
        for i in range(0, len(starts), 8):
            batch = np.stack([window(s) for s in starts[i : i + 8]])[:, None]
            batches.append(self.segmenter.run(None, {"waveforms": batch})[0])
            if progress:
                done = min(i + 8, len(starts))
                progress(
                    0.05 + 0.4 * done / len(starts), f"segmenting: window {done}/{len(starts)}"
                )
        seg = np.concatenate(batches)
        seg = (seg > 0.5).astype(np.float32)
        # One fbank for the whole recording, each window's mean taken out: a window's rows are
        # what its own fbank would be, shifted by at most 5 ms (its start on the 10 ms grid).
        whole = self.embedder.fbank(audio, normalize=False) if n >= CHUNK else None
        done: dict = {}  # global fbank span → (weights, embedding) already computed
        owners, embeddings, seconds = [], [], []
        for w in range(len(starts)):
            fbank = None
            first = round(starts[w] / FBANK_HOP)  # the window's first row in `whole`
            alone = seg[w].sum(axis=1) == 1
            for s in range(seg.shape[2]):
                mask = seg[w, :, s] > 0
                if mask.sum() * FRAME_HOP / RATE < MIN_EMBED_S:
                    continue
                # Pooled where this speaker talks alone, when it does long enough.
                clean = mask & alone
                if clean.sum() * FRAME_HOP / RATE >= MIN_EMBED_S:
                    mask = clean
                if fbank is None:
                    fbank = self._window_fbank(whole, first, window(starts[w]))
                    for span in [k for k in done if k[0] < first]:
                        del done[span]  # behind this window: no later one can reuse it
                embeddings.append(self.embed(fbank, mask, first, done))
                owners.append((w, s))
                seconds.append(mask.sum() * FRAME_HOP / RATE)
            if progress and w % 4 == 3:
                progress(
                    0.45 + 0.45 * (w + 1) / len(starts), f"speakers: window {w + 1}/{len(starts)}"
                )
        frames = int(np.ceil(n / FRAME_HOP)) + 1
        return Local(
            starts=[round(s / FRAME_HOP) for s in starts],
            seg=seg,
            owners=owners,
            embeddings=np.array(embeddings, dtype=np.float32).reshape(-1, 256),
            seconds=np.array(seconds),
            frames=frames,
            duration=n / RATE,
        )

    def _window_fbank(self, whole, first: int, window: np.ndarray) -> np.ndarray:
        if whole is None:  # shorter than one window: its own, zero-padded
            return self.embedder.fbank(window)
        rows = whole[first : first + WINDOW_FBANK]
        return rows - rows.mean(axis=0)

    def embed(self, fbank: np.ndarray, mask: np.ndarray, offset: int = 0, done=None):
        """The embedding pooled over `mask` (segmentation frames), computed only over the span of
        fbank frames the mask touches. `done` ({span: (weights, embedding)}, spans on the
        recording's fbank grid, `offset` = this window's first row there) lets a window reuse
        the embedding of an earlier window's stretch that is as good as its own best and pooled
        (nearly) the same frames: windows overlap by three quarters, and a speaker talking on
        is seen in several of them."""
        weights = mask[_segmentation_frame(len(fbank))].astype(np.float32)
        on = np.flatnonzero(weights)
        a, b = on[0], on[-1] + 1
        limit = int(EMBED_MAX_S * 100)
        counts = None
        if b - a > limit:
            # The stretch of at most EMBED_MAX_S with the most of this speaker's frames.
            counts = np.convolve(weights, np.ones(limit, dtype=np.float32), mode="valid")
            a = int(counts.argmax())
            b = a + limit
        if done is None:
            return self.embedder.embed(fbank[a:b], weights[a:b])
        # An earlier window's stretch that is as good as this one's best and pooled nearly
        # the same frames gives its embedding again.
        for (ga, gb), (other, embedding) in done.items():
            x, y = ga - offset, gb - offset
            if x < 0 or y > len(weights):
                continue
            if counts is None or y - x != limit:
                good = (x, y) == (a, b)
            else:
                good = counts[x] >= counts[a] - REUSE_DIFFER * limit
            mine = weights[x:y]
            if good and np.sum(other != mine) <= REUSE_DIFFER * max(other.sum(), mine.sum()):
                return embedding
        embedding = self.embedder.embed(fbank[a:b], weights[a:b])
        done[(offset + a, offset + b)] = (weights[a:b], embedding)
        return embedding


@functools.lru_cache(maxsize=4)
def _segmentation_frame(fbank_frames: int) -> np.ndarray:
    """For each fbank frame (25 ms every 10 ms), the segmentation frame at its centre."""
    centers = (np.arange(fbank_frames) * 160 + 200 - FRAME_LEN / 2) / FRAME_HOP
    return np.clip(np.round(centers).astype(int), 0, FRAMES - 1)


def assemble(local: Local, threshold, num_speakers, min_speakers, max_speakers, engine) -> dict:
    labels, centroids = cluster(local, threshold, num_speakers, min_speakers, max_speakers)
    k = len(centroids)
    activity = np.zeros((k, local.frames), dtype=np.float32)
    count = np.zeros(local.frames, dtype=np.float32)
    cover = np.zeros(local.frames, dtype=np.float32)
    # Per window, a cluster is as active as the most active of its local speakers there (two
    # when a window had more local speakers than clusters: see overlap_clusters._assign).
    per_window: dict = {}
    for (w, s), label in zip(local.owners, labels):
        if label >= 0:
            per_window.setdefault((w, label), []).append(s)
    for (w, label), speakers in per_window.items():
        a = local.starts[w]
        b = min(local.frames, a + FRAMES)
        activity[label, a:b] += local.seg[w, : b - a][:, speakers].max(axis=1)
    for w, a in enumerate(local.starts):
        b = min(local.frames, a + FRAMES)
        count[a:b] += local.seg[w, : b - a].sum(axis=1)
        cover[a:b] += 1
    cover = np.maximum(cover, 1)
    activity /= cover
    speakers_now = np.minimum(np.round(count / cover).astype(int), k)
    order = np.argsort(-activity, axis=0)
    on = np.zeros_like(activity, dtype=bool)
    for f in np.flatnonzero(speakers_now):
        top = order[: speakers_now[f], f]
        on[top[activity[top, f] > 0], f] = True
    if FILL_S > 0:
        others = on.sum(axis=0)
        for row in on:
            _fill(row, round(FILL_S * RATE / FRAME_HOP), others - row)
    if MIN_TURN_S > 0:
        for row in on:
            _drop_short(row, round(MIN_TURN_S * RATE / FRAME_HOP))
    return _turns(on, engine, local.duration)


def _drop_short(row: np.ndarray, frames: int) -> None:
    """Active stretches of `row` shorter than `frames` become inactive: a speaker heard for a
    frame or two (17 ms turns, often where more speakers were asked for than talk) is noise in
    the transcript and the RTTM."""
    for a, b in _runs(row):
        if b - a < frames:
            row[a:b] = False


def _runs(mask: np.ndarray) -> list:
    """The (start, end) frames, end exclusive, of each stretch where `mask` is true."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def _fill(row: np.ndarray, frames: int, others: np.ndarray) -> None:
    """Gaps of at most `frames` between two active stretches of `row` become active, unless
    someone else talks in them (a reply in a pause is a turn, not an overlap)."""
    edges = np.flatnonzero(np.diff(row.astype(int)))
    # Gaps start after an edge up→down and end at the next edge down→up.
    for a, b in zip(edges[:-1], edges[1:]):
        if row[a] and not row[a + 1] and b - a <= frames and not others[a + 1 : b + 1].any():
            row[a + 1 : b + 1] = True


def _turns(on: np.ndarray, engine: str, duration: float | None = None) -> dict:
    half = FRAME_LEN / 2 / RATE
    hop = FRAME_HOP / RATE
    # A frame's centre past the last sample (the grid is rounded up) is the recording's end.
    last = float("inf") if duration is None else round(duration, 3)

    def time(f):
        return min(round(float(f * hop + half), 3), last)

    raw = []
    for k in range(on.shape[0]):
        raw += [(time(a), time(b), k) for a, b in _runs(on[k])]
    raw = sorted(r for r in raw if r[1] > r[0])
    names: dict = {}
    for _, _, k in raw:
        names.setdefault(k, f"SPEAKER_{len(names):02d}")
    turns = [{"start": a, "end": b, "speaker": names[k]} for a, b, k in raw]
    many = on.sum(axis=0) >= 2
    overlaps = [[time(a), time(b)] for a, b in _runs(many) if time(b) > time(a)]
    return {
        "engine": engine,
        "turns": turns,
        "speakers": sorted(names.values()),
        "overlaps": overlaps,
    }
