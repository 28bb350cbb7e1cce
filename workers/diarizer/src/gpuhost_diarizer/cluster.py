"""Clustering speech segments into speakers, with an automatic speaker count that honours
num_speakers / min_speakers / max_speakers.

The distance between two segments is the cosine distance of their d-vectors plus `pitch_weight`
times the distance of their median F0 in octaves. The d-vector encoder tells vocal tracts apart
but confuses two low male voices; F0 separates those and survives a telephone band (it is
recomputed from harmonics), so the sum counts speakers on narrowband audio too.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist, squareform

PITCH_WEIGHT = 2.0
THRESHOLD = 0.42
MIN_CLUSTER_S = 1.5


def distances(
    embeddings: np.ndarray, log2_f0: np.ndarray, pitch_weight: float = PITCH_WEIGHT
) -> np.ndarray:
    d = squareform(pdist(embeddings, "cosine"))
    f0 = np.nan_to_num(
        log2_f0, nan=float(np.nanmedian(log2_f0)) if np.isfinite(log2_f0).any() else 7.0
    )
    return d + pitch_weight * np.abs(f0[:, None] - f0[None, :])


def cluster(
    dist: np.ndarray,
    num: int | None = None,
    min_k: int | None = None,
    max_k: int | None = None,
    threshold: float = THRESHOLD,
) -> np.ndarray:
    """Labels 0..k-1 (in order of first appearance) from a square distance matrix. Average
    linkage; without a fixed count, k is the number of clusters below `threshold`, clamped."""
    n = len(dist)
    if n == 0:
        return np.zeros(0, dtype=int)
    lo, hi = max(1, min_k or 1), min(n, max_k or 10)
    if num:
        lo = hi = min(num, n)
    if n == 1 or hi == 1:
        return np.zeros(n, dtype=int)
    z = linkage(squareform(dist, checks=False), method="average")
    k = (
        lo
        if lo == hi
        else min(max(len(set(fcluster(z, t=threshold, criterion="distance"))), lo), hi)
    )
    return relabel(fcluster(z, t=k, criterion="maxclust") - 1)


def cluster_segments(
    dist: np.ndarray,
    lengths: np.ndarray,
    num: int | None = None,
    min_k: int | None = None,
    max_k: int | None = None,
    threshold: float = THRESHOLD,
    min_len: float = MIN_CLUSTER_S,
) -> np.ndarray:
    """Like `cluster`, but only segments of at least `min_len` seconds decide the speakers (a
    short one's d-vector comes from one padded window and would found a speaker of its own);
    each short segment then joins the speaker whose segments it is closest to on average."""
    long_ = np.where(lengths >= min_len)[0]
    if len(long_) < max(2, num or 0, min_k or 0):
        return cluster(dist, num, min_k, max_k, threshold)
    found = cluster(dist[np.ix_(long_, long_)], num, min_k, max_k, threshold)
    labels = np.zeros(len(dist), dtype=int)
    labels[long_] = found
    for i in np.where(lengths < min_len)[0]:
        labels[i] = min(set(found.tolist()), key=lambda k: dist[i, long_[found == k]].mean())
    return relabel(labels)


def relabel(labels) -> np.ndarray:
    """Speakers numbered in order of first appearance."""
    order: dict = {}
    for label in labels:
        order.setdefault(int(label), len(order))
    return np.array([order[int(label)] for label in labels], dtype=int)
