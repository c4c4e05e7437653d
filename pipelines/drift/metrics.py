"""Drift metrics as plain vectorized functions (numpy), each with known-answer tests.

- `psi`: population stability index over matching bins, sum((c - r) * ln(c / r)) on proportions,
  with a small floor for empty bins (the usual bands: < 0.1 stable, 0.1-0.25 watch, > 0.25 act).
- `js_distance`: Jensen-Shannon distance (square root of the divergence, base 2: 0 identical, 1 disjoint).
- `quantile_edges` + `binned_counts`: numeric signals binned on the reference's deciles, then `psi`.
- `wasserstein`: earth mover's distance between two samples, in the signal's units.
- `mmd_rbf`: maximum mean discrepancy of embeddings with an RBF kernel (median-distance bandwidth).
- `classifier_auc`: a domain classifier's cross-validated ROC AUC (0.5: the samples are alike).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

FLOOR = 1e-4  # proportion given to an empty bin, so a new category counts instead of dividing by zero
Band = Literal["stable", "watch", "act"]


def aligned(reference: Mapping[str, float], current: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Counts of both distributions over the union of their categories, in one order."""
    keys = sorted(set(reference) | set(current))
    return (np.array([float(reference.get(k, 0)) for k in keys]), np.array([float(current.get(k, 0)) for k in keys]))


def _proportions(counts: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    counts = np.asarray(counts, dtype=float)
    if counts.sum() <= 0:
        raise ValueError("a distribution with no observations")
    p = np.maximum(counts / counts.sum(), floor)
    return p / p.sum()


def psi(reference: np.ndarray | Sequence[float], current: np.ndarray | Sequence[float]) -> float:
    r, c = _proportions(np.asarray(reference)), _proportions(np.asarray(current))
    return float(np.sum((c - r) * np.log(c / r)))


def js_distance(reference: np.ndarray | Sequence[float], current: np.ndarray | Sequence[float]) -> float:
    r = np.asarray(reference, dtype=float) / np.sum(reference)
    c = np.asarray(current, dtype=float) / np.sum(current)
    m = (r + c) / 2

    def kl(p: np.ndarray) -> float:
        mask = p > 0
        return float(np.sum(p[mask] * np.log2(p[mask] / m[mask])))

    return float(np.sqrt(max(0.0, (kl(r) + kl(c)) / 2)))


def quantile_edges(values: np.ndarray | Sequence[float], bins: int = 10) -> np.ndarray:
    """Inner bin edges at the reference's quantiles (duplicates dropped: heavy ties make fewer bins)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return np.array([])
    return np.unique(np.quantile(v, np.linspace(0, 1, bins + 1)[1:-1]))


def binned_counts(values: np.ndarray | Sequence[float], edges: np.ndarray) -> np.ndarray:
    """Counts per bin (len(edges) + 1 bins, open at both ends); missing values are dropped."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return np.bincount(np.searchsorted(edges, v, side="right"), minlength=len(edges) + 1).astype(float)


def wasserstein(reference: np.ndarray | Sequence[float], current: np.ndarray | Sequence[float]) -> float:
    from scipy.stats import wasserstein_distance

    r, c = np.asarray(reference, dtype=float), np.asarray(current, dtype=float)
    return float(wasserstein_distance(r[np.isfinite(r)], c[np.isfinite(c)]))


def mmd_rbf(reference: np.ndarray, current: np.ndarray, bandwidth: float | None = None) -> float:
    """Biased MMD^2 estimate with k(x, y) = exp(-|x - y|^2 / (2 s^2)); s defaults to the median distance."""
    x, y = np.asarray(reference, dtype=float), np.asarray(current, dtype=float)
    both = np.vstack([x, y])
    sq = np.sum(both**2, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * both @ both.T, 0.0)
    if bandwidth is None:
        upper = d2[np.triu_indices_from(d2, k=1)]
        bandwidth = float(np.sqrt(np.median(upper) / 2)) if upper.size and np.median(upper) > 0 else 1.0
    k = np.exp(-d2 / (2 * bandwidth**2))
    n = len(x)
    return float(k[:n, :n].mean() + k[n:, n:].mean() - 2 * k[:n, n:].mean())


def classifier_auc(reference: np.ndarray, current: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    """ROC AUC of a logistic regression telling current from reference, cross-validated."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    x = np.vstack([reference, current])
    y = np.r_[np.zeros(len(reference)), np.ones(len(current))]
    folds = max(2, min(folds, int(min(len(reference), len(current)))))
    scores = cross_val_score(LogisticRegression(max_iter=1000, C=1.0), x, y, cv=folds, scoring="roc_auc")
    return float(np.mean(scores))


def band(value: float, watch: float, act: float, *, higher_is_worse: bool = True) -> Band:
    if not higher_is_worse:
        value, watch, act = -value, -watch, -act
    return "act" if value >= act else "watch" if value >= watch else "stable"
