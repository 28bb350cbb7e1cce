"""Step 3 of the overlap-aware engine (overlap.py): the local speakers of every window clustered
into the recording's speakers. No protocol code here.

Agglomerative clustering, average linkage on unit embeddings, trained on the local speakers with
enough speech (short ones embed poorly) and then every local speaker assigned to a cluster, two
speakers of one window never to the same one while there are clusters enough (the ones with
most speech first; see `_assign`). The speaker count is automatic unless given;
unless `num_speakers`/`max_speakers` say otherwise it is never below the local speakers with
`FLOOR_S` of speech each side by side in a window, in `FLOOR_WINDOWS` windows. `local` is an
`overlap.Local`.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment

MIN_TRAIN_S = 2.0  # a local speaker joins the clustering only with this much speech
MIN_CLUSTER_S = 3.0  # a cluster with less speech joins its nearest larger one
# Local speakers of one window with this much clean speech each are different people: at least
# that many clusters unless a count is given (None: no such floor).
FLOOR_S = 2.0
FLOOR_WINDOWS = 2  # ... in at least this many windows
# A window with more local speakers than clusters: the ones past the clusters' count (those with
# the least speech) join their nearest cluster (False: they are dropped, as pyannote does).
MERGE_REST = True


def cluster(local, threshold, num_speakers=None, min_speakers=None, max_speakers=None):
    """Cluster label (0..k-1) of every embedding, and the cluster centroids."""
    x, sec = local.embeddings, local.seconds
    if len(x) == 0:
        return np.zeros(0, dtype=int), np.zeros((0, 256))
    train = np.flatnonzero(sec >= MIN_TRAIN_S)
    if len(train) < 2:
        train = np.arange(len(x))
    if len(train) == 1:
        labels = np.zeros(1, dtype=int)
    else:
        z = linkage(x[train], method="average", metric="euclidean")
        if num_speakers:
            labels = fcluster(z, t=num_speakers, criterion="maxclust") - 1
        else:
            labels = fcluster(z, t=threshold, criterion="distance") - 1
            # Clusters with little speech join their nearest larger one.
            labels = _absorb_small(x[train], sec[train], labels)
            k = len(set(labels))
            lo = max(min_speakers or 1, _at_once(local, FLOOR_S))
            hi = max_speakers or max(k, lo)
            lo = min(lo, hi)
            if k < lo or k > hi:
                labels = fcluster(z, t=min(max(k, lo), hi), criterion="maxclust") - 1
    labels = np.unique(labels, return_inverse=True)[1]
    centroids = np.array([x[train][labels == c].mean(axis=0) for c in range(labels.max() + 1)])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-12
    return _assign(local, centroids), centroids


def _at_once(local, seconds) -> int:
    """The most local speakers that each have `seconds` of speech side by side in one window
    (in FLOOR_WINDOWS windows): the segmentation's own lower bound on the speaker count (1 when
    `seconds` is None)."""
    if seconds is None:
        return 1
    count: dict = {}
    for (w, _), sec in zip(local.owners, local.seconds):
        if sec >= seconds:
            count[w] = count.get(w, 0) + 1
    most = sorted(count.values(), reverse=True)
    return max(1, most[FLOOR_WINDOWS - 1]) if len(most) >= FLOOR_WINDOWS else 1


def _absorb_small(x, sec, labels):
    speech = {c: sec[labels == c].sum() for c in set(labels)}
    big = [c for c in speech if speech[c] >= MIN_CLUSTER_S]
    if not big:
        return labels
    cent = {c: x[labels == c].mean(axis=0) for c in speech}
    out = labels.copy()
    for c in speech:
        if c not in big:
            nearest = min(big, key=lambda b: np.linalg.norm(cent[c] - cent[b]))
            out[labels == c] = nearest
    return out


def _assign(local, centroids: np.ndarray) -> np.ndarray:
    """Each embedding to a centroid; two local speakers of one window never share one, unless
    the window has more local speakers than there are clusters: then the ones with the most
    speech get distinct clusters and the rest join their nearest (one voice the segmentation
    split in two; dropping the rest lost a short clip's main speaker to a brief edge one)."""
    labels = np.full(len(local.owners), -1, dtype=int)
    by_window: dict = {}
    for i, (w, _) in enumerate(local.owners):
        by_window.setdefault(w, []).append(i)
    for rows in by_window.values():
        rows = sorted(rows, key=lambda i: -local.seconds[i])
        first, rest = rows[: len(centroids)], rows[len(centroids) :]
        score = local.embeddings[first] @ centroids.T
        r, c = linear_sum_assignment(-score)
        for i, k in zip(r, c):
            labels[first[i]] = k
        for i in rest if MERGE_REST else []:
            labels[i] = int(np.argmax(local.embeddings[i] @ centroids.T))
    return labels
